"""Sparse-attention selection (QSA) over paged selector keys and an open-group ring.

The indexer scores blocks of ``ratio`` consecutive tokens: a block's key is the mean
of its tokens' raw index keys (fp32, rounded to the model dtype), normalized and
rotated at the block's first position; a query at position p scores every complete
block (``b < (p + 1) // ratio``) by ``sum_h relu(q_h . k_b) / sqrt(Di)``, keeps the
top ``budget / ratio`` and attends to their tokens plus the open tail
``[(p + 1) // ratio * ratio, p]``. While ``p + 1 < budget + ratio`` every block is
kept and the layer is dense causal attention. A query that completes a block scores
that block with the others, so it can exclude itself.

Storage, one logical page allocation for all of a request's paged state:

- ``selectors [layers, pages, page_size // ratio, Di]``: block keys, in the physical
  page of the block's tokens, written once when the block's last token is consumed;
- the continuation row's ring ``[layers, ratio, Di]`` of raw keys with their logical
  positions (``tags``, -1 when empty): entry ``p % ratio`` holds position p, so the
  open group ``[S // ratio * ratio, S)`` of consumed count S is always in it.

Everything is batched over rows that each carry a request's tokens ``[rows,
tokens]``, their first position and valid count: a prefill chunk is one row of
``tokens`` = capacity, decode is one token per row. Shapes are fixed; invalid blocks
and tokens are masked, never branched on. Selection is a fixed-k top-k with -inf
for incomplete blocks; a -inf pick is not selected, and equal scores pick the earlier
block (Transformers' indexer leaves that choice to its top-k's algorithm). A token's
selection is a list of blocks (``select_blocks``: the top blocks, then its open
group's block), which attention reads (``selected_attention``).

Scoring and attention are custom operators, one implementation per device fixed at
preparation: the torch references here on the CPU (gathers of the whole context,
numerical references), the Triton kernels of ``ignition.components.triton_selector``
on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ignition.components.kv_cache import NULL_PAGE, write_layer_rows

NormFn = Callable[[torch.Tensor], torch.Tensor]
RopeFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SelectorGeometry:
    ratio: int  # tokens per block
    budget: int  # selected tokens from complete blocks
    page_size: int

    @property
    def top_blocks(self) -> int:
        return self.budget // self.ratio

    @property
    def blocks_per_page(self) -> int:
        return self.page_size // self.ratio


def _extended_keys(
    ring: torch.Tensor, tags: torch.Tensor, keys: torch.Tensor, start: torch.Tensor
) -> torch.Tensor:
    """Raw keys of positions ``[start - ratio, start + tokens)`` per row: the first
    ``ratio`` from the ring (zeros where it does not hold that position), then the
    rows' new keys. ``ring [rows, ratio, Di]``, ``tags [rows, ratio]``, ``keys [rows,
    tokens, Di]``, ``start [rows]``."""
    ratio = ring.shape[1]
    before = start.view(-1, 1) - ratio + torch.arange(ratio, device=keys.device)  # [R, r]
    entry = before.remainder(ratio)
    held = ring.gather(1, entry.unsqueeze(-1).expand(-1, -1, ring.shape[-1]))
    holds = tags.gather(1, entry) == before
    held = torch.where(holds.unsqueeze(-1), held, 0)
    return torch.cat([held.to(keys.dtype), keys], dim=1)


def write_blocks(
    selectors: torch.Tensor,
    layer: int,
    ring: torch.Tensor,
    tags: torch.Tensor,
    keys: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    page_tables: torch.Tensor,
    geometry: SelectorGeometry,
    norm: NormFn,
    rope: RopeFn,
    cos_sin: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """Consume raw index ``keys [rows, tokens, Di]`` (the first ``n_valid`` of each
    row real, from position ``start``): write the key of every block they complete
    into ``selectors[layer] [pages, blocks_per_page, Di]`` and the ring and tags (the
    rows' copies, updated in place) after the last valid token.
    ``cos_sin(positions)`` gives the rotary rows."""
    rows, tokens, dim = keys.shape
    r = geometry.ratio
    device = keys.device
    ext = _extended_keys(ring, tags, keys, start)  # [R, r + T, Di]
    # Blocks that can complete in these tokens: from the open group's block on.
    first = torch.div(start, r, rounding_mode="floor")  # [R]
    candidates = first.view(-1, 1) + torch.arange(tokens // r + 1, device=device)  # [R, B]
    end = (candidates + 1) * r  # one past each block's last position
    done = (end > start.view(-1, 1)) & (end <= (start + n_valid).view(-1, 1))
    index = candidates.unsqueeze(-1) * r - start.view(-1, 1, 1) + r
    index = (index + torch.arange(r, device=device)).clamp(0, ext.shape[1] - 1)  # [R, B, r]
    members = ext.gather(1, index.view(rows, -1, 1).expand(-1, -1, dim)).view(rows, -1, r, dim)
    pooled = members.float().mean(dim=2).to(keys.dtype)  # [R, B, Di]
    cos, sin = cos_sin((candidates * r).clamp(min=0))
    block_keys = rope(norm(pooled), cos, sin)
    logical = torch.div(candidates * r, geometry.page_size, rounding_mode="floor")
    logical = logical.clamp(0, page_tables.shape[1] - 1)
    page = page_tables.gather(1, logical.to(torch.int64)).to(torch.int64)
    page = torch.where(done, page, NULL_PAGE)
    offset = candidates.remainder(geometry.blocks_per_page)
    target = (page * geometry.blocks_per_page + offset).view(-1)
    values = torch.where(done.unsqueeze(-1), block_keys, 0).view(-1, dim)
    write_layer_rows(selectors, layer, target, values)
    # The ring after the last valid token: entry i holds the latest position <= last
    # with p % r == i, taken from these tokens when it is one of them.
    last = (start + n_valid - 1).view(-1, 1)
    entry = torch.arange(r, device=device).view(1, -1)
    latest = last - (last - entry).remainder(r)  # [R, r]
    fresh = (latest >= start.view(-1, 1)) & (n_valid.view(-1, 1) > 0)
    src = (latest - start.view(-1, 1) + r).clamp(0, ext.shape[1] - 1)
    new = ext.gather(1, src.unsqueeze(-1).expand(-1, -1, dim))
    ring.copy_(torch.where(fresh.unsqueeze(-1), new.to(ring.dtype), ring))
    tags.copy_(torch.where(fresh, latest.to(tags.dtype), tags))


def block_scores_ref(
    q: torch.Tensor,
    selectors: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    """fp32 scores ``[tokens, blocks]`` of each query ``q [tokens, heads, Di]`` against
    every block its table row reaches (``selectors [pages, blocks_per_page, Di]``), as
    Transformers' indexer computes them; -inf where the block is not complete at the
    token's position or the token is not valid."""
    tokens, _, dim = q.shape
    rows = tables.shape[0]
    blocks = selectors.index_select(0, tables.to(torch.int64).view(-1)).view(rows, -1, dim)
    per_row = q.view(rows, tokens_per_row, *q.shape[1:])
    scores = torch.einsum("rthd,rbd->rtbh", per_row.float(), blocks.float())
    scores = (torch.relu(scores).sum(dim=-1) / math.sqrt(dim)).reshape(tokens, -1)
    complete = torch.div(positions + 1, ratio, rounding_mode="floor")
    block = torch.arange(scores.shape[1], device=q.device)
    keep = (block < complete.unsqueeze(-1)) & valid.unsqueeze(-1)
    return torch.where(keep, scores, float("-inf")).contiguous()


_LAST_INDEX = (1 << 31) - 1
_UNRANKED = torch.iinfo(torch.int64).min


def _ranked(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys ``[tokens, blocks]`` of fp32 ``scores`` that order blocks as
    selection ranks them: by score, and equal scores by the earlier block (a stable
    descending sort's order); ``_UNRANKED`` where the score is -inf. Scores are sums
    of ReLUs, so many blocks can score exactly 0: ``torch.topk`` breaks such ties by
    its algorithm, which changes with the row's length and the device (the table's
    width would then change a selection), and Transformers' own choice among them is
    its CPU top-k's. A float's bits, with a negative one's magnitude bits flipped,
    order as the float (-0.0 is first made the +0.0 it equals; NaN ranks first, as
    ``torch.topk`` ranks it)."""
    if scores.dtype != torch.float32:
        raise TypeError(f"block scores are float32, not {scores.dtype}")
    bits = torch.where(scores == 0, 0.0, scores).view(torch.int32)
    ordered = torch.where(bits < 0, bits ^ _LAST_INDEX, bits).to(torch.int64)
    index = torch.arange(scores.shape[-1], device=scores.device)
    keys = ordered * (1 << 32) + (_LAST_INDEX - index)
    return torch.where(scores != float("-inf"), keys, _UNRANKED)


def select_blocks(
    scores: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, geometry: SelectorGeometry
) -> torch.Tensor:
    """int32 ``[tokens, top_blocks + 1]``: the top ``budget / ratio`` complete blocks of
    each token (-1 where fewer are complete; equal scores pick the earlier block), then
    its open group's block when the group has tokens (the tail, up to and including
    the token), else -1."""
    r = geometry.ratio
    k = min(geometry.top_blocks, scores.shape[-1])
    top = _ranked(scores).topk(k, dim=-1).values
    picked = torch.where(top != _UNRANKED, _LAST_INDEX - (top & _LAST_INDEX), -1)
    complete = torch.div(positions + 1, r, rounding_mode="floor")
    open_group = ((positions + 1) % r != 0) & valid
    tail = torch.where(open_group, complete, -1)
    return torch.cat([picked, tail.unsqueeze(-1)], dim=-1).to(torch.int32)


def token_mask(
    blocks: torch.Tensor, positions: torch.Tensor, context: int, ratio: int
) -> torch.Tensor:
    """bool ``[tokens, context]``: the positions of each token's selected blocks, never
    past the token."""
    position = torch.arange(context, device=blocks.device)
    block = torch.div(position, ratio, rounding_mode="floor")
    chosen = (block.view(1, -1, 1) == blocks.unsqueeze(1)).any(dim=-1)
    return chosen & (position.view(1, -1) <= positions.view(-1, 1))


def selected_attention_ref(
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
    ``blocks`` in one layer's pages ``kv [2, pages, page_size, kv_heads, head_dim]``,
    with eager attention's arithmetic (scores and the weighted sum in the query
    dtype, the softmax in fp32). Tokens that select nothing give zeros."""
    tokens, heads, head_dim = q.shape
    rows, kv_heads = tables.shape[0], kv.shape[3]
    pages = tables.to(torch.int64)
    k = kv[0].index_select(0, pages.view(-1)).view(rows, -1, kv_heads, head_dim)
    v = kv[1].index_select(0, pages.view(-1)).view(rows, -1, kv_heads, head_dim)
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=2).to(q.dtype)  # [R, L, H, D]
    v = v.repeat_interleave(group, dim=2).to(q.dtype)
    mask = token_mask(blocks, positions, k.shape[1], ratio).view(rows, tokens_per_row, -1)
    per_row = q.view(rows, tokens_per_row, heads, head_dim)
    scores = torch.einsum("rthd,rlhd->rhtl", per_row, k) * scale
    scores = scores.masked_fill(~mask.unsqueeze(1), torch.finfo(q.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = torch.where(mask.any(-1).unsqueeze(1).unsqueeze(-1), weights, 0)
    out = torch.einsum("rhtl,rlhd->rthd", weights, v)
    return out.reshape(tokens, heads, head_dim).contiguous()


@torch.library.custom_op("flare::qsa_block_scores", mutates_args=())
def block_scores(
    q: torch.Tensor,
    selectors: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    """``block_scores_ref``; on CUDA the Triton kernel (``triton_selector``)."""
    return block_scores_ref(q, selectors, tables, tokens_per_row, positions, valid, ratio)


@block_scores.register_kernel("cuda")
def _block_scores_cuda(
    q: torch.Tensor,
    selectors: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    from ignition.components import triton_selector

    return triton_selector.triton_block_scores(
        q, selectors, tables, tokens_per_row, positions, valid.to(torch.int32), ratio
    )


@block_scores.register_fake
def _block_scores_fake(
    q: torch.Tensor,
    selectors: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    positions: torch.Tensor,
    valid: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    blocks = tables.shape[1] * selectors.shape[1]
    return q.new_empty(q.shape[0], blocks, dtype=torch.float32)


@torch.library.custom_op("flare::qsa_selected_attention", mutates_args=())
def selected_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    blocks: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    scale: float,
) -> torch.Tensor:
    """``selected_attention_ref``; on CUDA the Triton kernel (``triton_selector``)."""
    return selected_attention_ref(q, kv, tables, tokens_per_row, blocks, positions, ratio, scale)


@selected_attention.register_kernel("cuda")
def _selected_attention_cuda(
    q: torch.Tensor,
    kv: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    blocks: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    scale: float,
) -> torch.Tensor:
    from ignition.components import triton_selector

    return triton_selector.triton_selected_attention(
        q, kv, tables, tokens_per_row, blocks, positions, ratio, scale
    )


@selected_attention.register_fake
def _selected_attention_fake(
    q: torch.Tensor,
    kv: torch.Tensor,
    tables: torch.Tensor,
    tokens_per_row: int,
    blocks: torch.Tensor,
    positions: torch.Tensor,
    ratio: int,
    scale: float,
) -> torch.Tensor:
    return q.new_empty(q.shape)
