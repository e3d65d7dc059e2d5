"""Dense projections, with a batch-invariant path for decode-sized row counts.

cuBLAS picks its kernel (and so its reduction order) from the problem shape, so the
same request decoded at capacity 1 and at capacity 4 can round differently, and a
sampled token can then depend on which requests shared its batch. Projections of at
most ``ROWS_TILE`` rows therefore use one Triton kernel whose tiling is fixed: every
row is computed by the same tile shape and K loop whatever the row count, so a row's
result is bitwise independent of its batch. Larger (prefill) projections use cuBLAS.
The choice is by static shape, so each captured graph holds one operator per GEMM.

The tile (``BLOCK_N`` output columns by ``BLOCK_K`` of the K loop) follows the
weight's shape and the device, never the row count. Decode reads each weight once,
so the kernel is a weight stream, and its speed is the weight bytes in flight: the
width is the wider of 64 and 32 columns that still gives every SM a program, and
when that leaves at most one program per SM (a 4096-column projection: 128 programs
of 32 columns on the H200's 132 SMs) each K step loads 512 columns, with at most two
256, else 128, and no more than a third of K, so the loop's pipeline fills
(``tile_shape``; from ``bench/rows_linear_bench.py`` on the H200: the Qwen3-8B down
projection read its 101 MB in 38 us at 16x128 and in 27 us at 32x512, 3.7 TB/s,
where a device copy moved 4.0).
A row's result is bitwise independent of its batch at every tile; the width changes
which program computes a column, not its arithmetic. A K split (fp32 partials summed
in order by a second kernel) was measured against these tiles and never won (the
bench of ``bench/results/issue5/2026-11-30e-two-gpus/``), so it is gone. The gated
variant (``triton_rows_gated``) streams a packed gate/up weight on the same tiles and
applies SiLU and the product in its epilogue: the decode MLP's first half in one kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.triton_support import fix_interpreter_loop_bounds

ROWS_TILE = 16
# Output tile widths the kernel runs at (every one gives the same bits); ``tile_shape``
# picks from the first two.
BLOCK_NS = (64, 32, 16)
TILE_WIDTHS = BLOCK_NS[:2]
# K steps by programs per SM: at most one, at most two, more.
BLOCK_KS = (512, 256, 128)
# The K loop's pipeline: STAGES loads in flight of x's and w's tiles, within the
# shared memory an H200 program may take (227 KiB; 64x512 bf16 tiles would need 320).
STAGES = 4
PIPELINE_BYTES = 192 << 10
# The interpreter's stand-in for a device's SM count: one, so it runs the widest tile
# (the fewest programs, each a Python loop there); every width gives the same bits.
INTERPRETER_SMS = 1


@triton.jit
def _rows_dot(
    x_ptr,
    w_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    rn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """fp32 ``x @ w[rn].T`` for the tile's ``BLOCK_M`` rows."""
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x_mask = (rm[:, None] < M) & (kk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=x_mask, other=0.0)
        w = tl.load(
            w_ptr + rn[:, None] * stride_wn + kk[None, :],
            mask=(rn[:, None] < N) & (kk[None, :] < K),
            other=0.0,
        )
        acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _store_rows(acc, b_ptr, y_ptr, M, N, stride_ym, rm, rn, HAS_BIAS: tl.constexpr):
    """The output tile: fp32 ``acc`` plus the bias, rounded once to y's dtype."""
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


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
    acc = _rows_dot(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, rn, BLOCK_M, BLOCK_N, BLOCK_K)
    _store_rows(acc, b_ptr, y_ptr, M, N, stride_ym, rm, rn, HAS_BIAS)


@triton.jit
def _rows_gated_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``silu(gate) * up`` of columns ``rn`` for the packed weight ``w [2N, K]``
    (gate rows, then up rows): both tiles stream in one K loop, each projection is
    rounded to y's dtype, then the activation, then the product (eager rounding)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(
            x_ptr + rm[:, None] * stride_xm + kk[None, :],
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        w_mask = (rn[:, None] < N) & (kk[None, :] < K)
        w_gate = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=w_mask, other=0.0)
        w_up = tl.load(w_ptr + (N + rn[:, None]) * stride_wn + kk[None, :], mask=w_mask, other=0.0)
        gate = tl.dot(x, tl.trans(w_gate), gate)
        up = tl.dot(x, tl.trans(w_up), up)
    dtype = y_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        (act * up.to(dtype).to(tl.float32)).to(dtype),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


if isinstance(_rows_linear_kernel, InterpretedFunction):
    fix_interpreter_loop_bounds()


def tile_shape(n: int, k: int, sms: int, itemsize: int = 2) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) of an ``n`` x ``k`` weight of ``itemsize``-byte elements on
    ``sms`` SMs: the widest of ``TILE_WIDTHS`` with at least one program per SM (else
    the narrowest), and K steps of ``BLOCK_KS`` by how many programs each SM gets (at
    most one, two, more), short enough for the K loop to fill its pipeline and within
    the pipeline's shared memory (``fitted_block_k``)."""
    width = next((w for w in TILE_WIDTHS if triton.cdiv(n, w) >= sms), TILE_WIDTHS[-1])
    programs = triton.cdiv(n, width)
    block_k = (
        BLOCK_KS[0] if programs <= sms else BLOCK_KS[1] if programs <= 2 * sms else BLOCK_KS[2]
    )
    return width, fitted_block_k(block_k, k, width, itemsize)


def fitted_block_k(block_k: int, k: int, width: int, itemsize: int) -> int:
    """``block_k`` as one step over ``k`` rounded up to a power of two where that is no
    wider, else halved until the K loop has ``STAGES - 1`` full steps, so that its
    pipeline fills (SmolLM2's 576 columns in 512-column steps load one full step and
    one seven-eighths masked: its qkv, o and gate/up projections took 3.8, 3.7 and
    4.5 us so, and 3.5, 3.4 and 4.0 in 128-column steps, on the H200); then halved
    until the pipeline of ``width``-column tiles fits its shared memory; at least 16."""
    single = max(16, triton.next_power_of_2(k))
    if single <= block_k:
        block_k = single
    else:
        while block_k > 16 and (STAGES - 1) * block_k > k:
            block_k //= 2
    while block_k > 16 and STAGES * (ROWS_TILE + width) * block_k * itemsize > PIPELINE_BYTES:
        block_k //= 2
    return block_k


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_rows_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    width: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """``x @ w.T + b`` for x [rows <= ROWS_TILE, K]; batch-invariant per row.
    ``width`` and ``block_k``: the tile (default ``tile_shape`` of the weight and
    device); ``bench/rows_linear_bench.py`` times others against it."""
    rows = x.shape[0]
    n, k = w.shape
    if rows > ROWS_TILE:
        raise ValueError(f"{rows} rows exceed the batch-invariant tile of {ROWS_TILE}")
    if x.shape[1] != k:
        raise ValueError(f"x has {x.shape[1]} columns for a weight of {k}")
    default_width, default_k = tile_shape(n, k, _sm_count(x.device), w.element_size())
    width = width or default_width
    # A width other than the default keeps the default's K step where it fits.
    block_k = block_k or fitted_block_k(default_k, k, width, w.element_size())
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    bias = b if b is not None else w
    _rows_linear_kernel[(triton.cdiv(n, width),)](
        x, w, bias, y, rows, n, k, x.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=b is not None, BLOCK_M=ROWS_TILE, BLOCK_N=width, BLOCK_K=block_k,
        num_warps=4, num_stages=STAGES,
    )  # fmt: skip
    return y


def triton_rows_gated(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` for x [rows <= ROWS_TILE, K] and the packed
    ``gate_up [2 * intermediate, K]``, in one kernel; batch-invariant per row. The
    tile is the packed weight's (``tile_shape``): each program streams half its width
    of gate rows and the same columns' up rows, so the weight bytes in flight are the
    unfused projection's."""
    rows, k = x.shape
    n2 = gate_up.shape[0]
    if rows > ROWS_TILE:
        raise ValueError(f"{rows} rows exceed the batch-invariant tile of {ROWS_TILE}")
    if gate_up.shape[1] != k or n2 % 2:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} is not a packed pair over {k} columns")
    width, block_k = tile_shape(n2, k, _sm_count(x.device), gate_up.element_size())
    n = n2 // 2
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    _rows_gated_kernel[(triton.cdiv(n, width // 2),)](
        x, gate_up, y, rows, n, k, x.stride(0), gate_up.stride(0), y.stride(0),
        BLOCK_M=ROWS_TILE, BLOCK_N=width // 2, BLOCK_K=block_k, num_warps=4, num_stages=STAGES,
    )  # fmt: skip
    return y


@torch.library.custom_op("flare::rows_gated", mutates_args=())
def rows_gated(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """Batch-invariant gated activation of a few rows (torch reference on the CPU)."""
    if isinstance(_rows_gated_kernel, InterpretedFunction):
        return triton_rows_gated(x, gate_up)
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up


@rows_gated.register_kernel("cuda")
def _rows_gated_cuda(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return triton_rows_gated(x, gate_up)


@rows_gated.register_fake
def _rows_gated_fake(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], gate_up.shape[0] // 2)


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


def gated_project(
    x: torch.Tensor, gate_up: torch.Tensor, act_fn: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``act_fn(gate) * up`` of the packed ``gate_up`` projection over the last
    dimension. Few rows: one batch-invariant kernel, whose activation is SiLU (the
    caller's ``act_fn`` must be); more: cuBLAS, then ``act_fn`` and the product."""
    rows = x.numel() // x.shape[-1]
    if rows > ROWS_TILE:
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        return act_fn(gate) * up
    flat = rows_gated(x.reshape(rows, x.shape[-1]), gate_up)
    return flat.view(*x.shape[:-1], gate_up.shape[0] // 2)
