"""Triton kernels for paged attention over the serving KV cache.

Storage contract (fixed by the recipe): one layer's cache is
``kv[2, num_pages, page_size, num_kv_heads, head_dim]`` (``kv[0]`` keys, ``kv[1]`` values);
a request's token at absolute position ``p`` lives in page ``page_table[p // page_size]``,
row ``p % page_size``. Page 0 is a reserved null page that padded work may point at.

These kernels are replayed inside CUDA graphs with new metadata each step, so everything
that varies per step (sequence lengths, chunk start, valid-token count, page tables) is
read from device tensors inside the kernels; the launch grid and every constexpr depend
only on tensor shapes. Nothing here calls ``.item()`` or allocates a data-dependent shape.

Decode is split-KV ("flash decoding"): ``_decode_split_kernel`` runs each row's pages in
NUM_SPLITS contiguous ranges and writes fp32 partial softmaxes, ``_decode_combine_kernel``
merges them. (Merging in the split's last program instead, counted by an atomic, was
measured on the H200: the split kernel took 8.2 us a layer of the 8B at c=1, against
3.4 + 2.0 us for the two kernels; ``bench/results/issue23/2026-12-05-h200-changes``.)

Prefill has two paths over the same keys: ``_prefill_kernel``, where one
program per (token tile, kv head) walks the tile's whole context and normalises in place,
and, for short chunks after a long history (too few tiles to fill the GPU), the split-KV
pair ``_prefill_split_kernel`` + ``_prefill_combine_kernel``.

A long chunk can take its attention in two parts instead
(``triton_paged_prefill_attention_rope``, where ``two_parts_apply``): within the
chunk, causal, by a library kernel over the chunk's finished keys and values (the
rotary write leaves them beside the queries; ``_chunk_attention``: cuDNN's on CUDA),
and over the history before it by ``_prefill_history_kernel``, which merges its
partial softmax into the library's output in place through the library's
log-sum-exp. One graph serves every history: with none, the history kernel reads
nothing and leaves the chunk's rows as they are. PyTorch's flash kernel, the first
library tried, lost at every history on an H100: 0.504 ms for a 4,096-token chunk of
the 8B's heads with no history, against 0.394 for this kernel with the rotary write;
cuDNN's took 0.257 on the same operands, within 0.0039 of flash's output and 1.9e-6
of its log-sum-exp (``bench/results/issue23/2026-12-07i-h100-two-parts/``; the 8B's
core with flash's kernel exported and qualified bitwise, so a library kernel serves
from a runtime core). Off (``TWO_PARTS_MIN_TOKENS``) until cuDNN's two parts are
measured as a whole: the history kernel alone runs a little below the one kernel's
rate, so after long histories the two parts may still lose about 5%.

All kernels work in the log2 domain (``exp2`` of the scores times ``scale * log2(e)``),
accumulate in fp32, and cast the softmax probabilities to the cache dtype for the P @ V
product. Decode scales the scores before their row maxima; prefill keeps the dot's raw
scores, scales their row maxima after the max (the scale is positive: the same value)
and applies the scale inside ``exp2``'s argument, ``exp2(s * qk_scale - m)``, one fused
multiply-add an element (measured 1.2 to 3.4% faster on an H100 than scaling the scores
first, ``bench/results/issue23/2026-12-06j-h100-fold-tma/``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.programmatic_launch import await_producer, kernel_options
from ignition.components.triton_kv_write import _norm_rope, _write_kv
from ignition.components.triton_support import fix_interpreter_loop_bounds

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)

# Default number of KV splits per (row, kv head) in decode: with 8 kv heads, 16 splits
# give 128 programs for a single request, about one per SM on an H200 (132 SMs).
DEFAULT_NUM_SPLITS = 16
# Query rows (token x head-in-group pairs) per prefill program. 64 keeps the fp32
# accumulator at 64 registers per thread for head_dim 128 with 4 warps, and gives small
# chunks (T=128) more programs than 128-row tiles would.
DEFAULT_PREFILL_ROWS = 64
# Split-KV prefill: aim for about eight programs per SM (132 SMs on an H200). A short
# chunk after a long history has few token tiles, each walking the whole context
# serially; splitting the pages fills the GPU and shortens each walk. The split count
# is fixed per captured chunk size and serves every history, so it is set for long
# ones, where the time is: on the H200 (bench/prefill_attention_bench.py,
# bench/results/issue5/2026-11-30c-two-gpus/attention-bench/), Qwen3-8B's chunks of
# 128 and 512 tokens after 32K positions were fastest at 16 and 4 splits (0.087 and
# 0.581 ms, against 0.163 and 0.737 at the 2 per SM target's 5 and 2), and SmolLM2's
# at 16-32 and 4-16; 1,024 programs give 16, 4, 16 and 11. Capped because the fp32
# partials grow with the split count and the combine pass reads them all. A grid of at
# least this many (tile, kv head) programs runs the plain kernel (one split).
PREFILL_TARGET_PROGRAMS = 1024
MAX_PREFILL_SPLITS = 16
# Chunk tokens per program of the prefill combine (one query head each).
PREFILL_COMBINE_TOKENS = 16
# tl.dot needs every operand dimension to be at least 16.
_MIN_DOT = 16


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """``tl.dot`` with fp32 accumulation. UPCAST (interpreter only) feeds it fp32 copies:
    the interpreter multiplies bfloat16's raw uint16 storage (unsupported upstream,
    triton-lang/triton#11584). bf16 x bf16 products are exact in fp32, so the numbers
    match the tensor-core dot up to summation order."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _newest_page_split(num_pages, per_split):
    """The split whose page range holds a row's last page, where its newest token
    (position seq_len - 1) lies; split 0 for a padding row (no pages)."""
    return tl.maximum(num_pages - 1, 0) // tl.maximum(per_split, 1)


@triton.jit
def _rope_group(
    qkv_row,
    q_w_ptr,
    k_w_ptr,
    cos_row,
    sin_row,
    row_ptr,
    eps,
    q_dst,
    stride_qh,
    kv_head,
    stride_kv,
    stride_kvp,
    stride_kvs,
    writes,
    kvh,
    kv_heads,
    GROUP: tl.constexpr,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """The packed projection of one row finished for kv head ``kvh`` (of
    ``kv_heads``), as ``triton_kv_write`` finishes it (the same arithmetic, so the
    same bits): its
    GROUP query heads normalized and rotated to ``q_dst`` (every split of the group
    stores the same bytes there and reads back its own), and, where ``writes``, its
    keys normalized and rotated and its values written to the row's cache row (zeros
    in the null page), before this program reads that page. A barrier orders the
    program's reads after its writes."""
    half: tl.constexpr = HEAD_DIM // 2
    BLOCK: tl.constexpr = triton.next_power_of_2(half)
    offs = tl.arange(0, BLOCK)[None, :]
    ok = offs < half
    for g in tl.static_range(GROUP):
        h = kvh * GROUP + g
        src = qkv_row + h * HEAD_DIM
        o1, o2 = _norm_rope(src, q_w_ptr, cos_row, sin_row, eps, offs, ok, HEAD_DIM, HAS_NORM)
        tl.store(q_dst + g * stride_qh + offs, o1, mask=ok)
        tl.store(q_dst + g * stride_qh + half + offs, o2, mask=ok)
    if writes:
        row = tl.load(row_ptr).to(tl.int64)
        k_dst = kv_head + (row // PAGE_SIZE) * stride_kvp + (row % PAGE_SIZE) * stride_kvs
        _write_kv(
            qkv_row + (HEADS + kvh) * HEAD_DIM,
            qkv_row + (HEADS + kv_heads + kvh) * HEAD_DIM,
            k_w_ptr, cos_row, sin_row, eps, row, k_dst, k_dst + stride_kv, offs, ok,
            HEAD_DIM, PAGE_SIZE, HAS_NORM,
        )  # fmt: skip
    tl.debug_barrier()


@triton.jit
def _split_tile(
    q_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
    qk_scale, stride_qb, stride_qh, stride_qd, stride_kv, stride_kvp, stride_kvs,
    stride_kvh, stride_kvd, stride_ptb, stride_ptp, stride_mb, stride_mh, stride_ms,
    stride_ab, stride_ah, stride_as, stride_ad, qkv_ptr, q_w_ptr, k_w_ptr, cos_ptr,
    sin_ptr, rows_ptr, eps, stride_t, stride_cos, b, kvh, split, kv_heads,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr,
    ROPE: tl.constexpr, HEADS: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """Row ``b``, kv head ``kvh`` (of ``kv_heads``), split ``split``: all query heads
    of the kv-head group against a contiguous range of that row's pages; writes
    unnormalised partial results. A program of ``_decode_split_kernel``, or one tile
    of a persistent kernel's phase. With ``ROPE``, the row's packed projection
    ``qkv`` is finished here first (``_rope_group``): q_ptr is where the group's
    queries go."""
    # The split's page range depends only on this row's seq_len and NUM_SPLITS, never
    # on the batch size: that is what makes the output batch invariant.
    seq_len = tl.load(seq_lens_ptr + b)
    num_pages = tl.cdiv(seq_len, PAGE_SIZE)
    per_split = tl.cdiv(num_pages, NUM_SPLITS)
    page_lo = split * per_split
    page_hi = tl.minimum(page_lo + per_split, num_pages)
    if ROPE:
        writes = split == _newest_page_split(num_pages, per_split)
        _rope_group(
            qkv_ptr + b * stride_t, q_w_ptr, k_w_ptr, cos_ptr + b * stride_cos,
            sin_ptr + b * stride_cos, rows_ptr + b, eps,
            q_ptr + b * stride_qb + kvh * GROUP * stride_qh, stride_qh,
            kv_ptr + kvh * stride_kvh, stride_kv, stride_kvp, stride_kvs, writes, kvh,
            kv_heads, GROUP, HEADS, HEAD_DIM, PAGE_SIZE, HAS_NORM,
        )  # fmt: skip

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_s = tl.arange(0, PAGE_SIZE)
    head_ok = offs_h < GROUP
    heads = kvh * GROUP + offs_h

    # Padding rows of the group are loaded as zeros and never stored.
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=head_ok[:, None],
        other=0.0,
    )

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)

    tile_off = kvh * stride_kvh + offs_s[:, None] * stride_kvs + offs_d[None, :] * stride_kvd
    # Every page in [page_lo, page_hi) holds at least one key < seq_len, so after the
    # first iteration m_i is finite and exp2(m_i - m_new) never sees -inf - -inf.
    for p in range(page_lo, page_hi):
        # int64: page * stride_kvp overflows int32 for caches above 2^31 elements.
        page = tl.load(page_table_ptr + b * stride_ptb + p * stride_ptp).to(tl.int64)
        key_ok = (p * PAGE_SIZE + offs_s) < seq_len
        page_ptr = kv_ptr + page * stride_kvp + tile_off
        # Masked loads: rows past seq_len are never read (they may hold garbage/NaN,
        # and 0 * NaN in P @ V would poison the row).
        k = tl.load(page_ptr, mask=key_ok[:, None], other=0.0)
        v = tl.load(page_ptr + stride_kv, mask=key_ok[:, None], other=0.0)
        qk = _dot(q, tl.trans(k), UPCAST) * qk_scale
        qk = tl.where(key_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p_ij = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        acc = acc * alpha[:, None] + _dot(p_ij.to(v.dtype), v, UPCAST)
        m_i = m_new

    # Empty splits (and seq_len 0 rows) store m=-inf, l=0, acc=0; the combine kernel
    # gives them zero weight, so every split is always written and nothing stale is read.
    m_off = b * stride_mb + heads * stride_mh + split * stride_ms
    tl.store(part_m_ptr + m_off, m_i, mask=head_ok)
    tl.store(part_l_ptr + m_off, l_i, mask=head_ok)
    a_off = (
        b * stride_ab + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :] * stride_ad
    )
    tl.store(part_acc_ptr + a_off, acc, mask=head_ok[:, None])


@triton.jit
def _decode_split_kernel(
    q_ptr,
    kv_ptr,
    page_table_ptr,
    seq_lens_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qk_scale,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_ptb,
    stride_ptp,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_ab,
    stride_ah,
    stride_as,
    stride_ad,
    qkv_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    rows_ptr,
    eps,
    stride_t,
    stride_cos,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
    ROPE: tl.constexpr = False,
    HEADS: tl.constexpr = 0,
    HAS_NORM: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One (row, kv head, split) program: ``_split_tile``. With ``PDL``, launched
    programmatically: the wait before anything else (``programmatic_launch``)."""
    if PDL:
        await_producer()
    _split_tile(
        q_ptr, kv_ptr, page_table_ptr, seq_lens_ptr, part_m_ptr, part_l_ptr, part_acc_ptr,
        qk_scale, stride_qb, stride_qh, stride_qd, stride_kv, stride_kvp, stride_kvs,
        stride_kvh, stride_kvd, stride_ptb, stride_ptp, stride_mb, stride_mh, stride_ms,
        stride_ab, stride_ah, stride_as, stride_ad, qkv_ptr, q_w_ptr, k_w_ptr, cos_ptr,
        sin_ptr, rows_ptr, eps, stride_t, stride_cos,
        tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1), GROUP,
        BLOCK_H, HEAD_DIM, PAGE_SIZE, NUM_SPLITS, UPCAST, ROPE, HEADS, HAS_NORM,
    )  # fmt: skip


@triton.jit
def _combine_tile(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, stride_mb, stride_mh, stride_ms,
    stride_ab, stride_ah, stride_as, stride_ad, stride_ob, stride_oh, stride_od, b, h,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Row ``b``, query head ``h``: merge the NUM_SPLITS partial softmaxes. A program
    of ``_decode_combine_kernel``, or one tile of a persistent kernel's phase."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < NUM_SPLITS

    m_off = b * stride_mb + h * stride_mh + offs_s * stride_ms
    m = tl.load(part_m_ptr + m_off, mask=s_ok, other=float("-inf"))
    l_s = tl.load(part_l_ptr + m_off, mask=s_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr
        + b * stride_ab
        + h * stride_ah
        + offs_s[:, None] * stride_as
        + offs_d[None, :] * stride_ad,
        mask=s_ok[:, None],
        other=0.0,
    )
    m_max = tl.max(m, 0)
    # All splits empty (seq_len 0): shift by 0 so every weight is exp2(-inf) = 0.
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)
    denom = tl.sum(w * l_s, 0)
    num = tl.sum(w[:, None] * acc, 0)
    # denom == 0 only for padding rows, where num is 0 too: the output is exactly 0.
    out = num / tl.where(denom > 0.0, denom, 1.0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
    )


@triton.jit
def _decode_combine_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    out_ptr,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_ab,
    stride_ah,
    stride_as,
    stride_ad,
    stride_ob,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (row, query head) program: ``_combine_tile``. With ``PDL``, launched
    programmatically: the wait for the split before anything else, then the o
    projection, launched programmatically too, may launch under this merge
    (``programmatic_launch``)."""
    if PDL:
        await_producer()
    _combine_tile(
        part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, stride_mb, stride_mh, stride_ms,
        stride_ab, stride_ah, stride_as, stride_ad, stride_ob, stride_oh, stride_od,
        tl.program_id(0), tl.program_id(1), HEAD_DIM, NUM_SPLITS, BLOCK_S,
    )  # fmt: skip


@triton.jit
def _step_kv(
    kv_ptr, page_table_ptr, j, stride_ptp, stride_kv, stride_kvp, tile_off, step_page,
    total_pages, key_ok, KEY_PAGES: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Key step ``j``'s keys and values, ``[KEY_PAGES * PAGE_SIZE, HEAD_DIM]`` each,
    through pointers (``tile_off``: the step's rows of one kv head within a page,
    ``step_page``: each row's page in the step). With ``MASKED``, keys at or past the
    range's end (``key_ok`` false, None without ``MASKED``; unwritten padding may be
    NaN) are never read and come back as zeros, and pages past the range read page 0
    in their place (never the table's end)."""
    if KEY_PAGES == 1:
        page = tl.load(page_table_ptr + j * stride_ptp).to(tl.int64)
        step_ptr = kv_ptr + page * stride_kvp + tile_off
    else:
        p = j * KEY_PAGES + step_page
        if MASKED:
            pages = tl.load(page_table_ptr + p * stride_ptp, mask=p < total_pages, other=0)
        else:
            pages = tl.load(page_table_ptr + p * stride_ptp)
        step_ptr = kv_ptr + pages.to(tl.int64)[:, None] * stride_kvp + tile_off
    if MASKED:
        k = tl.load(step_ptr, mask=key_ok[:, None], other=0.0)
        v = tl.load(step_ptr + stride_kv, mask=key_ok[:, None], other=0.0)
    else:
        k = tl.load(step_ptr)
        v = tl.load(step_ptr + stride_kv)
    return k, v


@triton.jit
def _prefill_tile(
    q_ptr,
    kv_ptr,
    page_table_ptr,
    start_ptr,
    n_valid_ptr,
    qk_scale,
    T,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_ptp,
    tile,
    kvh,
    split,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    KEY_PAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    HISTORY: tl.constexpr = False,
):
    """Attention of one (token tile, kv head) over split ``split`` of NUM_SPLITS
    contiguous ranges of the tile's key steps (KEY_PAGES pages each): BLOCK_T tokens x
    all GROUP query heads of the kv head as BLOCK_T * GROUP_PAD rows, so each key/value
    page is loaded once per group. Returns the rows' token indices, heads, real and
    valid masks and the unnormalised online-softmax state (m, l, acc); m = -inf, l = 0,
    acc = 0 for a row that saw no key (an empty split).

    The scores stay as the dot gives them: a step's row maxima are scaled after the max
    (the scale is positive: the same value), and the scale is applied inside ``exp2``'s
    argument, ``exp2(s * qk_scale - m)``, one fused multiply-add an element, so each
    argument is rounded once (scaling the scores first, a multiply and a subtraction,
    rounded it twice: other bits). The unmasked and the masked steps do the same
    arithmetic, so a token's result does not depend on its tile.

    With ``HISTORY``, only the keys before the chunk, ``[0, start)``, which every row
    sees (``_prefill_history_kernel``): no key of the chunk and no query is read when
    there are none (start 0)."""
    BLOCK_R: tl.constexpr = BLOCK_T * GROUP_PAD

    start = tl.load(start_ptr)
    n_valid = tl.minimum(tl.load(n_valid_ptr), T)

    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, HEAD_DIM)
    BLOCK_S: tl.constexpr = KEY_PAGES * PAGE_SIZE
    offs_s = tl.arange(0, BLOCK_S)
    # Row r is token t = tile * BLOCK_T + r // GROUP_PAD and head-in-group r % GROUP_PAD.
    t = tile * BLOCK_T + offs_r // GROUP_PAD
    g = offs_r % GROUP_PAD
    heads = kvh * GROUP + g
    row_real = (t < T) & (g < GROUP)
    row_valid = row_real & (t < n_valid)
    q_pos = start + t

    # Padding tokens (which may hold garbage) are loaded as zeros; rows are independent
    # in both dots, so they could not affect other rows anyway.
    q_ok = row_valid
    if HISTORY:
        q_ok = q_ok & (start > 0)
    q = tl.load(
        q_ptr + t[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=q_ok[:, None],
        other=0.0,
    )

    # Key range of the tile: [0, kv_end), kv_end one past the last valid token's position,
    # walked in steps of BLOCK_S keys (KEY_PAGES pages). Steps below full_steps hold only
    # keys <= the tile's first query position, visible to every row: no mask there. A
    # tile of padding only has no steps at all. This split takes steps [step_lo, step_hi)
    # of [0, total_steps), empty for late splits of short ranges.
    tile_first = tile * BLOCK_T
    n_tile = tl.minimum(tl.maximum(n_valid - tile_first, 0), BLOCK_T)
    if HISTORY:
        kv_end = tl.where(n_tile > 0, start, 0)
        full_steps = kv_end // BLOCK_S
    else:
        kv_end = tl.where(n_tile > 0, start + tile_first + n_tile, 0)
        full_steps = tl.where(n_tile > 0, (start + tile_first + 1) // BLOCK_S, 0)
    total_pages = tl.cdiv(kv_end, PAGE_SIZE)
    total_steps = tl.cdiv(kv_end, BLOCK_S)
    per_split = tl.cdiv(total_steps, NUM_SPLITS)
    step_lo = split * per_split
    step_hi = tl.minimum(step_lo + per_split, total_steps)

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], tl.float32)

    # Key row s of a step is row s % PAGE_SIZE of the step's page s // PAGE_SIZE.
    tile_off = (
        kvh * stride_kvh + (offs_s % PAGE_SIZE)[:, None] * stride_kvs + offs_d[None, :] * stride_kvd
    )
    step_page = offs_s // PAGE_SIZE
    # Full steps come first and every row sees all their keys, so m_i is finite after the
    # first of them (no -inf - -inf in alpha).
    for j in range(step_lo, tl.minimum(step_hi, full_steps)):
        k, v = _step_kv(
            kv_ptr, page_table_ptr, j, stride_ptp, stride_kv, stride_kvp, tile_off,
            step_page, total_pages, None, KEY_PAGES, False,
        )  # fmt: skip
        # Raw scores; the row maxima and exp2's argument in the log2 domain.
        qk = _dot(q, tl.trans(k), UPCAST)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        alpha = tl.exp2(m_i - m_new)
        p_ij = tl.exp2(qk * qk_scale - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        acc = acc * alpha[:, None] + _dot(p_ij.to(v.dtype), v, UPCAST)
        m_i = m_new

    for j in range(tl.maximum(step_lo, full_steps), step_hi):
        k_pos = j * BLOCK_S + offs_s
        key_ok = k_pos < kv_end
        # Keys at or past kv_end are zeros (unwritten chunk padding may be NaN).
        k, v = _step_kv(
            kv_ptr, page_table_ptr, j, stride_ptp, stride_kv, stride_kvp, tile_off,
            step_page, total_pages, key_ok, KEY_PAGES, True,
        )  # fmt: skip
        qk = _dot(q, tl.trans(k), UPCAST)
        visible = key_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # A split starting past step 0 can begin with a tail step in which a row sees no
        # key yet (m_new = -inf): shift such rows by 0, so alpha and p are exp2(-inf) = 0
        # and the row keeps m=-inf, l=0, acc=0. (With one split, step 0 comes first and
        # m_new is always finite here: the shift is m_new itself.)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p_ij = tl.exp2(qk * qk_scale - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        acc = acc * alpha[:, None] + _dot(p_ij.to(v.dtype), v, UPCAST)
        m_i = m_new
    return t, heads, row_real, row_valid, m_i, l_i, acc


@triton.jit
def _prefill_kernel(
    q_ptr,
    kv_ptr,
    page_table_ptr,
    start_ptr,
    n_valid_ptr,
    out_ptr,
    qk_scale,
    T,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_ptp,
    stride_ot,
    stride_oh,
    stride_od,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    KEY_PAGES: tl.constexpr,
    UPCAST: tl.constexpr,
    LONGEST_FIRST: tl.constexpr,
):
    """One (token tile, kv head) over the tile's whole context, normalised in place.

    The grid is (kv heads, tiles). LONGEST_FIRST takes the tiles in reverse: the GPU
    starts programs in order, so every head's last tiles, which walk the most keys under
    the causal mask, start first and the short ones fill in behind them, rather than the
    longest starting last and running alone. A program's arithmetic, and so its bits,
    does not depend on when it runs."""
    if LONGEST_FIRST:
        tile = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        tile = tl.program_id(1)
    t, heads, row_real, row_valid, _m, l_i, acc = _prefill_tile(
        q_ptr, kv_ptr, page_table_ptr, start_ptr, n_valid_ptr, qk_scale, T,
        stride_qt, stride_qh, stride_qd, stride_kv, stride_kvp, stride_kvs, stride_kvh,
        stride_kvd, stride_ptp, tile, tl.program_id(0), 0,
        GROUP, GROUP_PAD, BLOCK_T, HEAD_DIM, PAGE_SIZE, 1, KEY_PAGES, UPCAST,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    out = tl.where(row_valid[:, None], out, 0.0)
    tl.store(
        out_ptr + t[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=row_real[:, None],
    )


@triton.jit
def _prefill_history_kernel(
    q_ptr,
    kv_ptr,
    page_table_ptr,
    start_ptr,
    n_valid_ptr,
    out_ptr,
    lse_ptr,
    qk_scale,
    T,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_ptp,
    stride_ot,
    stride_oh,
    stride_od,
    stride_lh,
    stride_lt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    KEY_PAGES: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One (kv head, token tile): the tile's rows against the keys before the chunk
    (``_prefill_tile`` with ``HISTORY``), merged in place into ``out``, which holds
    their attention within the chunk, normalised, with its natural-log sum ``lse``
    (``[heads, T]``, of the scaled scores). In the log2 domain that sum is ``lse *
    log2(e)``, one more partial softmax of weight ``2 ** (lse * log2(e))``. With no
    history (start 0) a valid row is left as it is, unread; padding rows become 0."""
    t, heads, row_real, row_valid, m_i, l_i, acc = _prefill_tile(
        q_ptr, kv_ptr, page_table_ptr, start_ptr, n_valid_ptr, qk_scale, T,
        stride_qt, stride_qh, stride_qd, stride_kv, stride_kvp, stride_kvs, stride_kvh,
        stride_kvd, stride_ptp, tl.program_id(1), tl.program_id(0), 0,
        GROUP, GROUP_PAD, BLOCK_T, HEAD_DIM, PAGE_SIZE, 1, KEY_PAGES, UPCAST, True,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    merge = row_valid & (tl.load(start_ptr) > 0)
    out_ptrs = (
        out_ptr + t[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    )
    chunk = tl.load(out_ptrs, mask=merge[:, None], other=0.0).to(tl.float32)
    chunk_m = tl.load(lse_ptr + heads * stride_lh + t * stride_lt, mask=merge, other=0.0) * _LOG2E
    # A merged row saw at least one key of the history (m_i finite) and itself (chunk_m
    # finite); the other rows' values are never stored.
    m_new = tl.maximum(m_i, chunk_m)
    history_w = tl.exp2(m_i - m_new)
    chunk_w = tl.exp2(chunk_m - m_new)
    denom = l_i * history_w + chunk_w
    out = (acc * history_w[:, None] + chunk * chunk_w[:, None]) / denom[:, None]
    out = tl.where(row_valid[:, None], out, 0.0)
    tl.store(
        out_ptrs,
        out.to(out_ptr.dtype.element_ty),
        mask=(row_real & (merge | ~row_valid))[:, None],
    )


@triton.jit
def _prefill_split_kernel(
    q_ptr,
    kv_ptr,
    page_table_ptr,
    start_ptr,
    n_valid_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qk_scale,
    T,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_ptp,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_at,
    stride_ah,
    stride_as,
    stride_ad,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    KEY_PAGES: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One (token tile, kv head, split): ``_prefill_kernel``'s rows against a contiguous
    range of the tile's pages; writes unnormalised partial results."""
    split = tl.program_id(2)
    t, heads, row_real, _valid, m_i, l_i, acc = _prefill_tile(
        q_ptr, kv_ptr, page_table_ptr, start_ptr, n_valid_ptr, qk_scale, T,
        stride_qt, stride_qh, stride_qd, stride_kv, stride_kvp, stride_kvs, stride_kvh,
        stride_kvd, stride_ptp, tl.program_id(0), tl.program_id(1), split,
        GROUP, GROUP_PAD, BLOCK_T, HEAD_DIM, PAGE_SIZE, NUM_SPLITS, KEY_PAGES, UPCAST,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    # Empty splits (and rows that saw no key) store m=-inf, l=0, acc=0. Every (token < T,
    # head, split) is written, so the combine never reads stale scratch; padding tokens
    # (q loaded as 0) get finite or empty partials, which the combine replaces by 0.
    m_off = t * stride_mt + heads * stride_mh + split * stride_ms
    tl.store(part_m_ptr + m_off, m_i, mask=row_real)
    tl.store(part_l_ptr + m_off, l_i, mask=row_real)
    a_off = (
        t[:, None] * stride_at
        + heads[:, None] * stride_ah
        + split * stride_as
        + offs_d[None, :] * stride_ad
    )
    tl.store(part_acc_ptr + a_off, acc, mask=row_real[:, None])


@triton.jit
def _prefill_combine_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    n_valid_ptr,
    out_ptr,
    T,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_at,
    stride_ah,
    stride_as,
    stride_ad,
    stride_ot,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """One (token block, query head): merge the NUM_SPLITS partial softmaxes of BLOCK_T
    chunk tokens; padding tokens get 0, tokens >= T are not written."""
    tile = tl.program_id(0)
    h = tl.program_id(1)
    t = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HEAD_DIM)
    t_ok = t < T
    valid = t < tl.minimum(tl.load(n_valid_ptr), T)
    m_ptr = part_m_ptr + t * stride_mt + h * stride_mh
    l_ptr = part_l_ptr + t * stride_mt + h * stride_mh
    a_ptr = part_acc_ptr + t[:, None] * stride_at + h * stride_ah + offs_d[None, :] * stride_ad

    m_max = tl.full([BLOCK_T], float("-inf"), tl.float32)
    for s in range(NUM_SPLITS):
        m_max = tl.maximum(m_max, tl.load(m_ptr + s * stride_ms, mask=t_ok, other=float("-inf")))
    # Tokens whose splits are all empty (padding tiles): shift by 0, so every weight is
    # exp2(-inf - 0) = 0 and no -inf - -inf appears.
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    denom = tl.zeros([BLOCK_T], tl.float32)
    num = tl.zeros([BLOCK_T, HEAD_DIM], tl.float32)
    for s in range(NUM_SPLITS):
        w = tl.exp2(tl.load(m_ptr + s * stride_ms, mask=t_ok, other=float("-inf")) - m_max)
        denom += w * tl.load(l_ptr + s * stride_ms, mask=t_ok, other=0.0)
        acc = tl.load(a_ptr + s * stride_as, mask=t_ok[:, None], other=0.0)
        num += w[:, None] * acc
    # A valid token's split holding key 0 has l >= 1, so denom > 0 for every valid token.
    out = num / tl.where(denom > 0.0, denom, 1.0)[:, None]
    out = tl.where(valid[:, None], out, 0.0)
    tl.store(
        out_ptr + t[:, None] * stride_ot + h * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=t_ok[:, None],
    )


# triton.jit decides at decoration time whether kernels run compiled or interpreted.
_INTERPRETED = isinstance(_decode_split_kernel, InterpretedFunction)
if _INTERPRETED:
    fix_interpreter_loop_bounds()


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _check_cache(q: torch.Tensor, kv: torch.Tensor) -> tuple[int, int, int, int]:
    """Validates shapes and dtypes (never contents); returns
    (num_heads, num_kv_heads, head_dim, page_size)."""
    if q.dim() != 3:
        raise ValueError(f"q must be [rows, num_heads, head_dim], got {tuple(q.shape)}")
    if kv.dim() != 5 or kv.shape[0] != 2:
        raise ValueError(
            f"kv must be [2, num_pages, page_size, num_kv_heads, head_dim], got {tuple(kv.shape)}"
        )
    _, num_heads, head_dim = q.shape
    _, _, page_size, num_kv_heads, kv_head_dim = kv.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head_dim mismatch: q {head_dim}, kv {kv_head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if not _is_pow2(head_dim) or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if not _is_pow2(page_size) or page_size < _MIN_DOT:
        raise ValueError(f"page_size must be a power of two >= {_MIN_DOT}, got {page_size}")
    if q.dtype != kv.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q and kv must share a 16-bit float dtype, got {q.dtype}, {kv.dtype}")
    if q.device != kv.device:
        raise ValueError(f"q on {q.device} but kv on {kv.device}")
    return num_heads, num_kv_heads, head_dim, page_size


def _split_partials(
    rows: int, heads: int, splits: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 split-KV partials (m, l, acc) per (row, head, split); allocated by shape, so
    under capture they come from the graph's pool."""
    part_m = torch.empty((rows, heads, splits), dtype=torch.float32, device=device)
    part_acc = torch.empty((rows, heads, splits, head_dim), dtype=torch.float32, device=device)
    return part_m, torch.empty_like(part_m), part_acc


def _check_index(name: str, t: torch.Tensor, dims: int, device: torch.device) -> None:
    if t.dtype != torch.int32 or t.dim() != dims or t.device != device:
        raise ValueError(
            f"{name} must be a {dims}-d int32 tensor on {device}, "
            f"got {t.dtype} {tuple(t.shape)} on {t.device}"
        )


def triton_paged_decode_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int = DEFAULT_NUM_SPLITS,
    split_warps: int = 4,
) -> torch.Tensor:
    """Split-KV ("flash decoding") paged attention for one query token per row.

    ``q [B, num_heads, head_dim]``, ``page_table int32 [B, max_pages]``, ``seq_lens int32
    [B]`` (cached tokens the row attends to, its own included; 0 = padding row, output 0).
    Returns ``[B, num_heads, head_dim]`` in q's dtype. CUDA-graph safe: the grid, the
    scratch shapes and every constexpr depend only on input shapes. ``split_warps``:
    the split kernel's warps (at head_dim 128, four spill registers to the stack on
    SM90 and eight do not, yet four were faster at every shape on the H200:
    ``bench/results/issue23/2026-12-05c-h200-persistent``).
    """
    return _decode(q, kv, page_table, seq_lens, scale, num_splits, None, split_warps)


class RopeInputs(NamedTuple):
    """A decode layer's packed projection and what finishes it (``triton_kv_write``):
    ``qkv [B, (heads + 2 * kv_heads) * head_dim]``, the q/k norm weights (both or
    neither) and epsilon, the rotary rows ``cos``/``sin [B, head_dim]``, and each
    row's flat cache row ``rows`` (int64)."""

    qkv: torch.Tensor
    q_weight: torch.Tensor | None
    k_weight: torch.Tensor | None
    eps: float
    cos: torch.Tensor
    sin: torch.Tensor
    rows: torch.Tensor


def triton_paged_decode_attention_rope(
    rope: RopeInputs,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    heads: int,
    *,
    num_splits: int = DEFAULT_NUM_SPLITS,
    split_warps: int = 4,
) -> torch.Tensor:
    """``triton_rope_write_kv`` and ``triton_paged_decode_attention`` of decode rows in
    the split and merge kernels alone: each split program finishes its row's queries
    of its kv-head group (the same arithmetic, so the same bits), and the split that
    reads the row's newest page writes that token's keys and values to the row's
    cache row first. ``rows[b]`` must be position ``seq_lens[b] - 1``'s row under
    ``page_table[b]``, or in the null page for a padding row (``seq_lens[b]`` 0), as
    a decode step's are. ``kv`` (this layer's ``[2, pages, page_size, kv_heads,
    head_dim]``) must be contiguous. Returns ``[B, heads, head_dim]``."""
    qkv = rope.qkv
    kv_heads, head_dim = kv.shape[3], kv.shape[4]
    tokens = qkv.shape[0]
    if not kv.is_contiguous():
        raise ValueError("the layer's cache must be contiguous")
    if qkv.dim() != 2 or qkv.shape[1] != (heads + 2 * kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValueError(
            f"qkv {tuple(qkv.shape)} is not a packed projection of {heads} query and "
            f"{kv_heads} kv heads of {head_dim} with unit column stride"
        )
    if rope.cos.shape != (tokens, head_dim) or rope.sin.shape != rope.cos.shape:
        raise ValueError(f"cos/sin must be [{tokens}, {head_dim}], not {tuple(rope.cos.shape)}")
    if rope.cos.stride() != rope.sin.stride() or rope.cos.stride(1) != 1:
        raise ValueError("cos and sin need the same strides and unit column stride")
    if (rope.q_weight is None) != (rope.k_weight is None):
        raise ValueError("q and k norms come together or not at all")
    if rope.rows.shape != (tokens,) or rope.rows.dtype != torch.int64:
        raise ValueError(
            f"rows must be int64 [{tokens}], not {rope.rows.dtype} {tuple(rope.rows.shape)}"
        )
    # Each split program stores its group's finished queries here and reads them back.
    q = torch.empty(tokens, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    return _decode(q, kv, page_table, seq_lens, scale, num_splits, rope, split_warps)


def _decode(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    rope: RopeInputs | None,
    split_warps: int = 4,
) -> torch.Tensor:
    """The split and merge launches; with ``rope``, ``q`` is the split's scratch for
    the queries it finishes; ``split_warps``, the split kernel's warps."""
    num_heads, num_kv_heads, head_dim, page_size = _check_cache(q, kv)
    batch = q.shape[0]
    _check_index("page_table", page_table, 2, q.device)
    _check_index("seq_lens", seq_lens, 1, q.device)
    if page_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError("page_table and seq_lens must have one entry per row of q")
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    group = num_heads // num_kv_heads
    block_h = max(_MIN_DOT, triton.next_power_of_2(group))
    block_s = triton.next_power_of_2(num_splits)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    part_m, part_l, part_acc = _split_partials(batch, num_heads, num_splits, head_dim, q.device)
    if rope is None:  # the finishing arguments unused
        finish = (q, q, q, q, q, seq_lens, 0.0, 0, 0)
        has_norm = False
    else:
        has_norm = rope.q_weight is not None
        finish = (
            rope.qkv,
            rope.q_weight if has_norm else rope.qkv,
            rope.k_weight if has_norm else rope.qkv,
            rope.cos,
            rope.sin,
            rope.rows,
            rope.eps,
            rope.qkv.stride(0),
            rope.cos.stride(0),
        )

    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q,
        kv,
        page_table,
        seq_lens,
        part_m,
        part_l,
        part_acc,
        scale * LOG2E,
        *q.stride(),
        *kv.stride(),
        *page_table.stride(),
        *part_m.stride(),
        *part_acc.stride(),
        *finish,
        GROUP=group,
        BLOCK_H=block_h,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        NUM_SPLITS=num_splits,
        UPCAST=_INTERPRETED,
        ROPE=rope is not None,
        HEADS=num_heads,
        HAS_NORM=has_norm,
        num_warps=split_warps,
        num_stages=2,
        **kernel_options(q.device),
    )
    _decode_combine_kernel[(batch, num_heads)](
        part_m,
        part_l,
        part_acc,
        out,
        *part_m.stride(),
        *part_acc.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_S=block_s,
        num_warps=4,
        **kernel_options(q.device),
    )
    return out


class PrefillTiling(NamedTuple):
    """A prefill program's shape: query rows (tokens x padded group), pages of keys per
    step of its key loop, and Triton's launch options."""

    rows: int
    key_pages: int
    num_warps: int
    num_stages: int


# Long chunks of a group of 4 query heads of dimension 128 per kv head (Qwen3-8B's
# shape; bench/prefill_attention_bench.py on the H200, bench/results/issue5/
# 2026-11-30g-two-gpus/): 4,096-token chunks after 16K, 32K and 60K cached tokens took
# 2.98, 5.60 and 10.47 ms at 128 rows, two pages per key step, 8 warps and 3 stages,
# against 3.23, 6.15 and 11.30 at the general tiling (0.40 against 0.39 ms with no
# history). Other shapes keep the general tiling until measured.
LONG_CHUNK_TOKENS = 4096
LONG_CHUNK_TILING = PrefillTiling(rows=128, key_pages=2, num_warps=8, num_stages=3)


def prefill_tiling(num_tokens: int, group_pad: int, head_dim: int) -> PrefillTiling:
    """The default tiling of a prefill chunk of ``num_tokens`` (its captured capacity)
    for a padded group of ``group_pad`` query heads of ``head_dim`` per kv head: shapes
    only."""
    if num_tokens >= LONG_CHUNK_TOKENS and group_pad == 4 and head_dim == 128:
        return LONG_CHUNK_TILING
    return PrefillTiling(rows=DEFAULT_PREFILL_ROWS, key_pages=1, num_warps=4, num_stages=2)


def prefill_splits(num_tokens: int, block_t: int, num_kv_heads: int) -> int:
    """Default KV split count of ``triton_paged_prefill_attention``: enough splits for
    about PREFILL_TARGET_PROGRAMS programs, at most MAX_PREFILL_SPLITS, at least 1.

    ``block_t`` is the tile as launched (after the minimum for ``tl.dot``). Shapes only,
    never tensor contents: the count fixes the grid and the scratch shapes of a captured
    CUDA graph, which is replayed with every start and n_valid.
    """
    programs = triton.cdiv(num_tokens, block_t) * num_kv_heads
    if programs <= 0:
        return 1
    return max(1, min(MAX_PREFILL_SPLITS, triton.cdiv(PREFILL_TARGET_PROGRAMS, programs)))


def triton_paged_prefill_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
    *,
    block_t: int | None = None,
    num_splits: int | None = None,
    key_pages: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    longest_first: bool = True,
) -> torch.Tensor:
    """Causal paged attention for one request's prefill chunk (flash-attention style).

    ``q [T, num_heads, head_dim]`` (T = captured chunk capacity), ``page_table_row int32
    [max_pages]``, ``start int32 [1]`` (absolute position of q[0]), ``n_valid int32 [1]``
    (real tokens; rows >= n_valid are padding and come back as 0). Row i attends keys
    ``[0, start + i]``, the chunk's own keys already written to the cache.

    ``block_t`` (tokens per program, a power of two), ``key_pages`` (pages of keys per
    step of a program's key loop, a power of two) and Triton's ``num_warps`` and
    ``num_stages`` are tuning knobs; each one not given comes from ``prefill_tiling``.
    ``num_splits`` splits each tile's pages into that many contiguous ranges run by
    separate programs, merged afterwards (split-KV, as in decode); by default
    ``prefill_splits`` picks it from the shapes. 1 runs the single-pass kernel, which
    with ``longest_first`` (the default) starts the tiles that walk the most keys first;
    the order changes no bits. Every choice is CUDA-graph safe: grid, scratch shapes and
    constexprs depend only on shapes. The scale is applied inside ``exp2``'s argument,
    one fused multiply-add an element (``_prefill_tile``; measured 1.2 to 3.4% faster
    on an H100 than scaling the scores first,
    ``bench/results/issue23/2026-12-06j-h100-fold-tma/``).
    """
    num_heads, num_kv_heads, head_dim, page_size = _check_cache(q, kv)
    _check_index("page_table_row", page_table_row, 1, q.device)
    _check_index("start", start, 1, q.device)
    _check_index("n_valid", n_valid, 1, q.device)

    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    tiling = prefill_tiling(q.shape[0], group_pad, head_dim)
    if block_t is None:
        block_t = max(1, tiling.rows // group_pad)
    key_pages = tiling.key_pages if key_pages is None else key_pages
    if not _is_pow2(block_t):
        raise ValueError(f"block_t must be a power of two, got {block_t}")
    # tl.dot needs at least 16 rows.
    block_t = max(block_t, math.ceil(_MIN_DOT / group_pad))
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if not _is_pow2(key_pages):
        raise ValueError(f"key_pages must be a power of two, got {key_pages}")

    num_tokens = q.shape[0]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_tokens == 0:
        return out
    if num_splits is None:
        num_splits = prefill_splits(num_tokens, block_t, num_kv_heads)
    tiles = triton.cdiv(num_tokens, block_t)
    inputs = (q, kv, page_table_row, start, n_valid)
    input_strides = (*q.stride(), *kv.stride(), *page_table_row.stride())
    launch = dict(
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_T=block_t,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        KEY_PAGES=key_pages,
        UPCAST=_INTERPRETED,
        num_warps=tiling.num_warps if num_warps is None else num_warps,
        num_stages=tiling.num_stages if num_stages is None else num_stages,
    )
    if num_splits == 1:
        _prefill_kernel[(num_kv_heads, tiles)](
            *inputs,
            out,
            scale * LOG2E,
            num_tokens,
            *input_strides,
            *out.stride(),
            LONGEST_FIRST=longest_first,
            **launch,
        )
        return out

    part_m, part_l, part_acc = _split_partials(
        num_tokens, num_heads, num_splits, head_dim, q.device
    )
    _prefill_split_kernel[(tiles, num_kv_heads, num_splits)](
        *inputs,
        part_m,
        part_l,
        part_acc,
        scale * LOG2E,
        num_tokens,
        *input_strides,
        *part_m.stride(),
        *part_acc.stride(),
        NUM_SPLITS=num_splits,
        **launch,
    )
    _prefill_combine_kernel[(triton.cdiv(num_tokens, PREFILL_COMBINE_TOKENS), num_heads)](
        part_m,
        part_l,
        part_acc,
        n_valid,
        out,
        num_tokens,
        *part_m.stride(),
        *part_acc.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        NUM_SPLITS=num_splits,
        BLOCK_T=PREFILL_COMBINE_TOKENS,
        num_warps=4,
    )
    return out


# Chunks of at least this many tokens attend within themselves through a library
# kernel (``triton_paged_prefill_attention_rope``); None: none do. Off: with PyTorch's
# flash kernel the two parts exported, qualified bitwise and served, but lost to the
# one kernel at every history on an H100; cuDNN's kernel, faster within the chunk,
# is to be measured the same way (``bench/prefill_two_parts_bench.py``, then the 8B
# prepared and served); the interpreter checks the two parts on the CPU
# (``tests/test_prefill_two_parts.py``).
TWO_PARTS_MIN_TOKENS: int | None = None
# The head widths of the within-chunk library kernel (cuDNN's attention on Hopper):
# multiples of 8 up to 128.
LIBRARY_MAX_HEAD_DIM = 128


def two_parts_apply(
    tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
    device: torch.device, min_tokens: int | None = TWO_PARTS_MIN_TOKENS,
) -> bool:  # fmt: skip
    """Whether a prefill chunk of ``tokens`` (its captured capacity) takes
    ``triton_paged_prefill_attention_rope``: shapes and the device only. Chunks of
    at least ``min_tokens`` (None: none) that the single-pass kernel serves (one
    split), of a 16-bit dtype and a head width the library kernel takes, on an SM80
    or later GPU, or on the CPU (its flash kernel, for the tests)."""
    if min_tokens is None or tokens < min_tokens:
        return False
    if head_dim % 8 or head_dim > LIBRARY_MAX_HEAD_DIM:
        return False
    if dtype not in (torch.bfloat16, torch.float16) or heads % kv_heads:
        return False
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return False
    group_pad = triton.next_power_of_2(heads // kv_heads)
    block_t = _tile_tokens(prefill_tiling(tokens, group_pad, head_dim), group_pad)
    return prefill_splits(tokens, block_t, kv_heads) == 1


def _tile_tokens(tiling: PrefillTiling, group_pad: int) -> int:
    """The tokens of a prefill tile at ``tiling``'s default as launched: its rows over
    the padded group, at least one, and at least ``tl.dot``'s 16 rows."""
    return max(max(1, tiling.rows // group_pad), math.ceil(_MIN_DOT / group_pad))


def _chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, library: str = "cudnn",
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Causal attention of a chunk's ``[T, heads, D]`` queries over its own ``[T,
    kv_heads, D]`` keys and values (unit last stride; with ``causal`` off, over any
    number of keys, each seen by every query: a history's), by a library kernel: the
    normalised output ``[T, heads, D]``, contiguous as the operator's fake result
    declares it, and the natural log of each row's sum of exponentials of its scaled
    scores, ``[heads, T]`` fp32 (may be a strided view). On CUDA ``library`` picks
    the kernel, grouped heads natively in both: ``"cudnn"``,
    ``aten::_scaled_dot_product_cudnn_attention``, or ``"flash"``,
    ``aten::_flash_attention_forward`` (slower on Hopper: the module's docstring);
    on the CPU, PyTorch's CPU flash kernel."""
    if library not in ("cudnn", "flash"):
        raise ValueError(f"unknown attention library {library!r}: cudnn or flash")
    tokens, heads = q.shape[0], q.shape[1]
    if q.device.type == "cuda" and library == "flash":
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q[None], k[None], v[None], None, None, tokens, k.shape[0], 0.0, causal, False,
            scale=scale,
        )  # fmt: skip
        return out[0], lse[0]
    if q.device.type == "cuda":
        out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            None, True, 0.0, causal, False, scale=scale,
        )  # fmt: skip
        # cuDNN lays the output out as the queries are ([T, heads, D] dense), so this
        # copies nothing.
        return out[0].transpose(0, 1).contiguous(), lse[0].reshape(heads, tokens)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], 0.0, causal,
        scale=scale,
    )  # fmt: skip
    return out[0].transpose(0, 1), lse[0]


def triton_paged_prefill_attention_rope(
    rope: RopeInputs,
    kv: torch.Tensor,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
    heads: int,
    library: str = "cudnn",
) -> torch.Tensor:
    """A long prefill chunk's attention from its packed projection: ``triton_rope_
    write_kv`` (the cache written as always) leaving the whole projection finished,
    the chunk's attention within itself by ``library``'s kernel (``_chunk_attention``:
    causal, so a real token never sees the padding after it, whose keys and values
    are zeros as in the cache), then ``_prefill_history_kernel``: the keys before the
    chunk, merged into that output in place (none read at start 0). The same
    contract as ``triton_paged_prefill_attention`` after the write: ``[T, heads,
    head_dim]``, padding rows 0. Take it where ``two_parts_apply``."""
    from ignition.components.triton_kv_write import triton_rope_write_kv

    _check_index("page_table_row", page_table_row, 1, kv.device)
    _check_index("start", start, 1, kv.device)
    _check_index("n_valid", n_valid, 1, kv.device)
    finished = triton_rope_write_kv(
        kv, rope.qkv, rope.q_weight, rope.k_weight, rope.eps, rope.cos, rope.sin, rope.rows,
        heads, finished=True,
    )  # fmt: skip
    q, k, v = finished.split([heads, kv.shape[3], kv.shape[3]], dim=1)
    num_heads, num_kv_heads, head_dim, page_size = _check_cache(q, kv)
    tokens = q.shape[0]
    if tokens == 0:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    out, lse = _chunk_attention(q, k, v, scale, library)
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    tiling = prefill_tiling(tokens, group_pad, head_dim)
    block_t = _tile_tokens(tiling, group_pad)
    _prefill_history_kernel[(num_kv_heads, triton.cdiv(tokens, block_t))](
        q, kv, page_table_row, start, n_valid, out, lse, scale * LOG2E, tokens,
        *q.stride(), *kv.stride(), *page_table_row.stride(), *out.stride(), *lse.stride(),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_T=block_t, HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, KEY_PAGES=tiling.key_pages, UPCAST=_INTERPRETED,
        num_warps=tiling.num_warps, num_stages=tiling.num_stages,
    )  # fmt: skip
    return out
