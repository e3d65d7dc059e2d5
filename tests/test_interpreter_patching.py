"""tests/interpreter_patching.py: a launch patches the language once, helpers inside it
skip what would find nothing new, and the kernels compute what they computed."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from conftest import HAS_CUDA
from triton.runtime import interpreter

pytestmark = pytest.mark.skipif(HAS_CUDA, reason="Triton's interpreter runs without a GPU")


@triton.jit
def _scaled(x, SCALE: tl.constexpr):
    return x * SCALE


@triton.jit
def _tile_sum(x_ptr, offs, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)  # a helper of the language's own
    for step in range(4):
        acc += _scaled(tl.load(x_ptr + offs * 4 + step), 2.0)
    return acc


@triton.jit
def _sum_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, _tile_sum(x_ptr, offs, BLOCK))


def test_a_launch_patches_once_and_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[object] = []
    walk = interpreter._patch_builtin
    monkeypatch.setattr(
        interpreter, "_patch_builtin", lambda pkg, *a: (walks.append(pkg), walk(pkg, *a))[1]
    )
    x = torch.arange(64, dtype=torch.float32)
    counts = []
    for programs in (2, 2, 8):  # the first launch of a process is counted apart
        walks.clear()
        y = torch.empty(16)
        _sum_kernel[(programs,)](x, y, BLOCK=16 // programs)
        assert torch.equal(y, 2 * x.view(16, 4).sum(-1))
        counts.append(len(walks))
    # The launch walks triton.language (the module, its tensor and math) and the
    # tensor descriptor; tl.zeros, the first helper to see triton.language.core too,
    # walks both modules again (the first launch of a process 7 walks, later ones 10,
    # whatever the programs). Without install(), every helper call of every program
    # walked them: 56 walks for 2 programs, 212 for 8.
    assert counts[1] == counts[2] and 0 < max(counts) <= 12, counts
    # Restored after the launch: tl.load is the language's builtin again.
    assert tl.core.is_builtin(tl.load)


def test_install_is_idempotent() -> None:
    import interpreter_patching

    patched = interpreter._patch_lang
    interpreter_patching.install()
    assert interpreter._patch_lang is patched and patched.patches_once
