"""Triton kernels for QSA: block scores over the selector pages, and attention over
the selected blocks of the paged K/V.

Storage contract (``ignition.components.selector``): one layer's block keys are
``selectors[pages, page_size // ratio, Di]``, block b of a request in page
``table[b // blocks_per_page]``, entry ``b % blocks_per_page``; its K/V are the
paged cache of ``ignition.components.triton_attention``. Tokens come packed, each
request's ``tokens_per_row`` consecutive tokens reading table row ``n //
tokens_per_row`` (a prefill chunk is one row, decode one token per row).

- ``triton_block_scores``: ``sum_h relu(q_h . k_b) / sqrt(Di)`` of every token
  against every block its table reaches (fp32 products of the operands, fp32 sums, as
  Transformers computes them), -inf for blocks that are not complete at the token's
  position or tokens that are not valid. The top-k then runs on these scores.
- ``triton_selected_attention``: each token attends to the tokens of its selected
  blocks (a list padded with -1; the open group's block comes last, its tokens past
  the query masked). Split over the list like decode attention is split over pages
  (partials merged by the decode combine kernel) into a number of splits that
  depends only on the list's length, so a token's result depends only on its own
  list, never on the batch.

Both are replayed in CUDA graphs with new metadata: grids and constexprs depend only
on shapes, everything per step is read on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.programmatic_launch import kernel_options
from ignition.components.triton_attention import (
    _INTERPRETED,
    _MIN_DOT,
    LOG2E,
    _decode_combine_kernel,
    _split_partials,
)

# Blocks per step of the attention loop: 16 blocks of 4 tokens make a 64-key tile.
TILE_BLOCKS = 16
# Blocks per score tile.
SCORE_BLOCKS = 64
# Tokens of one table row per score program (the prefill chunk shares its row).
SCORE_TOKENS = 8
# Splits of a decode token's block list: at most this many, whatever the batch (a
# split count that followed the batch would change the token's rounding with it).
MAX_SPLITS = 16


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``tl.dot`` with fp32 accumulation. IEEE: fp32 operands multiplied in full fp32
    (the default, TF32, keeps 10 mantissa bits: scores and probabilities of fp32
    operands would lose their precision); 16-bit operands are exact in fp32 either
    way. UPCAST: the interpreter's bf16 workaround of ``triton_attention._dot``."""
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _block_scores_kernel(
    q_ptr,
    sel_ptr,
    table_ptr,
    pos_ptr,
    valid_ptr,
    out_ptr,
    sqrt_dim,
    stride_qn,
    stride_qh,
    stride_qd,
    stride_sp,
    stride_sb,
    stride_sd,
    stride_tr,
    stride_tp,
    stride_on,
    stride_ob,
    tokens_per_row,
    n_tokens,
    n_blocks,
    HEADS: tl.constexpr,
    BLOCK_HP: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PER_PAGE: tl.constexpr,
    RATIO: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One (token tile of one table row, block tile)."""
    pid_n = tl.program_id(0)
    pid_b = tl.program_id(1)
    first = pid_n * BLOCK_N
    row = first // tokens_per_row
    offs_r = tl.arange(0, BLOCK_N * BLOCK_HP)
    tok = first + offs_r // BLOCK_HP
    head = offs_r % BLOCK_HP
    offs_d = tl.arange(0, DIM)
    q_ok = (tok < n_tokens) & (head < HEADS)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=q_ok[:, None],
        other=0.0,
    )
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_ok = offs_b < n_blocks
    page = tl.load(
        table_ptr + row * stride_tr + (offs_b // PER_PAGE) * stride_tp, mask=b_ok, other=0
    )
    k_off = page.to(tl.int64) * stride_sp + (offs_b % PER_PAGE) * stride_sb
    k = tl.load(
        sel_ptr + k_off[:, None] + offs_d[None, :] * stride_sd, mask=b_ok[:, None], other=0.0
    )
    s = _dot(q, tl.trans(k), UPCAST, IEEE)  # [BLOCK_N * BLOCK_HP, BLOCK_B], fp32
    s = tl.maximum(s, 0.0)
    s = tl.sum(tl.reshape(s, (BLOCK_N, BLOCK_HP, BLOCK_B)), axis=1) / sqrt_dim
    offs_t = first + tl.arange(0, BLOCK_N)
    t_ok = offs_t < n_tokens
    pos = tl.load(pos_ptr + offs_t, mask=t_ok, other=0)
    valid = tl.load(valid_ptr + offs_t, mask=t_ok, other=0) != 0
    complete = (pos + 1) // RATIO
    keep = (offs_b[None, :] < complete[:, None]) & valid[:, None]
    s = tl.where(keep, s, float("-inf"))
    tl.store(
        out_ptr + offs_t[:, None] * stride_on + offs_b[None, :] * stride_ob,
        s,
        mask=t_ok[:, None] & b_ok[None, :],
    )


@triton.jit
def _selected_split_kernel(
    q_ptr,
    kv_ptr,
    table_ptr,
    blocks_ptr,
    pos_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    qk_scale,
    stride_qn,
    stride_qh,
    stride_qd,
    stride_kv,
    stride_kvp,
    stride_kvs,
    stride_kvh,
    stride_kvd,
    stride_tr,
    stride_tp,
    stride_bn,
    stride_bk,
    stride_mn,
    stride_mh,
    stride_ms,
    stride_an,
    stride_ah,
    stride_as,
    stride_ad,
    tokens_per_row,
    n_select,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    RATIO: tl.constexpr,
    TILE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One (token, kv head, split): the kv-head group's queries against a contiguous
    range of the token's selected blocks; writes unnormalised partial results."""
    n = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    row = n // tokens_per_row
    pos = tl.load(pos_ptr + n)
    tiles = tl.cdiv(n_select, TILE)
    per_split = tl.cdiv(tiles, NUM_SPLITS)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, tiles)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    head_ok = offs_h < GROUP
    heads = kvh * GROUP + offs_h
    q = tl.load(
        q_ptr + n * stride_qn + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=head_ok[:, None],
        other=0.0,
    )
    offs_k = tl.arange(0, TILE * RATIO)
    entry = offs_k // RATIO
    member = offs_k % RATIO

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for t in range(lo, hi):
        index = t * TILE + entry
        block = tl.load(
            blocks_ptr + n * stride_bn + index * stride_bk, mask=index < n_select, other=-1
        )
        token = block * RATIO + member
        ok = (block >= 0) & (token <= pos)
        page = tl.load(
            table_ptr + row * stride_tr + (token // PAGE_SIZE) * stride_tp, mask=ok, other=0
        ).to(tl.int64)
        off = page * stride_kvp + (token % PAGE_SIZE) * stride_kvs + kvh * stride_kvh
        k = tl.load(
            kv_ptr + off[:, None] + offs_d[None, :] * stride_kvd, mask=ok[:, None], other=0.0
        )
        v = tl.load(
            kv_ptr + stride_kv + off[:, None] + offs_d[None, :] * stride_kvd,
            mask=ok[:, None],
            other=0.0,
        )
        qk = _dot(q, tl.trans(k), UPCAST, IEEE) * qk_scale
        qk = tl.where(ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A tile may hold no selected token (padding of the list): shift by 0 then,
        # so that exp2 sees -inf - 0, never -inf - -inf.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - shift)
        p_ij = tl.exp2(qk - shift[:, None])
        l_i = l_i * alpha + tl.sum(p_ij, 1)
        acc = acc * alpha[:, None] + _dot(p_ij.to(v.dtype), v, UPCAST, IEEE)
        m_i = m_new

    m_off = n * stride_mn + heads * stride_mh + split * stride_ms
    tl.store(part_m_ptr + m_off, m_i, mask=head_ok)
    tl.store(part_l_ptr + m_off, l_i, mask=head_ok)
    a_off = (
        n * stride_an + heads[:, None] * stride_ah + split * stride_as + offs_d[None, :] * stride_ad
    )
    tl.store(part_acc_ptr + a_off, acc, mask=head_ok[:, None])


def _rows_check(n_tokens: int, tables: torch.Tensor, tokens_per_row: int) -> None:
    if tables.dtype != torch.int32 or tables.dim() != 2:
        raise ValueError(f"tables must be int32 [rows, max_pages], got {tables.dtype}")
    if tokens_per_row < 1 or tables.shape[0] * tokens_per_row != n_tokens:
        raise ValueError(
            f"{n_tokens} tokens are not {tables.shape[0]} rows of {tokens_per_row} tokens"
        )


def triton_block_scores(
    q: torch.Tensor,
    selectors: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    """fp32 scores ``[tokens, max_pages * blocks_per_page]`` of ``q [tokens, heads,
    Di]`` against ``selectors [pages, blocks_per_page, Di]`` (module docs)."""
    n_tokens, heads, dim = q.shape
    _rows_check(n_tokens, tables, tokens_per_row)
    per_page = selectors.shape[1]
    n_blocks = tables.shape[1] * per_page
    if dim < _MIN_DOT or dim & (dim - 1):
        raise ValueError(f"index head dim must be a power of two >= {_MIN_DOT}, got {dim}")
    block_n = SCORE_TOKENS if tokens_per_row % SCORE_TOKENS == 0 else 1
    block_hp = max(triton.next_power_of_2(heads), -(-_MIN_DOT // block_n))
    out = torch.empty(n_tokens, n_blocks, dtype=torch.float32, device=q.device)
    grid = (n_tokens // block_n, triton.cdiv(n_blocks, SCORE_BLOCKS))
    _block_scores_kernel[grid](
        q,
        selectors,
        tables,
        positions,
        valid,
        out,
        float(dim) ** 0.5,
        *q.stride(),
        *selectors.stride(),
        *tables.stride(),
        *out.stride(),
        tokens_per_row,
        n_tokens,
        n_blocks,
        HEADS=heads,
        BLOCK_HP=block_hp,
        DIM=dim,
        BLOCK_N=block_n,
        BLOCK_B=SCORE_BLOCKS,
        PER_PAGE=per_page,
        RATIO=ratio,
        UPCAST=_INTERPRETED,
        IEEE=q.dtype == torch.float32,
        num_warps=4,
    )
    return out


def selected_splits(tokens_per_row: int, n_select: int) -> int:
    """Splits of each token's block list: for decode rows (one token per row) one per
    tile of the list up to ``MAX_SPLITS``, for a prefill chunk (whose tokens fill
    the GPU) one. Neither depends on how many rows or tokens the launch holds, so a
    token's result is the same at every decode capacity and every chunk size."""
    if tokens_per_row > 1:
        return 1
    return max(1, min(triton.cdiv(n_select, TILE_BLOCKS), MAX_SPLITS))


def triton_selected_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    blocks: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    scale: float,
) -> torch.Tensor:
    """Attention of ``q [tokens, heads, head_dim]`` over the tokens of its selected
    ``blocks int32 [tokens, n_select]`` (-1 pads) at or before ``positions``, in one
    layer's pages ``kv [2, pages, page_size, kv_heads, head_dim]``. Tokens that select
    nothing give zeros."""
    n_tokens, heads, head_dim = q.shape
    _rows_check(n_tokens, tables, tokens_per_row)
    _, _, page_size, kv_heads, _ = kv.shape
    if blocks.dtype != torch.int32 or blocks.shape[0] != n_tokens:
        raise ValueError("blocks must be int32 [tokens, n_select]")
    if TILE_BLOCKS * ratio < _MIN_DOT or page_size % ratio:
        raise ValueError(f"ratio {ratio} must divide the page and give tiles of {_MIN_DOT}+ keys")
    group = heads // kv_heads
    block_h = max(_MIN_DOT, triton.next_power_of_2(group))
    n_select = blocks.shape[1]
    splits = selected_splits(tokens_per_row, n_select)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    part_m, part_l, part_acc = _split_partials(n_tokens, heads, splits, head_dim, q.device)
    _selected_split_kernel[(n_tokens, kv_heads, splits)](
        q,
        kv,
        tables,
        blocks,
        positions,
        part_m,
        part_l,
        part_acc,
        scale * LOG2E,
        *q.stride(),
        *kv.stride(),
        *tables.stride(),
        *blocks.stride(),
        *part_m.stride(),
        *part_acc.stride(),
        tokens_per_row,
        n_select,
        GROUP=group,
        BLOCK_H=block_h,
        HEAD_DIM=head_dim,
        PAGE_SIZE=page_size,
        RATIO=ratio,
        TILE=TILE_BLOCKS,
        NUM_SPLITS=splits,
        UPCAST=_INTERPRETED,
        IEEE=q.dtype == torch.float32,
        num_warps=4,
        num_stages=2,
    )
    _decode_combine_kernel[(n_tokens, heads)](
        part_m,
        part_l,
        part_acc,
        out,
        *part_m.stride(),
        *part_acc.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        NUM_SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits),
        num_warps=4,
        **kernel_options(q.device),
    )
    return out
