"""A decode layer of a small dense model in one persistent kernel: its six phases
separated by grid barriers instead of kernel boundaries (an experiment, measured by
``bench/persistent_layer_bench.py``; served under ``--decode-fusion persistent``,
which "auto" never picks: on the H200 SmolLM2's 30 layers took 1.22x the kernel
chain's time as a kernel a layer and 1.29x as one kernel, a barrier costing about
0.65 us more than a programmatic boundary; ``bench/results/issue23/
2026-12-05c-h200-persistent``).

SmolLM2-135M's decode step is latency-bound: each of a layer's kernels (qkv, the
attention split with the rotary write, its merge, o, gate/up, down) takes 2.6 to
4.4 us on the H200 for 0.7 to 3.5 MB of weights (``bench/results/issue23/
2026-12-05b-h200-head``). Here one program per SM (at most as many as the largest
phase has tiles) walks the phases in order:

0. ``qkv``: the packed projection of the rows normalized (the statistic from the
   partial squares the layer before left, its gain folded into the weight);
1. ``split``: decode attention's split, finishing the queries and writing the
   token's K/V first (``triton_attention._split_tile``);
2. ``merge``: the splits merged (``_combine_tile``);
3. ``o``: the o projection plus the residual, and the result's partial squares;
4. ``gate/up``: the gated projection of that result normalized;
5. ``down``: the down projection plus the residual, and its partial squares,

each phase's tiles dealt out round-robin, and a grid barrier between phases. Every
tile is the per-kernel chain's own code (``linear._linear_tile``, ``_gated_tile``,
``triton_attention._split_tile``, ``_combine_tile``) on the chain's tiles, so a
row's arithmetic is the chain's and never depends on its batch. One difference:
the whole kernel compiles without floating-point contraction, which the projections
that write partial squares need (``linear._group_squares``), so on the GPU the
attention phases may round differently from the chain's kernels (the interpreter
never contracts, and there the two agree bit for bit).

The barrier (``_grid_barrier``) is a count and a generation in one state buffer:
every program adds one to the count; the last to arrive resets it and bumps the
generation, which the others wait on. The state is back at count zero after every
barrier, so a captured graph replays it with no reset node. The programs must all
be resident at once: the grid is at most one program per SM, and the kernel fits
an SM. With programmatic launch, the kernel after may launch once every program
has started (``programmatic_launch``), so it never takes an SM a program of this
one is waiting for. Two such kernels must never run at once (each could hold SMs
the other's programs wait for): Helios runs a core's graphs on one stream.

The kernel also runs a step's layers one after another in one launch
(``triton_persistent_step``: each weight's layers by a table of addresses, their
caches one tensor, the rows through two buffers in turn, a barrier between layers
as between phases): a decode step's layers in one kernel.

Triton's interpreter runs programs one after another, so no barrier can work
there: ``by_phase`` launches the same kernel once per layer and phase
(``PHASE``), the kernel boundary standing in for the barrier; the tests run it so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components import linear
from ignition.components.l2_prefetch import prefetch_l2
from ignition.components.programmatic_launch import await_producer, kernel_options
from ignition.components.triton_attention import (
    DEFAULT_NUM_SPLITS,
    _combine_tile,
    _split_tile,
)

PHASES = ("qkv", "split", "merge", "o", "gate/up", "down")
# The grid barrier's state: int32 words, the count first and the generation at
# GENERATION, 128 bytes on.
STATE_WORDS = 64
GENERATION = tl.constexpr(32)
# The interpreter's stand-in for the SM count: a few programs, so that the tests
# deal several tiles to each and a phase's tiles to programs that are not first.
INTERPRETER_PROGRAMS = 3


class LayerWeights(NamedTuple):
    """A decoder layer's decode weights: the packed ``qkv [(heads + 2 * kv_heads) *
    head_dim, hidden]`` (the input norm's gain folded in), ``o [hidden, heads *
    head_dim]``, the packed ``gate_up [2 * intermediate, hidden]`` (the
    post-attention norm's gain folded in), ``down [hidden, intermediate]``, and the
    q/k norms' gains (both or neither)."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None


class LayerStep(NamedTuple):
    """A decode step's attention inputs for one layer: its cache ``kv [2, pages,
    page_size, kv_heads, head_dim]`` (contiguous), ``page_tables int32 [rows,
    max_pages]``, ``seq_lens int32 [rows]``, each row's flat cache row ``rows``
    (int64) and rotary rows ``cos``/``sin [rows, head_dim]``."""

    kv: torch.Tensor
    page_tables: torch.Tensor
    seq_lens: torch.Tensor
    rows: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class LayerShape(NamedTuple):
    """What the kernel is specialized on besides the tensors' shapes: the heads, the
    norms' epsilons, attention's scale and splits, and each projection's tile
    (``BLOCK_N``, ``BLOCK_K``; the gated one's ``BLOCK_N`` per half)."""

    heads: int
    eps: float
    norm_eps: float
    scale: float
    num_splits: int
    tiles: dict[str, tuple[int, int]]


@triton.jit
def load_acquire(ptr):
    """A 32-bit load with acquire semantics at GPU scope (every thread loads)."""
    return tl.inline_asm_elementwise(
        "ld.acquire.gpu.global.u32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _grid_barrier(state_ptr, programs):
    """Waits until all ``programs`` programs have arrived; each program's writes
    before it are visible to every program after it. ``state_ptr``: the count (zero
    between barriers) in its first int32, the generation ``GENERATION`` words on, in
    another 128-byte line (the waiting programs poll it while the others arrive)."""
    tl.debug_barrier()  # the program's writes are done
    generation = load_acquire(state_ptr + GENERATION)
    tl.debug_barrier()  # every thread holds the generation before the program arrives
    arrived = tl.atomic_add(state_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == programs - 1:
        tl.atomic_xchg(state_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(state_ptr + GENERATION, 1, sem="release", scope="gpu")
    else:
        seen = load_acquire(state_ptr + GENERATION)
        while seen == generation:
            seen = load_acquire(state_ptr + GENERATION)
    tl.debug_barrier()


@triton.jit
def _phase_end(state_ptr, programs, PHASE: tl.constexpr):
    """The barrier after a phase when the kernel runs them all (``PHASE`` -1)."""
    if PHASE < 0:
        _grid_barrier(state_ptr, programs)


@triton.jit
def _prefetch_tiles(w_ptr, pid, programs, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Bulk L2 prefetches of the weight rows of this program's tiles of a phase
    (``BLOCK_N`` rows of ``w [N, K]`` each, 16-bit elements; contiguous)."""
    lanes: tl.constexpr = tl.extra.cuda.num_threads()
    tile_bytes: tl.constexpr = BLOCK_N * K * 2
    piece: tl.constexpr = (tile_bytes // lanes + 15) // 16 * 16
    base = w_ptr.to(tl.pointer_type(tl.int8))
    for t in range(pid, tl.cdiv(N, BLOCK_N), programs):
        rows = tl.minimum(N - t * BLOCK_N, BLOCK_N)
        prefetch_l2(base + t.to(tl.int64) * tile_bytes, rows * K * 2, piece, lanes)


@triton.jit
def _weight(ptr, i, dtype: tl.constexpr, STACKED: tl.constexpr):
    """Layer ``i``'s weight: ``ptr`` itself, or when ``STACKED`` the address at
    ``ptr[i]`` (a table of int64 addresses, each 16-byte aligned)."""
    if STACKED:
        out = tl.multiple_of(tl.load(ptr + i).to(tl.pointer_type(dtype)), 16)
    else:
        out = ptr
    return out


@triton.jit
def _prefetch_layer(wqkv, wo, wgu, wd, pid, programs, HIDDEN: tl.constexpr,
                    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    INTER: tl.constexpr, QKV_N: tl.constexpr, O_N: tl.constexpr,
                    GU_N: tl.constexpr, DOWN_N: tl.constexpr):  # fmt: skip
    """Bulk L2 prefetches of this program's weight tiles of one layer."""
    _prefetch_tiles(wqkv, pid, programs, (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, QKV_N)
    _prefetch_tiles(wo, pid, programs, HIDDEN, HEADS * HEAD_DIM, O_N)
    _prefetch_tiles(wgu, pid, programs, INTER, HIDDEN, GU_N)
    _prefetch_tiles(wgu + INTER * HIDDEN, pid, programs, INTER, HIDDEN, GU_N)
    _prefetch_tiles(wd, pid, programs, HIDDEN, INTER, DOWN_N)


@triton.jit
def _persistent_layer_kernel(
    x_ptr, s_ptr, wqkv_tab, qkv_ptr, q_ptr, kv_base, pt_ptr, seq_ptr, pm_ptr, pl_ptr,
    pa_ptr, qw_tab, kw_tab, cos_ptr, sin_ptr, rows_ptr, attn_ptr, wo_tab, h_ptr, hs_ptr,
    wgu_tab, act_ptr, wd_tab, y_base, ys_base, state_ptr, M, stride_kv, stride_pt, eps,
    norm_eps, qk_scale, first, layers, stride_layer,
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, INTER: tl.constexpr, PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
    NORM_IN: tl.constexpr, HAS_NORM: tl.constexpr, UPCAST: tl.constexpr,
    ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr, QKV_N: tl.constexpr,
    QKV_K: tl.constexpr, O_N: tl.constexpr, O_K: tl.constexpr, GU_N: tl.constexpr,
    GU_K: tl.constexpr, DOWN_N: tl.constexpr, DOWN_K: tl.constexpr,
    GROUPS_HIDDEN: tl.constexpr, GROUPS_HEADS: tl.constexpr, PHASE: tl.constexpr = -1,
    STACKED: tl.constexpr = False, PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    """Layers ``first`` to ``first + layers - 1``, each's phases (module docstring)
    for rows ``M`` (contiguous tensors; the strides follow from the constexpr
    shapes), all of them with a barrier after each but the very last (``PHASE``
    -1), or phase ``PHASE`` alone. One layer: the weight pointers themselves and
    its cache ``kv_base``, its output at ``y_base``/``ys_base``. ``STACKED``: the
    weights' ``*_tab`` are tables of each layer's address, layer i's cache
    ``stride_layer`` elements on from ``kv_base``, and the layers read and write
    their rows in turn through two buffers at ``y_base``/``ys_base`` (layer i's
    output in buffer i % 2; the first's input x). ``*_N``/``*_K``: each projection's
    tile. With ``PREFETCH`` (all phases only), a program first prefetches into L2
    the weight rows of all its tiles of the first layer (no kernel of a step writes
    a weight, so before the wait for the kernel before), then at each layer's start
    those of the next."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    if PREFETCH:
        _prefetch_layer(
            _weight(wqkv_tab, first, dtype, STACKED), _weight(wo_tab, first, dtype, STACKED),
            _weight(wgu_tab, first, dtype, STACKED), _weight(wd_tab, first, dtype, STACKED),
            pid, programs, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, QKV_N, O_N, GU_N, DOWN_N,
        )  # fmt: skip
    if PDL:
        await_producer()
    group: tl.constexpr = HEADS // KV_HEADS
    qkv_cols: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    attn_cols: tl.constexpr = HEADS * HEAD_DIM
    row_blocks = tl.cdiv(M, ROW_TILES * BLOCK_M)
    last = first + layers - 1
    for i in range(first, first + layers):
        wqkv_ptr = _weight(wqkv_tab, i, dtype, STACKED)
        wo_ptr = _weight(wo_tab, i, dtype, STACKED)
        wgu_ptr = _weight(wgu_tab, i, dtype, STACKED)
        wd_ptr = _weight(wd_tab, i, dtype, STACKED)
        qw_ptr = _weight(qw_tab, i, dtype, STACKED and HAS_NORM)
        kw_ptr = _weight(kw_tab, i, dtype, STACKED and HAS_NORM)
        if PREFETCH and STACKED:
            if i < last:
                n = i + 1
                _prefetch_layer(
                    _weight(wqkv_tab, n, dtype, True), _weight(wo_tab, n, dtype, True),
                    _weight(wgu_tab, n, dtype, True), _weight(wd_tab, n, dtype, True), pid,
                    programs, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, QKV_N, O_N, GU_N, DOWN_N,
                )  # fmt: skip
        kv_ptr = kv_base + stride_layer.to(tl.int64) * i  # past 2^31 elements in all
        y_ptr = y_base + (i % 2) * M * HIDDEN
        ys_ptr = ys_base + (i % 2) * M * (HIDDEN // 16)
        if i == 0:
            in_ptr = x_ptr
            in_s = s_ptr
        else:
            in_ptr = y_base + ((i - 1) % 2) * M * HIDDEN
            in_s = ys_base + ((i - 1) % 2) * M * (HIDDEN // 16)
        _layer_phases(
            in_ptr, in_s, wqkv_ptr, qkv_ptr, q_ptr, kv_ptr, pt_ptr, seq_ptr, pm_ptr, pl_ptr,
            pa_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, rows_ptr, attn_ptr, wo_ptr, h_ptr,
            hs_ptr, wgu_ptr, act_ptr, wd_ptr, y_ptr, ys_ptr, state_ptr, M, stride_kv,
            stride_pt, eps, norm_eps, qk_scale, pid, programs, row_blocks, i < last, HIDDEN,
            HEADS, KV_HEADS, HEAD_DIM, INTER, PAGE_SIZE, NUM_SPLITS, BLOCK_H, BLOCK_S,
            NORM_IN, HAS_NORM, UPCAST, ROW_TILES, BLOCK_M, QKV_N, QKV_K, O_N, O_K, GU_N, GU_K,
            DOWN_N, DOWN_K, GROUPS_HIDDEN, GROUPS_HEADS, PHASE, group, qkv_cols, attn_cols,
        )  # fmt: skip


@triton.jit
def _layer_phases(
    x_ptr, s_ptr, wqkv_ptr, qkv_ptr, q_ptr, kv_ptr, pt_ptr, seq_ptr, pm_ptr, pl_ptr,
    pa_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, rows_ptr, attn_ptr, wo_ptr, h_ptr, hs_ptr,
    wgu_ptr, act_ptr, wd_ptr, y_ptr, ys_ptr, state_ptr, M, stride_kv, stride_pt, eps,
    norm_eps, qk_scale, pid, programs, row_blocks, more,
    HIDDEN: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, INTER: tl.constexpr, PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr,
    NORM_IN: tl.constexpr, HAS_NORM: tl.constexpr, UPCAST: tl.constexpr,
    ROW_TILES: tl.constexpr, BLOCK_M: tl.constexpr, QKV_N: tl.constexpr,
    QKV_K: tl.constexpr, O_N: tl.constexpr, O_K: tl.constexpr, GU_N: tl.constexpr,
    GU_K: tl.constexpr, DOWN_N: tl.constexpr, DOWN_K: tl.constexpr,
    GROUPS_HIDDEN: tl.constexpr, GROUPS_HEADS: tl.constexpr, PHASE: tl.constexpr,
    group: tl.constexpr, qkv_cols: tl.constexpr, attn_cols: tl.constexpr,
):  # fmt: skip
    """One layer's six phases, a barrier after each (after the last only where
    ``more`` layers follow) when ``PHASE`` is -1; else phase ``PHASE`` alone."""
    if PHASE < 0 or PHASE == 0:
        col_tiles = tl.cdiv(qkv_cols, QKV_N)
        for t in range(pid, row_blocks * col_tiles, programs):
            linear._linear_tile(
                x_ptr, wqkv_ptr, wqkv_ptr, s_ptr, x_ptr, qkv_ptr, qkv_ptr, M, qkv_cols,
                HIDDEN, HIDDEN, HIDDEN, HIDDEN // 16, HIDDEN, qkv_cols, qkv_cols, eps,
                t // col_tiles, t % col_tiles, False, NORM_IN, False, False, ROW_TILES,
                BLOCK_M, QKV_N, QKV_K, GROUPS_HIDDEN, False, 0,
            )  # fmt: skip
        _phase_end(state_ptr, programs, PHASE)

    if PHASE < 0 or PHASE == 1:
        per_row: tl.constexpr = KV_HEADS * NUM_SPLITS
        for t in range(pid, M * per_row, programs):
            b = t // per_row
            kvh = (t % per_row) // NUM_SPLITS
            split = t % NUM_SPLITS
            _split_tile(
                q_ptr, kv_ptr, pt_ptr, seq_ptr, pm_ptr, pl_ptr, pa_ptr, qk_scale,
                attn_cols, HEAD_DIM, 1, stride_kv, PAGE_SIZE * KV_HEADS * HEAD_DIM,
                KV_HEADS * HEAD_DIM, HEAD_DIM, 1, stride_pt, 1, HEADS * NUM_SPLITS,
                NUM_SPLITS, 1, HEADS * NUM_SPLITS * HEAD_DIM, NUM_SPLITS * HEAD_DIM,
                HEAD_DIM, 1, qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, rows_ptr, norm_eps,
                qkv_cols, HEAD_DIM, b, kvh, split, KV_HEADS, group, BLOCK_H, HEAD_DIM,
                PAGE_SIZE, NUM_SPLITS, UPCAST, True, HEADS, HAS_NORM,
            )  # fmt: skip
        _phase_end(state_ptr, programs, PHASE)

    if PHASE < 0 or PHASE == 2:
        for t in range(pid, M * HEADS, programs):
            _combine_tile(
                pm_ptr, pl_ptr, pa_ptr, attn_ptr, HEADS * NUM_SPLITS, NUM_SPLITS, 1,
                HEADS * NUM_SPLITS * HEAD_DIM, NUM_SPLITS * HEAD_DIM, HEAD_DIM, 1, attn_cols,
                HEAD_DIM, 1, t // HEADS, t % HEADS, HEAD_DIM, NUM_SPLITS, BLOCK_S,
            )  # fmt: skip
        _phase_end(state_ptr, programs, PHASE)

    if PHASE < 0 or PHASE == 3:
        col_tiles = tl.cdiv(HIDDEN, O_N)
        for t in range(pid, row_blocks * col_tiles, programs):
            linear._linear_tile(
                attn_ptr, wo_ptr, wo_ptr, attn_ptr, x_ptr, h_ptr, hs_ptr, M, HIDDEN,
                attn_cols, attn_cols, attn_cols, attn_cols, HIDDEN, HIDDEN, HIDDEN // 16,
                eps, t // col_tiles, t % col_tiles, False, False, True, True, ROW_TILES,
                BLOCK_M, O_N, O_K, GROUPS_HEADS, False, 0,
            )  # fmt: skip
        _phase_end(state_ptr, programs, PHASE)

    if PHASE < 0 or PHASE == 4:
        col_tiles = tl.cdiv(INTER, GU_N)
        for t in range(pid, row_blocks * col_tiles, programs):
            linear._gated_tile(
                h_ptr, wgu_ptr, hs_ptr, act_ptr, M, INTER, HIDDEN, HIDDEN, HIDDEN,
                HIDDEN // 16, INTER, eps, t // col_tiles, t % col_tiles, True, ROW_TILES,
                BLOCK_M, GU_N, GU_K, GROUPS_HIDDEN, False, 0,
            )  # fmt: skip
        _phase_end(state_ptr, programs, PHASE)

    if PHASE < 0 or PHASE == 5:
        col_tiles = tl.cdiv(HIDDEN, DOWN_N)
        for t in range(pid, row_blocks * col_tiles, programs):
            linear._linear_tile(
                act_ptr, wd_ptr, wd_ptr, act_ptr, h_ptr, y_ptr, ys_ptr, M, HIDDEN, INTER,
                INTER, INTER, INTER, HIDDEN, HIDDEN, HIDDEN // 16, eps, t // col_tiles,
                t % col_tiles, False, False, True, True, ROW_TILES, BLOCK_M, DOWN_N, DOWN_K,
                1, False, 0,
            )  # fmt: skip
        if more:
            _phase_end(state_ptr, programs, PHASE)


_INTERPRETED = isinstance(_persistent_layer_kernel, InterpretedFunction)


def default_tiles(
    hidden: int, qkv_cols: int, attn_cols: int, intermediate: int, rows: int,
    device: torch.device,
) -> dict[str, tuple[int, int]]:  # fmt: skip
    """Each projection's tile as the per-kernel chain's (``linear.tile_shape``,
    ``linear.gated_tile_shape``; the gated one's width per half)."""
    sms = linear._sm_count(device)
    tiles = linear.row_tiles(rows)
    fixes = linear._step_fixes_bits()

    def shape(n: int, k: int) -> tuple[int, int]:
        return linear.tile_shape(n, k, sms, 2, tiles, fixes)

    gated_width, gated_k = linear.gated_tile_shape(2 * intermediate, hidden, sms, 2, tiles, fixes)
    return {
        "qkv": shape(qkv_cols, hidden),
        "o": shape(hidden, attn_cols),
        "gate/up": (gated_width // 2, gated_k),
        "down": shape(hidden, intermediate),
    }


def phase_tiles(rows: int, shape: LayerShape, hidden: int, kv_heads: int, head_dim: int,
                intermediate: int) -> tuple[int, ...]:  # fmt: skip
    """How many tiles each phase deals out."""
    blocks = triton.cdiv(rows, linear.row_tiles(rows) * linear.ROWS_TILE)
    t = shape.tiles
    return (
        blocks * triton.cdiv((shape.heads + 2 * kv_heads) * head_dim, t["qkv"][0]),
        rows * kv_heads * shape.num_splits,
        rows * shape.heads,
        blocks * triton.cdiv(hidden, t["o"][0]),
        blocks * triton.cdiv(intermediate, t["gate/up"][0]),
        blocks * triton.cdiv(hidden, t["down"][0]),
    )


def layer_shape(
    weights: LayerWeights, heads: int, head_dim: int, rows: int, eps: float,
    norm_eps: float = 0.0, scale: float | None = None, num_splits: int = DEFAULT_NUM_SPLITS,
    widths: dict[str, int] | None = None,
) -> LayerShape:  # fmt: skip
    """The layer's ``LayerShape``: the chain's tiles, or ``widths`` for some
    projections (every width gives the same bits on the GPU; each keeps its
    default K step where it fits, as ``triton_rows_linear`` does)."""
    hidden = weights.qkv.shape[1]
    intermediate = weights.down.shape[1]
    tiles = default_tiles(
        hidden, weights.qkv.shape[0], heads * head_dim, intermediate, rows, weights.qkv.device
    )
    ks = {"qkv": hidden, "o": heads * head_dim, "gate/up": hidden, "down": intermediate}
    for name, width in (widths or {}).items():
        per = 2 if name == "gate/up" else 1
        block_k = linear.fitted_block_k(tiles[name][1], ks[name], per * width, 2)
        tiles[name] = (width, block_k)
    return LayerShape(
        heads=heads,
        eps=eps,
        norm_eps=norm_eps,
        scale=head_dim**-0.5 if scale is None else scale,
        num_splits=num_splits,
        tiles=tiles,
    )


def _check(x: torch.Tensor, weights: LayerWeights, step: LayerStep, heads: int) -> None:
    rows, hidden = x.shape
    kv = step.kv
    kv_heads, head_dim = kv.shape[3], kv.shape[4]
    tensors = {"x": x, **weights._asdict(), **step._asdict()}
    for name, t in tensors.items():
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if rows > linear.INVARIANT_ROWS:
        raise ValueError(f"{rows} rows exceed the batch-invariant kernels' {linear.INVARIANT_ROWS}")
    if weights.qkv.shape != ((heads + 2 * kv_heads) * head_dim, hidden):
        raise ValueError(
            f"qkv {tuple(weights.qkv.shape)} does not pack {heads} and {kv_heads} heads"
        )
    if weights.o.shape != (hidden, heads * head_dim):
        raise ValueError(f"o {tuple(weights.o.shape)} is not [{hidden}, {heads * head_dim}]")
    intermediate = weights.down.shape[1]
    if weights.gate_up.shape != (2 * intermediate, hidden) or weights.down.shape[0] != hidden:
        raise ValueError(
            "gate_up must be [2 * intermediate, hidden] and down [hidden, intermediate]"
        )
    if any(w.element_size() != 2 for w in (weights.qkv, weights.o, weights.gate_up, weights.down)):
        raise ValueError("the weights must be 16-bit")
    if hidden % linear.SQUARE_GROUP:
        raise ValueError(f"the hidden size {hidden} is not a multiple of {linear.SQUARE_GROUP}")
    if (weights.q_norm is None) != (weights.k_norm is None):
        raise ValueError("q and k norms come together or not at all")
    indices = {
        "page_tables": (step.page_tables, torch.int32, 2),
        "seq_lens": (step.seq_lens, torch.int32, 1),
        "rows": (step.rows, torch.int64, 1),
    }
    for name, (t, dtype, dims) in indices.items():
        if t.dtype != dtype or t.dim() != dims or t.shape[0] != rows:
            raise ValueError(f"{name} must be {dtype} with {dims} dims and a row each")
    if step.cos.shape != (rows, head_dim) or step.sin.shape != step.cos.shape:
        raise ValueError(f"cos and sin must be [{rows}, {head_dim}]")


def _check_squares(x: torch.Tensor, squares: torch.Tensor | None) -> None:
    wanted = (x.shape[0], x.shape[1] // linear.SQUARE_GROUP)
    if squares is not None and (
        squares.shape != wanted or squares.dtype != torch.float32 or not squares.is_contiguous()
    ):
        raise ValueError(f"x's partial squares must be contiguous float32 {wanted}")


class LayerTables(NamedTuple):
    """A step's decoder layers stacked for one persistent kernel: each weight's
    per-layer addresses as int64 device tensors (built once, outside any capture:
    ``stack_layers``), and the layers themselves."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    layers: tuple[LayerWeights, ...]


def stack_layers(layers: Sequence[LayerWeights]) -> LayerTables:
    """The address tables of ``layers``, which must share shapes, dtype and device."""
    first = layers[0]
    for layer in layers:
        for name, t in layer._asdict().items():
            ref = getattr(first, name)
            if (t is None) != (ref is None) or (
                t is not None and (t.shape, t.dtype, t.device) != (ref.shape, ref.dtype, ref.device)
            ):
                raise ValueError(f"the layers' {name} differ in shape, dtype or device")
            if t is not None and (not t.is_contiguous() or t.data_ptr() % 16):
                raise ValueError(f"every layer's {name} must be contiguous and 16-byte aligned")

    def table(name: str) -> torch.Tensor | None:
        if getattr(first, name) is None:
            return None
        addresses = [getattr(layer, name).data_ptr() for layer in layers]
        return torch.tensor(addresses, dtype=torch.int64, device=first.qkv.device)

    names = ("qkv", "o", "gate_up", "down", "q_norm", "k_norm")
    return LayerTables(*(table(name) for name in names), layers=tuple(layers))


def triton_persistent_layer(
    x: torch.Tensor,
    squares: torch.Tensor | None,
    weights: LayerWeights,
    step: LayerStep,
    shape: LayerShape,
    state: torch.Tensor,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``DecodeFusedLayer``'s decode rows under ``--decode-fusion norms`` (the q/k
    norms as Qwen3's where given) in one kernel: the layer's output ``[rows,
    hidden]`` and its partial squares, from its input ``x`` and x's partial squares
    (``squares``; None: x is already normalized, the first layer's). ``state``: the
    barrier's ``STATE_WORDS`` int32, zeros the first time and its count left at zero
    (``_grid_barrier``). ``options``: ``_launch``'s."""
    return _launch(x, squares, weights, None, step.kv, step, shape, state, **options)  # type: ignore[arg-type]


def triton_persistent_step(
    x: torch.Tensor,
    squares: torch.Tensor,
    tables: LayerTables,
    kv: torch.Tensor,
    step: LayerStep,
    shape: LayerShape,
    state: torch.Tensor,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer of ``tables`` in one kernel, one after another (a barrier between
    layers as between phases): the last layer's output and its partial squares.
    ``kv [layers, 2, pages, page_size, kv_heads, head_dim]``: their caches;
    ``step``: the step's other attention inputs (its ``kv`` unused); ``squares``
    required (the first layer's input squares). ``options``: ``_launch``'s."""
    if squares is None:
        raise ValueError("a stacked step takes its input's partial squares")
    if kv.dim() != 6 or kv.shape[0] != len(tables.layers):
        raise ValueError(f"kv {tuple(kv.shape)} is not {len(tables.layers)} layers' caches")
    return _launch(
        x, squares, tables.layers[0], tables, kv, step._replace(kv=kv[0]), shape, state,
        **options,  # type: ignore[arg-type]
    )  # fmt: skip


def _launch(
    x: torch.Tensor,
    squares: torch.Tensor | None,
    weights: LayerWeights,
    tables: LayerTables | None,
    kv_base: torch.Tensor,
    step: LayerStep,
    shape: LayerShape,
    state: torch.Tensor,
    *,
    programs: int | None = None,
    by_phase: bool = False,
    num_stages: int | None = None,
    prefetch: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer (``tables`` None: ``weights``, cache ``kv_base``) or the stacked
    layers of ``tables`` (caches ``kv_base``), ``weights`` and ``step.kv`` giving
    the shapes. ``programs``: the grid (default one per SM, at most the largest
    phase's tiles); ``by_phase``: one launch per layer and phase instead of barriers
    (always under the interpreter); ``num_stages``: the K loops' pipeline (default
    the deepest that every projection's tile fits, ``linear.pipeline_stages``);
    ``prefetch``: each program's weight tiles prefetched into L2 (barriers only;
    PTX, so never under the interpreter)."""
    _check(x, weights, step, shape.heads)
    _check_squares(x, squares)
    rows, hidden = x.shape
    kv = step.kv
    kv_heads, head_dim, page_size = kv.shape[3], kv.shape[4], kv.shape[2]
    intermediate = weights.down.shape[1]
    heads, splits = shape.heads, shape.num_splits
    if state.dtype != torch.int32 or state.shape != (STATE_WORDS,):
        raise ValueError(f"the barrier's state is {STATE_WORDS} int32")
    layers = 1 if tables is None else len(tables.layers)
    qkv_cols = weights.qkv.shape[0]
    new = lambda *size, dtype=x.dtype: torch.empty(size, dtype=dtype, device=x.device)  # noqa: E731
    qkv, q = new(rows, qkv_cols), new(rows, heads, head_dim)
    part_m = new(rows, heads, splits, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = new(rows, heads, splits, head_dim, dtype=torch.float32)
    attn, h, act = new(rows, heads * head_dim), new(rows, hidden), new(rows, intermediate)
    h_squares = new(rows, hidden // linear.SQUARE_GROUP, dtype=torch.float32)
    # The layers' outputs in turn (layer i's in buffer i % 2).
    y = new(min(layers, 2), rows, hidden)
    y_squares = new(min(layers, 2), rows, hidden // linear.SQUARE_GROUP, dtype=torch.float32)
    out = (y[(layers - 1) % 2], y_squares[(layers - 1) % 2])
    if rows == 0:
        return out
    counts = phase_tiles(rows, shape, hidden, kv_heads, head_dim, intermediate)
    most = INTERPRETER_PROGRAMS if _INTERPRETED else linear._sm_count(x.device)
    if programs is None:
        programs = min(most, max(counts))
    elif programs < 1 or (programs > most and not by_phase):
        # More programs than SMs need not all be resident: a barrier would never open.
        raise ValueError(f"{programs} programs for {most} SMs")
    has_norm = weights.q_norm is not None
    source = weights if tables is None else tables
    t = shape.tiles
    args = (
        x, x if squares is None else squares, source.qkv, qkv, q, kv_base, step.page_tables,
        step.seq_lens, part_m, part_l, part_acc,
        source.q_norm if has_norm else qkv, source.k_norm if has_norm else qkv,
        step.cos, step.sin, step.rows, attn, source.o, h, h_squares, source.gate_up, act,
        source.down, y, y_squares, state, rows, kv.stride(0), step.page_tables.stride(0),
        shape.eps, shape.norm_eps, shape.scale * 1.4426950408889634,
    )  # fmt: skip
    stride_layer = 0 if tables is None else kv_base.stride(0)
    constexprs = dict(
        HIDDEN=hidden, HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim, INTER=intermediate,
        PAGE_SIZE=page_size, NUM_SPLITS=splits,
        BLOCK_H=max(16, triton.next_power_of_2(heads // kv_heads)),
        BLOCK_S=triton.next_power_of_2(splits), NORM_IN=squares is not None,
        HAS_NORM=has_norm, UPCAST=_INTERPRETED, ROW_TILES=linear.row_tiles(rows),
        BLOCK_M=linear.ROWS_TILE, QKV_N=t["qkv"][0], QKV_K=t["qkv"][1], O_N=t["o"][0],
        O_K=t["o"][1], GU_N=t["gate/up"][0], GU_K=t["gate/up"][1], DOWN_N=t["down"][0],
        DOWN_K=t["down"][1], GROUPS_HIDDEN=linear._groups(hidden),
        GROUPS_HEADS=linear._groups(heads * head_dim), STACKED=tables is not None,
    )  # fmt: skip
    if num_stages is None:  # the deepest pipeline every projection's tile fits
        tiles = linear.row_tiles(rows)
        num_stages = min(
            linear.pipeline_stages(tiles, (2 if name == "gate/up" else 1) * n, k, 2)
            for name, (n, k) in t.items()
        )
    options = dict(num_warps=4, num_stages=num_stages, enable_fp_fusion=False)
    launch = kernel_options(x.device)
    if by_phase or _INTERPRETED:
        for layer in range(layers):
            for phase in range(len(PHASES)):
                _persistent_layer_kernel[(programs,)](
                    *args, layer, 1, stride_layer, **constexprs, PHASE=phase, **options, **launch
                )
    else:
        _persistent_layer_kernel[(programs,)](
            *args, 0, layers, stride_layer, **constexprs, PREFETCH=prefetch, **options, **launch
        )
    return out


def chain_layer(
    x: torch.Tensor,
    squares: torch.Tensor | None,
    weights: LayerWeights,
    step: LayerStep,
    shape: LayerShape,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same layer as the per-kernel chain serving runs under ``--decode-fusion
    norms`` (``recipes.llama.DecodeFusedLayer``): a kernel a phase, on the tiles of
    ``shape``. The reference of the tests and the bench's baseline."""
    from ignition.components.triton_attention import RopeInputs, triton_paged_decode_attention_rope

    rows, hidden = x.shape
    t = shape.tiles
    norm = None if squares is None else linear.RowStatistic(squares, shape.eps)
    qkv = linear.triton_rows_linear(x, weights.qkv, None, *t["qkv"], norm=norm)
    rope = RopeInputs(
        qkv, weights.q_norm, weights.k_norm, shape.norm_eps, step.cos, step.sin, step.rows
    )
    attn = triton_paged_decode_attention_rope(
        rope, step.kv, step.page_tables, step.seq_lens, shape.scale, shape.heads,
        num_splits=shape.num_splits,
    )  # fmt: skip
    h_squares = x.new_empty(rows, hidden // linear.SQUARE_GROUP, dtype=torch.float32)
    h = linear.triton_rows_linear(
        attn.reshape(rows, -1), weights.o, None, *t["o"], residual=x, squares=h_squares
    )
    act = linear.triton_rows_gated(h, weights.gate_up, linear.RowStatistic(h_squares, shape.eps))
    y_squares = torch.empty_like(h_squares)
    y = linear.triton_rows_linear(
        act, weights.down, None, *t["down"], residual=h, squares=y_squares
    )
    return y, y_squares


# The serving operator: a decode step's layers in one persistent kernel on CUDA;
# elsewhere (the CPU tests) the norms fusion's composition of the operators, layer
# after layer, which computes the same (``recipes.llama.DecodeFusedLayer``).
@torch.library.custom_op("flare::persistent_step", mutates_args=("kv", "state"))
def persistent_step(
    x: torch.Tensor,
    squares: torch.Tensor,
    qkv: list[torch.Tensor],
    o: list[torch.Tensor],
    gate_up: list[torch.Tensor],
    down: list[torch.Tensor],
    q_norm: list[torch.Tensor],
    k_norm: list[torch.Tensor],
    tables: list[torch.Tensor],
    kv: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    state: torch.Tensor,
    heads: int,
    eps: float,
    norm_eps: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer of a decode step, layer ``i`` ``y = h + down(silu(gate) * up)``
    with ``h = x + o(attention)`` of its input rows normalized by their partial
    squares (the gains folded into ``qkv[i]`` and ``gate_up[i]``; ``q_norm``/
    ``k_norm``: each layer's, or empty lists), writing each row's newest K/V to
    ``kv[i]``; returns the last layer's output and its partial squares. ``tables``:
    ``stack_layers``' address tables of the same weights (qkv, o, gate/up, down,
    then the q and k norms' where given), built once; ``state``: the grid
    barrier's (``STATE_WORDS`` int32, zeros)."""
    from ignition.components.kv_cache import rope_decode_attention

    h_in, s_in = x, squares
    for i in range(len(qkv)):
        norms = (q_norm[i], k_norm[i]) if q_norm else (None, None)
        projected = linear.project(h_in, qkv[i], norm=linear.RowStatistic(s_in, eps))
        attn = rope_decode_attention(
            kv, i, projected, *norms, norm_eps, cos, sin, rows, heads, page_tables, seq_lens,
            scale,
        )  # fmt: skip
        h, h_squares = linear.project_squares(attn.reshape(x.shape[0], -1), o[i], residual=h_in)
        act = linear.gated_project(h, gate_up[i], F.silu, linear.RowStatistic(h_squares, eps))
        h_in, s_in = linear.project_squares(act, down[i], residual=h)
    return h_in, s_in


@persistent_step.register_kernel("cuda")
def _persistent_step_cuda(
    x: torch.Tensor,
    squares: torch.Tensor,
    qkv: list[torch.Tensor],
    o: list[torch.Tensor],
    gate_up: list[torch.Tensor],
    down: list[torch.Tensor],
    q_norm: list[torch.Tensor],
    k_norm: list[torch.Tensor],
    tables: list[torch.Tensor],
    kv: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    state: torch.Tensor,
    heads: int,
    eps: float,
    norm_eps: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    norms = [(q_norm[i], k_norm[i]) if q_norm else (None, None) for i in range(len(qkv))]
    layers = tuple(
        LayerWeights(qkv[i], o[i], gate_up[i], down[i], *norms[i]) for i in range(len(qkv))
    )
    stacked = LayerTables(*tables[:4], *(tables[4:] if q_norm else (None, None)), layers=layers)
    step = LayerStep(kv[0], page_tables, seq_lens, rows, cos, sin)
    shape = layer_shape(layers[0], heads, kv.shape[-1], x.shape[0], eps, norm_eps, scale)
    return triton_persistent_step(x, squares, stacked, kv, step, shape, state)


@persistent_step.register_fake
def _persistent_step_fake(
    x: torch.Tensor,
    squares: torch.Tensor,
    qkv: list[torch.Tensor],
    o: list[torch.Tensor],
    gate_up: list[torch.Tensor],
    down: list[torch.Tensor],
    q_norm: list[torch.Tensor],
    k_norm: list[torch.Tensor],
    tables: list[torch.Tensor],
    kv: torch.Tensor,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    state: torch.Tensor,
    heads: int,
    eps: float,
    norm_eps: float,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(squares)
