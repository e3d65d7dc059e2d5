"""Dense projections, with a batch-invariant path for decode-sized row counts.

cuBLAS picks its kernel (and so its reduction order) from the problem shape, so the
same request decoded at capacity 1 and at capacity 4 can round differently, and a
sampled token can then depend on which requests shared its batch. Projections of at
most ``INVARIANT_ROWS`` rows (a decode step's at any prepared concurrency) therefore
use Triton kernels whose tiling is fixed: the rows go in tiles of ``ROWS_TILE``, each
computed by the same tile shape and K loop whatever the row count, so a row's result
is bitwise independent of its batch. One program takes all of a step's row tiles
(``row_tiles``) and multiplies each weight tile it loads into every one of them by the
same 16-row dot: the weight is read once at any row count (with a program per row
tile, 64 rows read it four times, partly from L2, and the Qwen3-8B projections ran
twice as long as at 16; ``bench/results/issue23/2026-12-04-h200-concurrency/``).
Larger (prefill) projections use cuBLAS. The choice is by static shape, so each captured graph holds
one operator per GEMM.

The tile (``BLOCK_N`` output columns by ``BLOCK_K`` of the K loop) follows the
weight's shape and the device, and past one row tile the row tiles a program takes
(``many_rows_tile``). Decode reads each weight once,
so the kernel is a weight stream, and its speed is the weight bytes in flight: the
width is the one of 64 and 32 columns whose programs fill the most of their waves of
SMs, the wider on a tie (calibrated on 132-SM parts, the H200 and H100 SXM), or 16
where 32 leaves more than half the SMs idle (SmolLM2's 576 columns: 36 programs, not
18), and when that leaves at most one program per SM (a 4096-column
projection: 128 programs of 32 columns on the H200's 132 SMs) each K step loads 512
columns, with at most two 256, else 128, and no more than a third of K, so the loop's
pipeline fills
(``tile_shape``; from ``bench/rows_linear_bench.py`` on the H200: the Qwen3-8B down
projection read its 101 MB in 38 us at 16x128 and in 27 us at 32x512, 3.7 TB/s,
where a device copy moved 4.0).
A row's result is bitwise independent of its batch at every tile; the width changes
which program computes a column, not its arithmetic. A K split (fp32 partials summed
in order by a second kernel) was measured against these tiles and never won (the
bench of ``bench/results/issue5/2026-11-30e-two-gpus/``), so weights that fill the
device are never split. The gated
variant (``triton_rows_gated``) streams a packed gate/up weight on the same tiles and
applies SiLU and the product in its epilogue: the decode MLP's first half in one kernel.

Projections too narrow for that kernel to give the GPU enough programs (a router's
128 output columns are 4 programs of 32) split K instead (``rows_split_linear``):
fp32 partials over fixed K ranges, one program per (row tile, column tile, range),
then their sum in range order, rounded once. The ranges follow the weight's shape and
the device (``split_shape``), so a row's sums are again the same at every batch size.
cuBLAS, which splits K for such shapes itself, picks its kernel by the row count, and
at 16 padded rows it took 8 to 12 us for the hybrid's 6.6 MB mix-in and shared-expert
weights (``bench/results/issue22/2026-12-03-h200-invariance/``). ``invariant_project``
chooses between the two by the weight's shape and the device, and ``ProjectedLinear``
is an ``nn.Linear`` that projects through it (a recipe swaps a canonical module's
class: parameters, names and attributes unchanged).

Both kernels can take a decoder layer's RMSNorm (``norm``), and the plain one the
residual addition in its epilogue (``residual``, rounded as eager rounds it), so a
decode layer can be four projections with no norm or addition kernels between them
(``recipes.llama.DecodeFusedLayer``). The norm's statistic is a reduction over the
whole row, which no program has before its K loop ends. Computing it first, row by
row, cost 2.6 us a row in the Qwen3-8B qkv projection (16.4 us plain, 19.3 with one
row, 27.1 with four; ``bench/results/issue5/2026-11-30f-two-gpus/``); gathering the
squares and applying the gain in the K loop made the loop body 329 instructions a
step against 126 (each warp squares and scales its replicated copy of x's tile) and
the qkv and gate/up kernels 1.8x slower (``bench/results/issue23/2026-12-04e-h200-
programmatic-launch/``). So the statistic comes from the projection that produced the
row (``squares``): its epilogue writes, beside each output tile, the fp32 sums of the
rounded outputs' squares over fixed groups of ``SQUARE_GROUP`` columns, each summed by
the same pairwise tree whatever the tile (``RowStatistic``). The projection that
reads the row loads its groups right after its wait, under the K loop, and sums them
after it by a pairwise tree spelled out too (``_inv_rms``); its K loop is the plain
one: the norm's gain is
folded into its weight at preparation (``fold_gain``), so the dot's operand is x as
loaded and the fp32 sums are scaled by the row's inverse RMS at the end. Eager rounds
``x * inv_rms``, then the gain product, where this rounds ``w * gain`` once: about one
operand rounding from eager's result, within the projection's own tolerance, and a
row's result never depends on its batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from fractions import Fraction
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.programmatic_launch import await_producer, kernel_options
from ignition.components.triton_support import fix_interpreter_loop_bounds

ROWS_TILE = 16
# The most rows the batch-invariant kernels take, in tiles of ``ROWS_TILE`` (a decode
# step at the largest prepared concurrency; preparation refuses more).
INVARIANT_ROWS = 64
# Row tiles one program multiplies each weight tile into (``_rows_dot``).
MAX_ROW_TILES = INVARIANT_ROWS // ROWS_TILE
# Output tile widths the kernel runs at (every one gives the same bits); ``tile_shape``
# picks from the first two (``TILE_WIDTHS``), or the last for a projection too narrow
# for 32-column programs on half the SMs.
BLOCK_NS = (64, 32, 16)
# The least dimension of a Triton dot: the gated kernel's half tiles are at least this.
DOT_MIN = 16
GATED_NARROWEST = 2 * DOT_MIN
TILE_WIDTHS = BLOCK_NS[:2]
# K steps by programs per SM: at most one, at most two, more.
BLOCK_KS = (512, 256, 128)
# The same past one row tile (a program multiplies each weight tile into two to four
# row tiles), by row tiles: 2, then 3 or 4. Shorter steps: the Qwen3-8B o and down
# projections took 27.6 and 80.6 us at 64 rows in 512-column steps and 19.5 and 51.0
# in 256, gate/up 81.8 in 128 and 56.3 in 64 (``bench/rows_linear_bench.py
# --many-rows``, H200, ``bench/results/issue23/2026-12-04c-h200-many-rows/``).
MANY_ROWS_BLOCK_KS = ((256, 256, 128), (256, 256, 64))
# The K loop's pipeline: STAGES loads in flight of x's and w's tiles, within the
# shared memory an H200 program may take (227 KiB; 64x512 bf16 tiles would need 320).
STAGES = 4
PIPELINE_BYTES = 192 << 10
# The K split of projections too narrow to fill the device (``split_shape``): K
# steps, the fewest per range, the most ranges; and the sum kernel's block.
SPLIT_BLOCK_K = 128
SPLIT_MIN_STEPS = 2
SPLIT_MAX = 32
SUM_BLOCK = 1024
# The columns of one partial sum of squares a projection leaves for the RMSNorm of
# the row it wrote (``_group_squares``): every tile width is a multiple.
SQUARE_GROUP = 16
# Early weights (``programmatic_launch``): the bytes of early weight tiles a thread
# may hold through the K loop (64 registers), and the most K steps a program loads
# early: a weight tile each, or two for the gated kernel, whose four steps of
# SmolLM2's 16-column tiles spilled 176 bytes a thread on SM90 (three: none).
EARLY_BYTES = 256
EARLY_STEPS = 4
EARLY_GATED_STEPS = 3
# The interpreter's stand-in for a device's SM count: one, so it runs the widest tile
# (the fewest programs, each a Python loop there); every width gives the same bits.
INTERPRETER_SMS = 1


@triton.constexpr_function
def _log2(n: int) -> int:
    """log2 of a power of two, at compile time."""
    return n.bit_length() - 1


@triton.jit
def _pair_sums(q, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """``[ROWS, WIDTH // 2]``: the sums of ``q [ROWS, WIDTH]``'s adjacent column pairs."""
    first, second = tl.split(tl.reshape(q, (ROWS, WIDTH // 2, 2)))
    return first + second


# Under Triton's interpreter, the row dots multiply fp32 copies of 16-bit tiles: the
# interpreter multiplies bfloat16's raw uint16 storage (triton-lang/triton#11584), and
# bf16 x bf16 products are exact in fp32. Off on the GPU, where the branch compiles out.
_UPCAST = tl.constexpr(isinstance(_pair_sums, InterpretedFunction))


@triton.jit
def _row_dot(x, wt, acc):
    """``acc + x @ wt`` in fp32 (``_UPCAST``)."""
    if _UPCAST:
        out = tl.dot(x.to(tl.float32), wt.to(tl.float32), acc)
    else:
        out = tl.dot(x, wt, acc)
    return out


@triton.jit
def _group_squares(out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``[BLOCK_M, BLOCK_N // SQUARE_GROUP]`` fp32: the sums of ``out``'s squares over
    each group of 16 columns (``SQUARE_GROUP``), by the same pairwise tree of fp32
    additions whatever the tile's width or layout (a reduction's order follows the
    layout the compiler picks; these additions are each spelled out). A kernel that
    writes squares is compiled without floating-point contraction
    (``triton_rows_linear``): LLVM fused the first level into ``fma(a, a, b * b)``,
    which would hold only while every tile width compiled alike."""
    groups: tl.constexpr = BLOCK_M * BLOCK_N // 16
    f = out.to(tl.float32)
    q = tl.reshape(f * f, (groups, 16))
    q = _pair_sums(q, groups, 16)
    q = _pair_sums(q, groups, 8)
    q = _pair_sums(q, groups, 4)
    q = _pair_sums(q, groups, 2)
    return tl.reshape(q, (BLOCK_M, BLOCK_N // 16))


@triton.jit
def _row_squares(s_ptr, rm, M, K, stride_sm, GROUPS: tl.constexpr):
    """``[BLOCK_M, GROUPS]`` fp32: rows ``rm``'s partial sums of squares
    (``K // SQUARE_GROUP`` a row at ``s_ptr``, ``GROUPS`` the power of two that holds
    them; zeros past them and past ``M``). A kernel loads them right after its wait
    (``_rows_dot``), so that their latency hides under the K loop, and reduces them
    after it (``_inv_rms``): loaded after the loop, they added a round trip to the
    tail of every program."""
    rg = tl.arange(0, GROUPS)
    mask = (rm[:, None] < M) & (rg[None, :] < K // 16)
    return tl.load(s_ptr + rm[:, None] * stride_sm + rg[None, :], mask=mask, other=0.0)


@triton.jit
def _inv_rms(squares, K, eps, BLOCK_M: tl.constexpr, GROUPS: tl.constexpr):
    """``[BLOCK_M]`` fp32 ``1 / sqrt(mean(x**2) + eps)`` of each row from its partial
    squares (``_row_squares``), summed by the same pairwise tree of fp32 additions
    whatever the layout the compiler gives the tile (each level spelled out, as
    ``_group_squares``'s; a reduction's order follows the layout, which differed
    between kernels once), so a row's statistic never depends on its batch, its row
    tile or where the tile was loaded."""
    q = squares
    for level in tl.static_range(_log2(GROUPS)):
        q = _pair_sums(q, BLOCK_M, GROUPS >> level)
    return 1.0 / tl.sqrt(tl.reshape(q, (BLOCK_M,)) / K + eps)


@triton.jit
def _tile_inv_rms(
    squares, s_ptr, rm, M, K, stride_sm, eps, LOADED: tl.constexpr, BLOCK_M: tl.constexpr,
    GROUPS: tl.constexpr,
):  # fmt: skip
    """``_inv_rms`` of row tile ``rm``: from ``squares`` where ``LOADED`` (the first row
    tile's, loaded before the K loop), else from its squares loaded here (a later
    tile's: each would hold GROUPS registers a thread through the loop)."""
    if not LOADED:
        squares = _row_squares(s_ptr, rm, M, K, stride_sm, GROUPS)
    return _inv_rms(squares, K, eps, BLOCK_M, GROUPS)


@triton.jit
def _x_tile(x_ptr, rm, kk, M, K, stride_xm):
    """x's ``[BLOCK_M, BLOCK_K]`` tile of rows ``rm`` and columns ``kk`` (zero outside)."""
    mask = (rm[:, None] < M) & (kk[None, :] < K)
    return tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mask, other=0.0)


@triton.jit
def _w_tile(w_ptr, rn, kk, N, K, stride_wn):
    """w's ``[BLOCK_N, BLOCK_K]`` tile of rows ``rn`` and columns ``kk`` (zero outside)."""
    mask = (rn[:, None] < N) & (kk[None, :] < K)
    return tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=mask, other=0.0)


@triton.jit
def _rows_step(
    x_ptr, w, rm, kk, M, K, stride_xm, acc0, acc1, acc2, acc3, ROW_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One K step of ``_rows_dot``: the weight tile ``w`` (columns ``kk``) into each of
    the ``ROW_TILES`` row tiles' accumulators by the same ``BLOCK_M``-row dot."""
    wt = tl.trans(w)
    acc0 = _row_dot(_x_tile(x_ptr, rm, kk, M, K, stride_xm), wt, acc0)
    if ROW_TILES > 1:
        acc1 = _row_dot(_x_tile(x_ptr, rm + BLOCK_M, kk, M, K, stride_xm), wt, acc1)
    if ROW_TILES > 2:
        acc2 = _row_dot(_x_tile(x_ptr, rm + 2 * BLOCK_M, kk, M, K, stride_xm), wt, acc2)
    if ROW_TILES > 3:
        acc3 = _row_dot(_x_tile(x_ptr, rm + 3 * BLOCK_M, kk, M, K, stride_xm), wt, acc3)
    return acc0, acc1, acc2, acc3


@triton.jit
def _rows_dot(
    x_ptr,
    w_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    rm,
    rn,
    s_ptr,
    stride_sm,
    ROW_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
    EARLY_WEIGHTS: tl.constexpr = 0,
    NORM: tl.constexpr = False,
    GROUPS: tl.constexpr = 1,
):
    """fp32 ``x[rm + t * BLOCK_M] @ w[rn].T`` for the program's ``ROW_TILES`` (1 to 4)
    row tiles ``t``, four accumulators (those past ``ROW_TILES`` stay zero): each
    weight tile is loaded once and multiplied into every row tile by the same
    ``BLOCK_M``-row dot, so a row's arithmetic is that of one tile whatever the row
    count. With ``PDL``, the wait for the kernel before comes first; with
    ``EARLY_WEIGHTS`` (1 to 4, at most the K steps) too, the weight tiles of the last
    that many K steps are loaded before it (``programmatic_launch``: no kernel of a
    step writes a weight) and held through the loop over the others, which the wait
    lets start at once. The steps are the same, in K order, so the bits are too.
    With ``NORM``, the first row tile's partial squares (``_row_squares``) are loaded
    right after the wait and returned with the sums (zeros otherwise)."""
    rk = tl.arange(0, BLOCK_K)
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    end = K
    if EARLY_WEIGHTS > 0:
        end = (tl.cdiv(K, BLOCK_K) - EARLY_WEIGHTS) * BLOCK_K
        early0 = _w_tile(w_ptr, rn, end + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 1:
            early1 = _w_tile(w_ptr, rn, end + BLOCK_K + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 2:
            early2 = _w_tile(w_ptr, rn, end + 2 * BLOCK_K + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 3:
            early3 = _w_tile(w_ptr, rn, end + 3 * BLOCK_K + rk, N, K, stride_wn)
        await_producer()
    elif PDL:
        await_producer()
    squares = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
    if NORM:
        squares = _row_squares(s_ptr, rm, M, K, stride_sm, GROUPS)
    for k0 in range(0, end, BLOCK_K):
        kk = k0 + rk
        acc0, acc1, acc2, acc3 = _rows_step(
            x_ptr, _w_tile(w_ptr, rn, kk, N, K, stride_wn), rm, kk, M, K, stride_xm, acc0,
            acc1, acc2, acc3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 0:
        acc0, acc1, acc2, acc3 = _rows_step(
            x_ptr, early0, rm, end + rk, M, K, stride_xm, acc0, acc1, acc2, acc3, ROW_TILES,
            BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 1:
        acc0, acc1, acc2, acc3 = _rows_step(
            x_ptr, early1, rm, end + BLOCK_K + rk, M, K, stride_xm, acc0, acc1, acc2, acc3,
            ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 2:
        acc0, acc1, acc2, acc3 = _rows_step(
            x_ptr, early2, rm, end + 2 * BLOCK_K + rk, M, K, stride_xm, acc0, acc1, acc2,
            acc3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 3:
        acc0, acc1, acc2, acc3 = _rows_step(
            x_ptr, early3, rm, end + 3 * BLOCK_K + rk, M, K, stride_xm, acc0, acc1, acc2,
            acc3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    return acc0, acc1, acc2, acc3, squares


@triton.jit
def _store_rows(
    acc,
    squares,
    b_ptr,
    s_ptr,
    r_ptr,
    y_ptr,
    q_ptr,
    M,
    N,
    K,
    stride_sm,
    stride_rm,
    stride_ym,
    stride_qm,
    eps,
    rm,
    rn,
    col_tile,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SQUARES: tl.constexpr,
    LOADED: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The output tile of rows ``rm`` and column tile ``col_tile``: fp32 ``acc``
    (scaled by each row's inverse RMS with ``NORM``, ``_tile_inv_rms``: from
    ``squares`` where ``LOADED``) plus the bias, rounded once to y's dtype; with
    ``RESIDUAL``, then added to the residual's tile and rounded again (eager's
    ``residual + linear(x)``); with ``SQUARES``, the output's partial squares stored
    beside it (``_group_squares``, to ``q_ptr``)."""
    dtype = y_ptr.dtype.element_ty
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if NORM:
        inv = _tile_inv_rms(squares, s_ptr, rm, M, K, stride_sm, eps, LOADED, BLOCK_M, GROUPS)
        acc *= inv[:, None]
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    out = acc.to(dtype)
    if RESIDUAL:
        residual = tl.load(r_ptr + rm[:, None] * stride_rm + rn[None, :], mask=mask, other=0.0)
        out = (residual.to(tl.float32) + out.to(tl.float32)).to(dtype)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], out, mask=mask)
    if SQUARES:
        rq = col_tile * (BLOCK_N // 16) + tl.arange(0, BLOCK_N // 16)
        tl.store(
            q_ptr + rm[:, None] * stride_qm + rq[None, :],
            _group_squares(out, BLOCK_M, BLOCK_N),
            mask=(rm[:, None] < M) & (rq[None, :] < N // 16),
        )


@triton.jit
def _linear_tile(
    x_ptr, w_ptr, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_xm, stride_wn,
    stride_sm, stride_rm, stride_ym, stride_qm, eps, row_block, col_tile,
    HAS_BIAS: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
    SQUARES: tl.constexpr, ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr,
    PDL: tl.constexpr, EARLY_WEIGHTS: tl.constexpr,
):  # fmt: skip
    """``residual + linear(rms_norm(x))``, each part optional (``NORM``: x's partial
    squares ``s_ptr`` and ``eps``, the gain folded into w; ``RESIDUAL``: ``r_ptr``),
    and with ``SQUARES`` the result's partial squares (``q_ptr``), of the
    ``ROW_TILES`` row tiles of ``row_block`` and column tile ``col_tile``: a program
    of ``_rows_linear_kernel``, or one tile of a persistent kernel's phase. With
    ``PDL``, launched programmatically: the wait before anything else, or with
    ``EARLY_WEIGHTS`` before anything but the last K steps' weight tiles
    (``_rows_dot``)."""
    rm = row_block * ROW_TILES * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    acc0, acc1, acc2, acc3, squares = _rows_dot(
        x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, rm, rn, s_ptr, stride_sm, ROW_TILES,
        BLOCK_M, BLOCK_N, BLOCK_K, PDL, EARLY_WEIGHTS, NORM, GROUPS,
    )  # fmt: skip
    _store_rows(
        acc0, squares, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_sm, stride_rm,
        stride_ym, stride_qm, eps, rm, rn, col_tile, HAS_BIAS, NORM, RESIDUAL, SQUARES, True,
        GROUPS, BLOCK_M, BLOCK_N,
    )  # fmt: skip
    if ROW_TILES > 1:
        _store_rows(
            acc1, squares, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_sm, stride_rm,
            stride_ym, stride_qm, eps, rm + BLOCK_M, rn, col_tile, HAS_BIAS, NORM, RESIDUAL,
            SQUARES, False, GROUPS, BLOCK_M, BLOCK_N,
        )  # fmt: skip
    if ROW_TILES > 2:
        _store_rows(
            acc2, squares, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_sm, stride_rm,
            stride_ym, stride_qm, eps, rm + 2 * BLOCK_M, rn, col_tile, HAS_BIAS, NORM,
            RESIDUAL, SQUARES, False, GROUPS, BLOCK_M, BLOCK_N,
        )  # fmt: skip
    if ROW_TILES > 3:
        _store_rows(
            acc3, squares, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_sm, stride_rm,
            stride_ym, stride_qm, eps, rm + 3 * BLOCK_M, rn, col_tile, HAS_BIAS, NORM,
            RESIDUAL, SQUARES, False, GROUPS, BLOCK_M, BLOCK_N,
        )  # fmt: skip


@triton.jit
def _rows_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    s_ptr,
    r_ptr,
    y_ptr,
    q_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sm,
    stride_rm,
    stride_ym,
    stride_qm,
    eps,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    RESIDUAL: tl.constexpr,
    SQUARES: tl.constexpr,
    ROW_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUPS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    EARLY_WEIGHTS: tl.constexpr = 0,
):
    """``_linear_tile`` of the ``ROW_TILES`` row tiles of ``program_id(0)`` and column
    tile ``program_id(1)``."""
    _linear_tile(
        x_ptr, w_ptr, b_ptr, s_ptr, r_ptr, y_ptr, q_ptr, M, N, K, stride_xm, stride_wn,
        stride_sm, stride_rm, stride_ym, stride_qm, eps, tl.program_id(0), tl.program_id(1),
        HAS_BIAS, NORM, RESIDUAL, SQUARES, ROW_TILES, BLOCK_M, BLOCK_N, BLOCK_K, GROUPS, PDL,
        EARLY_WEIGHTS,
    )  # fmt: skip


@triton.jit
def _store_gated(
    gate, up, squares, s_ptr, y_ptr, M, N, K, stride_sm, stride_ym, eps, rm, rn,
    NORM: tl.constexpr, LOADED: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One row tile's ``silu(gate) * up`` from its fp32 sums (scaled by the rows'
    inverse RMS with ``NORM``, as ``_store_rows``; from ``squares`` where ``LOADED``
    before the K loop, ``_tile_inv_rms``): each projection rounded to y's dtype, then
    the activation, then the product (eager rounding)."""
    if NORM:
        inv = _tile_inv_rms(squares, s_ptr, rm, M, K, stride_sm, eps, LOADED, BLOCK_M, GROUPS)
        gate *= inv[:, None]
        up *= inv[:, None]
    dtype = y_ptr.dtype.element_ty
    g = gate.to(dtype).to(tl.float32)
    act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
    tl.store(
        y_ptr + rm[:, None] * stride_ym + rn[None, :],
        (act * up.to(dtype).to(tl.float32)).to(dtype),
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


@triton.jit
def _gated_step(
    x_ptr, w_gate, w_up, rm, kk, M, K, stride_xm, gate0, gate1, gate2, gate3, up0, up1, up2,
    up3, ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One K step of ``_rows_gated_kernel``: the gate and up tiles (columns ``kk``) into
    each of the ``ROW_TILES`` row tiles' sums by the same dots (as ``_rows_step``)."""
    w_gate = tl.trans(w_gate)
    w_up = tl.trans(w_up)
    x = _x_tile(x_ptr, rm, kk, M, K, stride_xm)
    gate0 = _row_dot(x, w_gate, gate0)
    up0 = _row_dot(x, w_up, up0)
    if ROW_TILES > 1:
        x = _x_tile(x_ptr, rm + BLOCK_M, kk, M, K, stride_xm)
        gate1 = _row_dot(x, w_gate, gate1)
        up1 = _row_dot(x, w_up, up1)
    if ROW_TILES > 2:
        x = _x_tile(x_ptr, rm + 2 * BLOCK_M, kk, M, K, stride_xm)
        gate2 = _row_dot(x, w_gate, gate2)
        up2 = _row_dot(x, w_up, up2)
    if ROW_TILES > 3:
        x = _x_tile(x_ptr, rm + 3 * BLOCK_M, kk, M, K, stride_xm)
        gate3 = _row_dot(x, w_gate, gate3)
        up3 = _row_dot(x, w_up, up3)
    return gate0, gate1, gate2, gate3, up0, up1, up2, up3


@triton.jit
def _gated_tile(
    x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sm, stride_ym, eps,
    row_block, col_tile, NORM: tl.constexpr, ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUPS: tl.constexpr, PDL: tl.constexpr,
    EARLY_WEIGHTS: tl.constexpr,
):  # fmt: skip
    """``silu(gate) * up`` of columns ``rn`` for the packed weight ``w [2N, K]``
    (gate rows, then up rows): both tiles stream in one K loop and go into each of the
    ``ROW_TILES`` (1 to 4) row tiles of ``row_block`` by the same dots (as
    ``_rows_dot``), column tile ``col_tile``: a program of ``_rows_gated_kernel``, or
    one tile of a persistent kernel's phase. With ``NORM``, of x's rows normalized
    (partial squares ``s_ptr``, ``eps``, the gain folded into w; as ``_linear_tile``).
    ``PDL`` and ``EARLY_WEIGHTS`` as ``_rows_dot``'s (each early step two tiles
    here)."""
    rm = row_block * ROW_TILES * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    up_ptr = w_ptr + N * stride_wn
    gate0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    end = K
    if EARLY_WEIGHTS > 0:
        end = (tl.cdiv(K, BLOCK_K) - EARLY_WEIGHTS) * BLOCK_K
        early_gate0 = _w_tile(w_ptr, rn, end + rk, N, K, stride_wn)
        early_up0 = _w_tile(up_ptr, rn, end + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 1:
            early_gate1 = _w_tile(w_ptr, rn, end + BLOCK_K + rk, N, K, stride_wn)
            early_up1 = _w_tile(up_ptr, rn, end + BLOCK_K + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 2:
            early_gate2 = _w_tile(w_ptr, rn, end + 2 * BLOCK_K + rk, N, K, stride_wn)
            early_up2 = _w_tile(up_ptr, rn, end + 2 * BLOCK_K + rk, N, K, stride_wn)
        if EARLY_WEIGHTS > 3:
            early_gate3 = _w_tile(w_ptr, rn, end + 3 * BLOCK_K + rk, N, K, stride_wn)
            early_up3 = _w_tile(up_ptr, rn, end + 3 * BLOCK_K + rk, N, K, stride_wn)
        await_producer()
    elif PDL:
        await_producer()
    squares = tl.zeros((BLOCK_M, GROUPS), dtype=tl.float32)
    if NORM:  # the first row tile's, under the K loop (``_row_squares``)
        squares = _row_squares(s_ptr, rm, M, K, stride_sm, GROUPS)
    for k0 in range(0, end, BLOCK_K):
        kk = k0 + rk
        gate0, gate1, gate2, gate3, up0, up1, up2, up3 = _gated_step(
            x_ptr, _w_tile(w_ptr, rn, kk, N, K, stride_wn),
            _w_tile(up_ptr, rn, kk, N, K, stride_wn), rm, kk, M, K, stride_xm, gate0, gate1,
            gate2, gate3, up0, up1, up2, up3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 0:
        gate0, gate1, gate2, gate3, up0, up1, up2, up3 = _gated_step(
            x_ptr, early_gate0, early_up0, rm, end + rk, M, K, stride_xm, gate0, gate1, gate2,
            gate3, up0, up1, up2, up3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 1:
        gate0, gate1, gate2, gate3, up0, up1, up2, up3 = _gated_step(
            x_ptr, early_gate1, early_up1, rm, end + BLOCK_K + rk, M, K, stride_xm, gate0,
            gate1, gate2, gate3, up0, up1, up2, up3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 2:
        gate0, gate1, gate2, gate3, up0, up1, up2, up3 = _gated_step(
            x_ptr, early_gate2, early_up2, rm, end + 2 * BLOCK_K + rk, M, K, stride_xm, gate0,
            gate1, gate2, gate3, up0, up1, up2, up3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    if EARLY_WEIGHTS > 3:
        gate0, gate1, gate2, gate3, up0, up1, up2, up3 = _gated_step(
            x_ptr, early_gate3, early_up3, rm, end + 3 * BLOCK_K + rk, M, K, stride_xm, gate0,
            gate1, gate2, gate3, up0, up1, up2, up3, ROW_TILES, BLOCK_M,
        )  # fmt: skip
    _store_gated(
        gate0, up0, squares, s_ptr, y_ptr, M, N, K, stride_sm, stride_ym, eps, rm, rn, NORM,
        True, GROUPS, BLOCK_M,
    )  # fmt: skip
    if ROW_TILES > 1:
        _store_gated(
            gate1, up1, squares, s_ptr, y_ptr, M, N, K, stride_sm, stride_ym, eps,
            rm + BLOCK_M, rn, NORM, False, GROUPS, BLOCK_M,
        )  # fmt: skip
    if ROW_TILES > 2:
        _store_gated(
            gate2, up2, squares, s_ptr, y_ptr, M, N, K, stride_sm, stride_ym, eps,
            rm + 2 * BLOCK_M, rn, NORM, False, GROUPS, BLOCK_M,
        )  # fmt: skip
    if ROW_TILES > 3:
        _store_gated(
            gate3, up3, squares, s_ptr, y_ptr, M, N, K, stride_sm, stride_ym, eps,
            rm + 3 * BLOCK_M, rn, NORM, False, GROUPS, BLOCK_M,
        )  # fmt: skip


@triton.jit
def _rows_gated_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sm,
    stride_ym,
    eps,
    NORM: tl.constexpr,
    ROW_TILES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUPS: tl.constexpr = 1,
    PDL: tl.constexpr = False,
    EARLY_WEIGHTS: tl.constexpr = 0,
):
    """``_gated_tile`` of the ``ROW_TILES`` row tiles of ``program_id(0)`` and column
    tile ``program_id(1)``."""
    _gated_tile(
        x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sm, stride_ym, eps,
        tl.program_id(0), tl.program_id(1), NORM, ROW_TILES, BLOCK_M, BLOCK_N, BLOCK_K,
        GROUPS, PDL, EARLY_WEIGHTS,
    )  # fmt: skip


@triton.jit
def _rows_split_kernel(
    x_ptr,
    w_ptr,
    p_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """fp32 ``x[rm] @ w[rn].T`` over K range ``program_id(2)`` (``K_SPLIT`` columns,
    the K loop of ``_rows_dot`` over that range) of row tile ``program_id(0)`` and
    column tile ``program_id(1)``, stored to the partials ``p [splits, M, N]``. With
    ``PDL``, launched programmatically: the wait before anything else."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    if PDL:
        await_producer()
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        kk = split * K_SPLIT + k0 + rk
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
        acc = _row_dot(x, tl.trans(w), acc)
    tl.store(
        p_ptr + split * M * N + rm[:, None] * N + rn[None, :],
        acc,
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )


@triton.jit
def _split_sum_kernel(
    p_ptr,
    b_ptr,
    y_ptr,
    MN,
    N,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``y = sum of the partials p [SPLITS, M, N] in split order + bias``, rounded
    once to y's dtype (contiguous ``[M, N]``, ``MN`` elements)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLITS):
        acc += tl.load(p_ptr + split * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


if isinstance(_rows_linear_kernel, InterpretedFunction):
    fix_interpreter_loop_bounds()


def tile_shape(
    n: int,
    k: int,
    sms: int,
    itemsize: int = 2,
    tiles: int = 1,
    step_fixes_bits: bool = True,
    narrowest: int = BLOCK_NS[-1],
) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) of an ``n`` x ``k`` weight of ``itemsize``-byte elements on
    ``sms`` SMs for ``tiles`` row tiles a program.

    One row tile: the width of ``TILE_WIDTHS`` whose programs fill the most of their
    waves of ``sms`` (``wave_fill``), the wider on a tie (the 8B's qkv, 96 programs of
    64 columns or 192 of 32, both 0.73 of their waves on 132 SMs: 64 read it in 14.40
    us a layer of the decode step, 32 in 15.36, and 16.03 against 19.90 after the down
    projection with the norms fusion, ``bench/results/issue23/2026-12-05e-h200-waves/``);
    or where 32 columns leave more than half the SMs idle, ``narrowest`` (16 columns;
    ``fills_the_device`` counts at 32; the gated kernel's tile is
    ``gated_tile_shape``'s): the most programs the kernel allows
    (SmolLM2's qkv, o and down at 16 columns took 3.6% off its 30 layers against 32,
    ``bench/persistent_layer_bench.py`` on the H200, and 0.74 us off each layer's busy
    time on an H100; the 8B's o and down, 128 programs of 32, keep 32: its down read in
    38.3 us at 32 and 39.8 at 16, ``bench/rows_linear_bench.py --widths``,
    ``bench/results/issue23/2026-12-05d-h100-tiles/``).
    Then K steps of ``BLOCK_KS`` by how many programs each SM gets (at most one, two,
    more), short enough for the K loop to fill its pipeline and within the pipeline's
    shared memory (``fitted_block_k``).

    More (``many_rows_tile``): the width whose programs fill their waves best, and
    shorter K steps unless the K step fixes the kernel's bits (``step_fixes_bits``,
    then one row tile's step is kept). It does in the interpreter, whose dot sums
    each step apart and adds it to the accumulator; a dot on the GPU accumulates its
    MMAs in K order at any step, and the norm's statistic and partial squares follow
    no tile (``triton_rows_linear``)."""
    width = best_filled_width(n, sms)
    if 2 * triton.cdiv(n, width) < sms:  # more than half the SMs idle: the most programs
        width = narrowest
    block_k = row_tile_k(n, k, width, sms, itemsize)
    if tiles == 1:
        return width, block_k
    keep = (width, block_k) if step_fixes_bits else None
    return many_rows_tile(n, k, sms, itemsize, tiles, keep)


def wave_fill(n: int, width: int, sms: int) -> Fraction:
    """The share of its waves' program slots that ``n`` columns in ``width``-column
    programs fill on ``sms`` SMs: a wave model's speed of one width against another,
    every program's time proportional to its width."""
    programs = triton.cdiv(n, width)
    return Fraction(programs, max(1, triton.cdiv(programs, sms)) * sms)


def best_filled_width(n: int, sms: int) -> int:
    """The width of ``TILE_WIDTHS`` whose programs fill the most of their waves
    (``wave_fill``), the widest on a tie."""
    return max(TILE_WIDTHS, key=lambda w: wave_fill(n, w, sms))


def gated_tile_shape(
    n2: int, k: int, sms: int, itemsize: int = 2, tiles: int = 1, step_fixes_bits: bool = True
) -> tuple[int, int]:
    """The gated kernel's tile for a packed ``n2 x k`` gate/up: at one row tile the
    widest of ``TILE_WIDTHS`` (halves of 32 columns) with that width's K step (both
    served gate/ups read fastest so on the H200, SmolLM2's 3072 rows in 4.85 us
    against 5.16 at 32 columns and the 8B's 24576 in 50.24 against 60.72, and
    SmolLM2's decode step took 701.8 us against 713.3 at c=1 and 718.4 against 726.7
    at c=4, ``bench/results/issue23/2026-12-05e-h200-waves/``); past it
    ``many_rows_tile``'s, as ``tile_shape``'s (its widths' halves are all at least
    ``DOT_MIN``)."""
    width = TILE_WIDTHS[0]
    one = (width, row_tile_k(n2, k, width, sms, itemsize))
    if tiles == 1:
        return one
    return many_rows_tile(n2, k, sms, itemsize, tiles, one if step_fixes_bits else None)


def row_tile_k(n: int, k: int, width: int, sms: int, itemsize: int = 2) -> int:
    """One row tile's K step at ``width`` columns (``tile_shape``): ``BLOCK_KS`` by
    the programs each SM gets, fitted to K and the pipeline (``fitted_block_k``)."""
    return fitted_block_k(_block_k(BLOCK_KS, triton.cdiv(n, width), sms), k, width, itemsize)


def _block_k(steps: tuple[int, int, int], programs: int, sms: int) -> int:
    """The K step of ``steps`` for at most one, at most two, or more programs per SM."""
    return steps[0] if programs <= sms else steps[1] if programs <= 2 * sms else steps[2]


def many_rows_tile(
    n: int, k: int, sms: int, itemsize: int, tiles: int, keep_k_of: tuple[int, int] | None
) -> tuple[int, int]:
    """The tile for ``tiles`` (2 to 4) row tiles a program: the width of ``TILE_WIDTHS``
    whose programs fill the most of their waves of ``sms`` (the wider on a tie: the
    Qwen3-8B qkv's 96 programs of 64 columns took 22.1 us at 64 rows where 192 of 32
    took 36.6), and K steps of ``MANY_ROWS_BLOCK_KS``; or, with ``keep_k_of`` (one row
    tile's tile, for a kernel whose bits follow its K step), that K step at the new
    width where it fits, else that whole tile. Every tile computes the same bits for a
    plain dot (``bench/rows_linear_bench.py --many-rows`` on the H200)."""
    width = best_filled_width(n, sms)
    if keep_k_of is not None:
        block_k = keep_k_of[1]
        fits = fitted_block_k(block_k, k, width, itemsize) == block_k
        return (width, block_k) if fits else keep_k_of
    steps = MANY_ROWS_BLOCK_KS[0 if tiles == 2 else 1]
    return width, fitted_block_k(_block_k(steps, triton.cdiv(n, width), sms), k, width, itemsize)


def fitted_block_k(block_k: int, k: int, width: int, itemsize: int) -> int:
    """``block_k`` as one step over ``k`` rounded up to a power of two where that is no
    wider, else halved until the K loop has ``STAGES - 1`` full steps, so that its
    pipeline fills (SmolLM2's 576 columns in 512-column steps load one full step and
    one seven-eighths masked: its qkv, o and gate/up projections took 3.8, 3.7 and
    4.5 us so, and 3.5, 3.4 and 4.0 in 128-column steps, on the H200); then halved
    until the pipeline of ``width``-column tiles fits its shared memory; at least 16.
    Repeated until nothing changes, so a fitted step fits as it is: one step halved
    for the shared memory (500 columns: 512, then 256) is no longer one step and
    halves again for the full steps (128), which a caller refitting it would get."""
    while True:
        fitted = _fit_block_k_once(block_k, k, width, itemsize)
        if fitted == block_k:
            return block_k
        block_k = fitted


def _fit_block_k_once(block_k: int, k: int, width: int, itemsize: int) -> int:
    single = max(16, triton.next_power_of_2(k))
    if single <= block_k:
        block_k = single
    else:
        while block_k > 16 and (STAGES - 1) * block_k > k:
            block_k //= 2
    while block_k > 16 and STAGES * (ROWS_TILE + width) * block_k * itemsize > PIPELINE_BYTES:
        block_k //= 2
    return block_k


def early_steps(
    k: int, block_k: int, step_bytes: int, most: int, tiles: int = 1, num_warps: int = 4
) -> int:
    """How many of a K loop's last steps load their weight tiles before the wait under
    early weights (``_rows_dot``): as many as ``EARLY_BYTES`` a thread holds
    (``step_bytes`` a step, over the program's threads), at least one, at most
    ``most`` and the loop's steps. SmolLM2's 576-column projections in 128-column
    steps load four of five early (its gate/up three: two 16-column tiles a step);
    the Qwen3-8B down projection one of 24. None past
    one row tile (``tiles``): there the accumulators already take the registers, and
    holding even one step spilled (the 8B's qkv at four row tiles: 104 bytes a
    thread, in SM90's SASS)."""
    if tiles > 1:
        return 0
    per_thread = max(1, step_bytes // (32 * num_warps))
    return max(1, min(most, triton.cdiv(k, block_k), EARLY_BYTES // per_thread))


def row_tiles(rows: int) -> int:
    """Row tiles per program: all of a step's rows (at most ``INVARIANT_ROWS``), so that
    each weight tile is read once whatever the row count."""
    return max(1, min(triton.cdiv(rows, ROWS_TILE), MAX_ROW_TILES))


def pipeline_stages(tiles: int, width: int, block_k: int, itemsize: int) -> int:
    """Loads in flight for ``tiles`` row tiles and a ``width`` x ``block_k`` weight
    tile: ``STAGES``, fewer where more row tiles would outgrow ``PIPELINE_BYTES``. The
    depth changes when the loads are issued, not the arithmetic."""
    per_stage = (tiles * ROWS_TILE + width) * block_k * itemsize
    return max(2, min(STAGES, PIPELINE_BYTES // per_stage))


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


class RowStatistic(NamedTuple):
    """A decoder layer's RMSNorm of a few rows as the kernels take it: the rows' fp32
    partial sums of squares (``squares [rows, K // SQUARE_GROUP]``, as the projection
    that wrote the rows leaves them: ``project_squares``) and the norm's epsilon. The
    gain is in the reading projection's weight (``fold_gain``)."""

    squares: torch.Tensor
    eps: float

    def inv_rms(self, k: int) -> torch.Tensor:
        """``[rows]`` fp32 ``1 / sqrt(mean(x**2) + eps)`` of rows of ``k`` columns (the
        torch reference of the kernels' statistic; their sum's order is their own)."""
        return torch.rsqrt(self.squares.sum(-1) / k + self.eps)


def group_squares(y: torch.Tensor) -> torch.Tensor:
    """``[rows, N // SQUARE_GROUP]`` fp32 sums of ``y``'s squares over each group of
    ``SQUARE_GROUP`` columns (the torch reference of ``_group_squares``)."""
    f = y.float()
    return (f * f).view(y.shape[0], -1, SQUARE_GROUP).sum(-1)


def fold_gain(weight: torch.Tensor, gain: torch.Tensor) -> None:
    """Folds an RMSNorm's gain into the projection that reads the normalized rows:
    ``weight[:, k] *= gain[k]`` in place, rounded to the weight's dtype once (then
    ``linear(x * inv_rms, weight)`` is ``linear(rms_norm(x), weight before)`` within
    that rounding)."""
    if gain.shape != (weight.shape[1],):
        raise ValueError(
            f"a gain of {tuple(gain.shape)} does not fold into a weight of {tuple(weight.shape)}"
        )
    with torch.no_grad():
        weight.mul_(gain.to(weight.dtype)[None, :])


def _groups(k: int) -> int:
    """The kernels' ``GROUPS``: the power of two that holds a row's partial squares."""
    return triton.next_power_of_2(max(1, k // SQUARE_GROUP))


def _check_rows(x: torch.Tensor, k: int, norm: RowStatistic | None) -> None:
    if x.shape[0] > INVARIANT_ROWS:
        raise ValueError(f"{x.shape[0]} rows exceed the batch-invariant kernels' {INVARIANT_ROWS}")
    if x.shape[1] != k:
        raise ValueError(f"x has {x.shape[1]} columns for a weight of {k}")
    if norm is not None:
        expected = (x.shape[0], k // SQUARE_GROUP)
        squares = norm.squares
        if k % SQUARE_GROUP or squares.shape != expected or squares.dtype != torch.float32:
            raise ValueError(
                f"the norm's squares are {norm.squares.dtype} {tuple(norm.squares.shape)}; "
                f"{x.shape[0]} rows of {k} columns take float32 {expected}"
            )


def _step_fixes_bits() -> bool:
    """Whether a rows kernel's K step fixes its bits (``tile_shape``): in Triton's
    interpreter (the only way the kernels run on the CPU), whose dot sums each step
    apart."""
    return isinstance(_rows_linear_kernel, InterpretedFunction)


def triton_rows_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    width: int | None = None,
    block_k: int | None = None,
    norm: RowStatistic | None = None,
    residual: torch.Tensor | None = None,
    squares: torch.Tensor | None = None,
    stages: int | None = None,
) -> torch.Tensor:
    """``residual + rms_norm(x) @ w.T + b`` (norm and residual optional; the norm
    scales the sums, see the module's docstring) for x [rows <= INVARIANT_ROWS, K];
    batch-invariant per row. ``squares``: where to write the result's partial squares
    (``[rows, N // SQUARE_GROUP]`` float32), for the norm of the next projection.
    ``width`` and ``block_k``: the tile (default ``tile_shape`` of the weight and
    device), ``stages`` the pipeline's depth (default ``pipeline_stages``'s);
    ``bench/rows_linear_bench.py`` times others against them. ``w`` is a
    weight: no kernel of a step writes it, since under early weights
    (``programmatic_launch``) its last K steps are read before the kernel waits for
    the one before."""
    rows = x.shape[0]
    n, k = w.shape
    _check_rows(x, k, norm)
    if residual is not None and residual.shape != (rows, n):
        raise ValueError(f"the residual is {tuple(residual.shape)}, the output {(rows, n)}")
    wanted = (rows, n // SQUARE_GROUP)
    if squares is not None and (
        n % SQUARE_GROUP or squares.shape != wanted or not squares.is_contiguous()
    ):
        raise ValueError(
            f"partial squares of {tuple(squares.shape)} for {rows} rows of {n} columns "
            f"(contiguous [rows, N // {SQUARE_GROUP}], N a multiple of {SQUARE_GROUP})"
        )
    tiles = row_tiles(rows)
    default_width, default_k = tile_shape(
        n, k, _sm_count(x.device), w.element_size(), tiles, _step_fixes_bits()
    )
    width = width or default_width
    # A width other than the default keeps the default's K step where it fits.
    block_k = block_k or fitted_block_k(default_k, k, width, w.element_size())
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    res = y if residual is None else residual.contiguous()
    stats = y if norm is None else norm.squares.contiguous()
    out = y if squares is None else squares
    _rows_linear_kernel[(triton.cdiv(rows, tiles * ROWS_TILE), triton.cdiv(n, width))](
        x, w, w if b is None else b, stats, res, y, out, rows, n, k,
        x.stride(0), w.stride(0), stats.stride(0), res.stride(0), y.stride(0), out.stride(0),
        0.0 if norm is None else norm.eps,
        HAS_BIAS=b is not None, NORM=norm is not None, RESIDUAL=residual is not None,
        SQUARES=squares is not None, ROW_TILES=tiles, BLOCK_M=ROWS_TILE, BLOCK_N=width,
        BLOCK_K=block_k, GROUPS=_groups(k), num_warps=4,
        num_stages=stages or pipeline_stages(tiles, width, block_k, w.element_size()),
        enable_fp_fusion=squares is None,
        **kernel_options(
            w.device,
            early_steps(k, block_k, width * block_k * w.element_size(), EARLY_STEPS, tiles),
        ),
    )  # fmt: skip
    return y


def triton_rows_gated(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    norm: RowStatistic | None = None,
    width: int | None = None,
    block_k: int | None = None,
    stages: int | None = None,
) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` for x [rows <= INVARIANT_ROWS, K] (normalized by
    ``norm`` when given) and the packed ``gate_up [2 * intermediate, K]``,
    in one kernel; batch-invariant per row. The tile is the packed weight's
    (``tile_shape``): each program streams half its width of gate rows and the same
    columns' up rows, so the weight bytes in flight are the unfused projection's.
    ``width``: another packed width (at least 32, keeping the default's K step where it
    fits), for ``bench/rows_linear_bench.py --widths``; ``block_k`` and ``stages``
    another K step and pipeline depth, as ``triton_rows_linear``'s. ``gate_up`` is a
    weight, as ``triton_rows_linear``'s ``w``."""
    rows, k = x.shape
    n2 = gate_up.shape[0]
    _check_rows(x, gate_up.shape[1], norm)
    if n2 % 2:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} is not a packed pair over {k} columns")
    tiles = row_tiles(rows)
    default_width, block_k_default = gated_tile_shape(
        n2, k, _sm_count(x.device), gate_up.element_size(), tiles, _step_fixes_bits()
    )
    if width is not None:
        if width not in BLOCK_NS or width < GATED_NARROWEST:
            raise ValueError(
                f"a packed width of {width}: one of {BLOCK_NS} whose half is at least {DOT_MIN}"
            )
        block_k_default = fitted_block_k(block_k_default, k, width, gate_up.element_size())
    width = width or default_width
    block_k = block_k or block_k_default
    n = n2 // 2
    x = x.contiguous()
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    stats = y if norm is None else norm.squares.contiguous()
    _rows_gated_kernel[(triton.cdiv(rows, tiles * ROWS_TILE), triton.cdiv(n, width // 2))](
        x, gate_up, stats, y, rows, n, k, x.stride(0), gate_up.stride(0), stats.stride(0),
        y.stride(0), 0.0 if norm is None else norm.eps,
        NORM=norm is not None, ROW_TILES=tiles, BLOCK_M=ROWS_TILE,
        BLOCK_N=width // 2, BLOCK_K=block_k, GROUPS=_groups(k), num_warps=4,
        num_stages=stages or pipeline_stages(tiles, width, block_k, gate_up.element_size()),
        **kernel_options(
            gate_up.device,
            early_steps(
                k, block_k, width * block_k * gate_up.element_size(), EARLY_GATED_STEPS, tiles
            ),
        ),
    )  # fmt: skip
    return y


def split_shape(n: int, k: int, sms: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, K_SPLIT) of the K-split kernel for an ``n`` x ``k`` weight
    on ``sms`` SMs: the narrowest tile, and K in ranges of whole ``SPLIT_BLOCK_K``
    steps (at least ``SPLIT_MIN_STEPS``, at most ``SPLIT_MAX`` ranges) so that the
    column tiles times the ranges come near one program per SM."""
    width = TILE_WIDTHS[-1]
    wanted = max(1, sms // triton.cdiv(n, width))
    steps = max(SPLIT_MIN_STEPS, triton.cdiv(triton.cdiv(k, wanted), SPLIT_BLOCK_K))
    steps = max(steps, triton.cdiv(triton.cdiv(k, SPLIT_MAX), SPLIT_BLOCK_K))
    return width, SPLIT_BLOCK_K, min(steps * SPLIT_BLOCK_K, _round_up(k, SPLIT_BLOCK_K))


def _round_up(value: int, step: int) -> int:
    return triton.cdiv(value, step) * step


def triton_rows_split_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    k_split: int | None = None,
    width: int | None = None,
) -> torch.Tensor:
    """``x @ w.T + b`` for x [rows <= INVARIANT_ROWS, K] in two kernels: fp32
    partials over K ranges of ``k_split`` columns (default ``split_shape``), then
    their sum in range order with the bias, rounded once; batch-invariant per row.
    For weights too narrow for ``triton_rows_linear`` to give the device enough
    programs."""
    rows = x.shape[0]
    n, k = w.shape
    _check_rows(x, k, None)
    default_width, block_k, default_split = split_shape(n, k, _sm_count(x.device))
    width = width or default_width
    k_split = k_split or default_split
    if k_split % block_k:
        raise ValueError(f"a K range of {k_split} is not whole {block_k}-column steps")
    splits = triton.cdiv(k, k_split)
    x = x.contiguous()
    partials = torch.empty(splits, rows, n, dtype=torch.float32, device=x.device)
    _rows_split_kernel[(triton.cdiv(rows, ROWS_TILE), triton.cdiv(n, width), splits)](
        x, w, partials, rows, n, k, x.stride(0), w.stride(0),
        K_SPLIT=k_split, BLOCK_M=ROWS_TILE, BLOCK_N=width, BLOCK_K=block_k,
        num_warps=4, num_stages=STAGES,
        **kernel_options(w.device),
    )  # fmt: skip
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    _split_sum_kernel[(triton.cdiv(rows * n, SUM_BLOCK),)](
        partials, w if b is None else b, y, rows * n, n,
        SPLITS=splits, HAS_BIAS=b is not None, BLOCK=SUM_BLOCK,
    )  # fmt: skip
    return y


def _norm(squares: torch.Tensor | None, eps: float) -> RowStatistic | None:
    return None if squares is None else RowStatistic(squares, eps)


def _norm_args(norm: RowStatistic | None) -> tuple[torch.Tensor | None, float]:
    """The custom ops' spelling of ``norm``: its partial squares and epsilon, or none."""
    return (None, 0.0) if norm is None else (norm.squares, norm.eps)


def _eager_project(x: torch.Tensor, w: torch.Tensor, norm: RowStatistic | None) -> torch.Tensor:
    """``x @ w.T`` rounded to x's dtype, or with ``norm`` the fp32 sums scaled by the
    rows' inverse RMS (the kernels' arithmetic; bias and rounding are the caller's)."""
    if norm is None:
        return F.linear(x, w)
    return F.linear(x.float(), w.float()) * norm.inv_rms(x.shape[-1])[:, None]


def _eager_gated(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    norm: RowStatistic | None,
    act_fn: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> torch.Tensor:
    gate, up = _eager_project(x, gate_up, norm).to(x.dtype).chunk(2, dim=-1)
    return act_fn(gate) * up


def _eager_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm: RowStatistic | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    if norm is None:
        y = F.linear(x, w, b)
    else:
        y = _eager_project(x, w, norm)
        y = (y if b is None else y + b.float()).to(x.dtype)
    return y if residual is None else residual + y


def _interprets(x: torch.Tensor) -> bool:
    """Whether a CPU call runs the kernels under Triton's interpreter (the tests):
    for float32 operands only; other dtypes take the torch reference (the kernels
    compute bfloat16 there too, through ``_row_dot``'s fp32 copies, but a CPU model
    of 16-bit weights would run far slower through the interpreter)."""
    return isinstance(_rows_linear_kernel, InterpretedFunction) and x.dtype == torch.float32


# The custom ops take the norm as its partial squares and epsilon (an op's schema
# holds tensors and scalars), defaulting to none.
@torch.library.custom_op("flare::rows_gated", mutates_args=())
def rows_gated(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> torch.Tensor:
    """Batch-invariant gated activation of a few rows (torch reference on the CPU)."""
    if _interprets(x):
        return triton_rows_gated(x, gate_up, _norm(norm_squares, norm_eps))
    return _eager_gated(x, gate_up, _norm(norm_squares, norm_eps))


@rows_gated.register_kernel("cuda")
def _rows_gated_cuda(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> torch.Tensor:
    return triton_rows_gated(x, gate_up, _norm(norm_squares, norm_eps))


@rows_gated.register_fake
def _rows_gated_fake(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], gate_up.shape[0] // 2)


@torch.library.custom_op("flare::rows_linear", mutates_args=())
def rows_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batch-invariant projection of a few rows (torch reference on the CPU)."""
    norm = _norm(norm_squares, norm_eps)
    if _interprets(x):
        return triton_rows_linear(x, w, b, norm=norm, residual=residual)
    return _eager_linear(x, w, b, norm, residual)


@rows_linear.register_kernel("cuda")
def _rows_linear_cuda(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    return triton_rows_linear(x, w, b, norm=_norm(norm_squares, norm_eps), residual=residual)


@rows_linear.register_fake
def _rows_linear_fake(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])


def _rows_linear_squares(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm: RowStatistic | None,
    residual: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = x.shape[0], w.shape[0]
    squares = torch.empty(rows, n // SQUARE_GROUP, dtype=torch.float32, device=x.device)
    y = triton_rows_linear(x, w, b, norm=norm, residual=residual, squares=squares)
    return y, squares


@torch.library.custom_op("flare::rows_linear_squares", mutates_args=())
def rows_linear_squares(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows_linear`` and its result's partial squares (``group_squares``), for the
    norm of the projection that reads it (torch reference on the CPU)."""
    norm = _norm(norm_squares, norm_eps)
    if _interprets(x):
        return _rows_linear_squares(x, w, b, norm, residual)
    y = _eager_linear(x, w, b, norm, residual)
    return y, group_squares(y)


@rows_linear_squares.register_kernel("cuda")
def _rows_linear_squares_cuda(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rows_linear_squares(x, w, b, _norm(norm_squares, norm_eps), residual)


@rows_linear_squares.register_fake
def _rows_linear_squares_fake(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    norm_squares: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = x.shape[0], w.shape[0]
    return x.new_empty(rows, n), x.new_empty(rows, n // SQUARE_GROUP, dtype=torch.float32)


@torch.library.custom_op("flare::rows_split_linear", mutates_args=())
def rows_split_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Batch-invariant projection of a few rows by a narrow weight, K split (torch
    reference on the CPU)."""
    if _interprets(x):
        return triton_rows_split_linear(x, w, b)
    return F.linear(x, w, b)


@rows_split_linear.register_kernel("cuda")
def _rows_split_linear_cuda(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    return triton_rows_split_linear(x, w, b)


@rows_split_linear.register_fake
def _rows_split_linear_fake(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


@torch.library.custom_op("flare::accumulate_linear", mutates_args=("acc",))
def accumulate_linear(acc: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """``acc += x @ w.T`` in place (``acc [rows, N]``, ``x [rows, K]``, ``w [N, K]``):
    one cuBLAS GEMM with beta 1, which reads ``acc`` in its epilogue and writes the sum
    over it (``torch.addmm``'s bits). An operator of its own so that Inductor keeps the GEMM in
    place where ``acc`` has no later reader: ``torch.addmm`` into a new tensor copies
    its input there first, and a GEMM then an addition reads and writes the rows
    twice more (``accumulate_project``)."""
    acc.addmm_(x, w.t())


@accumulate_linear.register_fake
def _accumulate_linear_fake(acc: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    return None


def accumulate_project(
    acc: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``acc + linear(x)`` (``acc``: a residual the caller no longer needs). Past
    ``INVARIANT_ROWS`` rows (prefill), without a bias, the sum is computed into
    ``acc``'s storage by the GEMM itself (``accumulate_linear``; no less accurate than
    ``project``'s product then sum, whose mean error it matched on an H100) and ``acc``
    is returned; otherwise
    ``project``'s residual addition, ``acc`` untouched. In the 8B's 4,096-token
    prefill chunk on an H100 this took away the addition after down (44.7 us a layer)
    and the post-attention norm's second input (30.0 to 23.3 us), the beta-1 GEMMs as
    fast as the plain ones: the chunk took 101.5 ms against 105.2
    (``bench/results/issue23/2026-12-06k-h100-prefill-accumulate/``)."""
    rows, n = _rows(x), weight.shape[0]
    if rows <= INVARIANT_ROWS or bias is not None or not acc.is_contiguous():
        return project(x, weight, bias, residual=acc)
    accumulate_linear(acc.view(rows, n), x.reshape(rows, x.shape[-1]), weight)
    return acc


def project(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm: RowStatistic | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + linear(norm(x))`` over the last dimension (norm and residual
    optional), batch-invariant in one kernel when it has few rows."""
    rows = _rows(x)
    if rows > INVARIANT_ROWS:
        return _eager_linear(x, weight, bias, norm, residual)
    out_shape = (*x.shape[:-1], weight.shape[0])
    flat = rows_linear(
        x.reshape(rows, x.shape[-1]),
        weight,
        bias,
        *_norm_args(norm),
        None if residual is None else residual.reshape(rows, weight.shape[0]),
    )
    return flat.view(out_shape)


def project_squares(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    norm: RowStatistic | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``project`` of at most ``INVARIANT_ROWS`` rows ``x [rows, K]`` and the result's
    partial squares ``[rows, N // SQUARE_GROUP]`` (float32), from the same kernel: the
    statistic of the RMSNorm that reads the result (``RowStatistic``)."""
    if x.dim() != 2 or x.shape[0] > INVARIANT_ROWS:
        raise ValueError(
            f"partial squares come from the batch-invariant kernel: at most "
            f"{INVARIANT_ROWS} rows [rows, K], not {tuple(x.shape)}"
        )
    return rows_linear_squares(x, weight, bias, *_norm_args(norm), residual)


def gated_project(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    act_fn: Callable[[torch.Tensor], torch.Tensor],
    norm: RowStatistic | None = None,
) -> torch.Tensor:
    """``act_fn(gate) * up`` of the packed ``gate_up`` projection over the last
    dimension, of ``norm(x)`` when a norm is given. Few rows: one batch-invariant
    kernel, whose activation is SiLU (the caller's ``act_fn`` must be); more: cuBLAS,
    then ``act_fn`` and the product."""
    rows = _rows(x)
    if rows > INVARIANT_ROWS:
        return _eager_gated(x, gate_up, norm, act_fn)
    flat = rows_gated(x.reshape(rows, x.shape[-1]), gate_up, *_norm_args(norm))
    return flat.view(*x.shape[:-1], gate_up.shape[0] // 2)


# A constant of the shapes and the device: Dynamo calls it rather than tracing it.
@torch._dynamo.assume_constant_result
def fills_the_device(n: int, k: int, device: torch.device, itemsize: int = 2) -> bool:
    """Whether the fixed-tile kernel's grid for an ``n`` x ``k`` weight gives at least
    half the device's SMs a program (the interpreter's one SM: always): one that does
    not gets 16-column tiles from ``tile_shape``, counted here at 32 (its
    ``narrowest``), as the K split's routing was measured."""
    sms = _sm_count(device)
    width, _ = tile_shape(n, k, sms, itemsize, narrowest=TILE_WIDTHS[-1])
    return 2 * triton.cdiv(n, width) >= sms


def invariant_project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, batch-invariant per row for at most
    ``INVARIANT_ROWS`` rows: K split (``rows_split_linear``) where the fixed-tile
    kernel would not fill the device, else ``project`` (that kernel; cuBLAS as it is
    for more rows)."""
    n, k = weight.shape
    rows = _rows(x)
    if rows <= INVARIANT_ROWS and not fills_the_device(n, k, x.device, weight.element_size()):
        flat = rows_split_linear(x.reshape(rows, k), weight, bias)
        return flat.view(*x.shape[:-1], n)
    return project(x, weight, bias)


class ProjectedLinear(nn.Linear):
    """An ``nn.Linear`` that projects through ``invariant_project``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return invariant_project(input, self.weight, self.bias)


def project_linears(root: nn.Module) -> int:
    """Makes every plain ``nn.Linear`` under ``root`` a ``ProjectedLinear`` (in place:
    its parameters, their names and its attributes stay); how many."""
    count = 0
    for module in root.modules():
        if type(module) is nn.Linear:
            module.__class__ = ProjectedLinear
            count += 1
    return count
