"""Dense projections, with a batch-invariant path for decode-sized row counts.

cuBLAS picks its kernel (and so its reduction order) from the problem shape, so the
same request decoded at capacity 1 and at capacity 4 can round differently, and a
sampled token can then depend on which requests shared its batch. Projections of at
most ``ROWS_TILE`` rows therefore use one Triton kernel whose tiling is fixed: every
row is computed by the same tile shape and K loop whatever the row count, so a row's
result is bitwise independent of its batch. Larger (prefill) projections use cuBLAS.
The choice is by static shape, so each captured graph holds one operator per GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.triton_support import fix_interpreter_loop_bounds

ROWS_TILE = 16
BLOCK_N = 64
BLOCK_K = 128


@triton.jit
def _rows_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + kk[None, :],
            mask=(rn[:, None] < N) & (kk[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


if isinstance(_rows_linear_kernel, InterpretedFunction):
    fix_interpreter_loop_bounds()


def triton_rows_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T + b`` for x [rows <= ROWS_TILE, K]; batch-invariant per row."""
    rows, k = x.shape
    n = w.shape[0]
    if rows > ROWS_TILE:
        raise ValueError(f"{rows} rows exceed the batch-invariant tile of {ROWS_TILE}")
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    _rows_linear_kernel[(triton.cdiv(n, BLOCK_N),)](
        x,
        w,
        b if b is not None else w,
        y,
        rows,
        n,
        k,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        HAS_BIAS=b is not None,
        BLOCK_M=ROWS_TILE,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        num_warps=4,
        num_stages=4,
    )
    return y


@torch.library.custom_op("flare::rows_linear", mutates_args=())
def rows_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Batch-invariant projection of a few rows (torch reference on the CPU)."""
    if isinstance(_rows_linear_kernel, InterpretedFunction):
        return triton_rows_linear(x, w, b)
    return F.linear(x, w, b)


@rows_linear.register_kernel("cuda")
def _rows_linear_cuda(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return triton_rows_linear(x, w, b)


@rows_linear.register_fake
def _rows_linear_fake(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """A projection over the last dimension, batch-invariant when it has few rows."""
    rows = x.numel() // x.shape[-1]
    if rows > ROWS_TILE:
        return F.linear(x, weight, bias)
    flat = rows_linear(x.reshape(rows, x.shape[-1]), weight, bias)
    return flat.view(*x.shape[:-1], weight.shape[0])
