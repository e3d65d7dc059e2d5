"""Support for running the project's Triton kernels under Triton's interpreter (CPU tests)."""

from __future__ import annotations

import numpy as np


def fix_interpreter_loop_bounds() -> None:
    """Lets data-dependent ``range(lo, hi)`` run under Triton's interpreter.

    Triton 3.6's interpreter holds scalars as shape-(1,) arrays and converts loop bounds
    with ``int(array)``, which NumPy >= 2.4 rejects (triton-lang/triton#9171, fixed
    upstream by squeezing). Rewriting the kernels as ``while`` loops would avoid it but
    costs software pipelining on the GPU, so the interpreter is patched instead: only
    when interpreting, only while the bug is present. Process-wide, harmless to others.
    """
    try:
        int(np.array([1]))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_squeezes_index", False):
        return

    def patched(tensor: type, scope: object) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    patched._squeezes_index = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
