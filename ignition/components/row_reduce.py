"""Sums over each row's last dimension in an order that does not follow the batch.

A reduction such as an RMSNorm's ``x.pow(2).mean(-1)`` takes its strategy in
PyTorch's CUDA kernels (and in Inductor's autotuned ones) from the problem's shape,
the number of rows included: at the hybrid's H200 widths (2,560 per hyperconnection
stream) one request's mean squares came out a few ulp apart in capacity-1 and
capacity-4 decode steps, and over 48 layers and dozens of steps that flipped sampled
tokens (``bench/row_divergence_probe.py``, ``bench/results/issue22/``).
``flare::row_sum`` gives each row one program that walks it in fixed ``BLOCK``
pieces and adds the fp32 partials in one fixed tree: a row's bits depend on the row
alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.triton_support import fix_interpreter_loop_bounds

BLOCK = 1024


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, N, stride, SQUARE: tl.constexpr, BLOCK: tl.constexpr):
    """``out[row] = sum(x[row])`` in fp32 (of the fp32 squares with ``SQUARE``), ``N``
    elements a row."""
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + offs, mask=offs < N, other=0.0).to(tl.float32)
        acc += x * x if SQUARE else x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


if isinstance(_row_sum_kernel, InterpretedFunction):
    fix_interpreter_loop_bounds()


def triton_row_sum(x: torch.Tensor, square: bool = False) -> torch.Tensor:
    """``x [rows, n]``'s row sums ``[rows]`` in fp32, of the fp32 squares with
    ``square`` (module docs)."""
    rows, n = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _row_sum_kernel[(rows,)](
            x, out, n, x.stride(0), SQUARE=square, BLOCK=BLOCK, num_warps=4
        )  # fmt: skip
    return out


@torch.library.custom_op("flare::row_sum", mutates_args=())
def row_sum(x: torch.Tensor, square: bool = False) -> torch.Tensor:
    """Each row's fp32 sum (of its fp32 squares with ``square``: one kernel, the squares
    never stored), batch-invariant. On the CPU the torch reduction, whose order does
    not follow the rows there: Triton's interpreter runs one Python program per row,
    minutes for a model test's prefill chunks (``triton_row_sum`` is tested
    interpreted on its own)."""
    terms = x.float().pow(2) if square else x
    return terms.sum(-1, dtype=torch.float32)


@row_sum.register_kernel("cuda")
def _row_sum_cuda(x: torch.Tensor, square: bool = False) -> torch.Tensor:
    return triton_row_sum(x, square)


@row_sum.register_fake
def _row_sum_fake(x: torch.Tensor, square: bool = False) -> torch.Tensor:
    return x.new_empty(x.shape[0], dtype=torch.float32)


def last_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(-1, keepdim=True)`` (accumulated in fp32, rounded once to x's dtype),
    each row's bits independent of the others (``flare::row_sum``)."""
    n = x.shape[-1]
    return row_sum(x.reshape(-1, n)).view(*x.shape[:-1], 1).to(x.dtype)


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """``x.float().pow(2).mean(-1, keepdim=True)``, each row's bits independent of
    the others (``flare::row_sum`` of the squares)."""
    n = x.shape[-1]
    return row_sum(x.reshape(-1, n), square=True).view(*x.shape[:-1], 1) / n
