"""Triton's interpreter, made to patch ``triton.language`` once a launch.

A kernel launched under ``TRITON_INTERPRET=1`` patches the language's builtins to
interpreted ones (``_patch_lang``) before its programs run, and restores them after.
Every call of a ``@triton.jit`` helper inside those programs patches them again,
though they are patched already: the builtins found are the launch's wrappers (no
builtins left to wrap), and the rest is set to what it already is. Walking the
module for them took about 40% of a tiny model's decode step on the CPU (cProfile of
the hybrid recipe's decode: 2,450 patches in two steps of 37 launches each), once per
helper call per program per K step.

``install`` patches a helper as before the first time in a launch that it sees a
language module (``triton.language.core`` for the language's own helpers, such as
``tl.zeros``, where a kernel sees only ``triton.language``), and skips the helper
patches after it that would find nothing new. The launch's own patch and its restore
are untouched, so the kernels compute what they computed.
"""

from __future__ import annotations

import functools
from typing import Any

import triton.language as tl
from triton.runtime import interpreter


def _langs(fn: Any) -> frozenset[int]:
    """The language modules visible to ``fn``, the ones ``_patch_lang`` patches."""
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


class _Launches:
    """The language modules patched in the running launch, by it and its helpers
    (None outside a launch), and whether the next patch is the launch's own."""

    def __init__(self) -> None:
        self.patched: frozenset[int] | None = None
        self.launching = False


def install() -> None:
    """Wraps the interpreter's patch and launch (idempotent)."""
    if getattr(interpreter._patch_lang, "patches_once", False):
        return
    patch = interpreter._patch_lang
    launch = interpreter.GridExecutor.__call__
    state = _Launches()

    @functools.wraps(patch)
    def patch_lang(fn: Any) -> Any:
        if state.launching:  # the launch's own patch, restored when it ends
            state.launching = False
            scope = patch(fn)
            state.patched = _langs(fn)
            return scope
        if state.patched is not None:  # a helper inside a launch
            langs = _langs(fn)
            if langs <= state.patched:
                return interpreter._LangPatchScope()  # nothing set, nothing to restore
            state.patched |= langs
        return patch(fn)

    @functools.wraps(launch)
    def launch_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = state.patched, state.launching
        state.patched, state.launching = None, True
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.patched, state.launching = saved

    patch_lang.patches_once = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch_once
