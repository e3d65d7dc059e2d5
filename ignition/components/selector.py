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
for incomplete blocks; a -inf pick is not selected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ignition.components.kv_cache import NULL_PAGE

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
    into ``selectors [pages, blocks_per_page, Di]`` (one layer) and the ring and tags
    after the last valid token. ``cos_sin(positions)`` gives the rotary rows."""
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
    flat = selectors.view(-1, dim)
    target = (page * geometry.blocks_per_page + offset).view(-1)
    flat.index_copy_(0, target, torch.where(done.unsqueeze(-1), block_keys, 0).view(-1, dim))
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


def select_tokens(
    q: torch.Tensor,
    selectors: torch.Tensor,
    positions: torch.Tensor,
    valid: torch.Tensor,
    page_tables: torch.Tensor,
    geometry: SelectorGeometry,
) -> torch.Tensor:
    """The token mask ``[rows, tokens, context]`` (context = the page table's reach)
    of each query ``q [rows, tokens, heads, Di]`` at ``positions [rows, tokens]``:
    selected complete blocks and the open tail, never past the query. Queries that
    are not ``valid`` select nothing."""
    rows, _, _, dim = q.shape
    r = geometry.ratio
    device = q.device
    pages = page_tables.to(torch.int64)
    blocks = selectors.index_select(0, pages.view(-1)).view(rows, -1, dim)  # [R, NB, Di]
    n_blocks = blocks.shape[1]
    scores = torch.einsum("rthd,rbd->rtbh", q.float(), blocks.float())
    scores = torch.relu(scores).sum(dim=-1) / math.sqrt(dim)  # [R, T, NB]
    complete = torch.div(positions + 1, r, rounding_mode="floor")  # [R, T]
    block = torch.arange(n_blocks, device=device)
    scores = torch.where(block < complete.unsqueeze(-1), scores, float("-inf"))
    k = min(geometry.top_blocks, n_blocks)
    top = scores.topk(k, dim=-1)
    picked = torch.where(top.values > float("-inf"), top.indices, -1)  # [R, T, k]
    context = n_blocks * r
    position = torch.arange(context, device=device)
    in_block = (
        torch.div(position, r, rounding_mode="floor").view(1, 1, -1, 1) == picked.unsqueeze(2)
    ).any(dim=-1)
    tail = (position >= (complete * r).unsqueeze(-1)) & (position <= positions.unsqueeze(-1))
    return (in_block | tail) & valid.unsqueeze(-1)


def sparse_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_tables: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Attention of ``q [rows, tokens, heads, head_dim]`` over the tokens of ``mask
    [rows, tokens, context]`` in one layer's pages ``kv [2, pages, page_size, kv_heads,
    head_dim]``, with eager attention's arithmetic (scores and the weighted sum in the
    query dtype, the softmax in fp32). Rows that select nothing give zeros."""
    rows, tokens, heads, head_dim = q.shape
    kv_heads = kv.shape[3]
    pages = page_tables.to(torch.int64)
    k = kv[0].index_select(0, pages.view(-1)).view(rows, -1, kv_heads, head_dim)
    v = kv[1].index_select(0, pages.view(-1)).view(rows, -1, kv_heads, head_dim)
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=2).to(q.dtype)  # [R, L, H, D]
    v = v.repeat_interleave(group, dim=2).to(q.dtype)
    scores = torch.einsum("rthd,rlhd->rhtl", q, k) * scaling
    scores = scores.masked_fill(~mask.unsqueeze(1), torch.finfo(q.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    weights = torch.where(mask.any(-1).view(rows, 1, tokens, 1), weights, 0)
    return torch.einsum("rhtl,rlhd->rthd", weights, v)
