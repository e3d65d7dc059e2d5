"""Paged attention for the serving graphs of dense Llama/Qwen3-style models.

GQA, RoPE already applied to q and k by the caller. One layer's KV cache is
``kv[2, num_pages, page_size, num_kv_heads, head_dim]`` (``kv[0]`` keys, ``kv[1]``
values); a request's token at absolute position ``p`` lives in page
``page_table[p // page_size]``, row ``p % page_size``; page 0 is a reserved null page.
Query head ``h`` uses kv head ``h // (num_heads // num_kv_heads)``.

Two implementations per operation:

* ``triton_paged_*``: the Triton kernels (``triton_attention.py``), safe to capture in a
  CUDA graph and replay with new metadata (every per-step value is read on the device).
* ``paged_*_ref``: float32 torch references that gather the pages into a contiguous
  history. They use ``.item()`` and python loops: numerical references only, never
  captured.

Which one a device gets is preparation's decision, made once where the operators are
registered (``ignition.components.kv_cache``: Triton on CUDA, the reference on the CPU).
"""

from __future__ import annotations

import torch

__all__ = [
    "paged_decode_attention_ref",
    "paged_prefill_attention_ref",
    "triton_paged_decode_attention",
    "triton_paged_decode_attention_rope",
    "triton_paged_prefill_attention",
    "triton_paged_prefill_attention_rope",
]

DEFAULT_NUM_SPLITS = 16


def triton_paged_decode_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int = DEFAULT_NUM_SPLITS,
) -> torch.Tensor:
    """Split-KV Triton decode attention for one query token per row over that row's cached tokens.

    q: ``[B, num_heads, head_dim]``; page_table: int32 ``[B, max_pages]``; seq_lens: int32
    ``[B]``, the number of cached tokens row ``b`` attends to (positions
    ``[0, seq_lens[b])``), its own token included. A row with seq_len 0 is padding: its
    output is zero and none of its pages is read. Returns ``[B, num_heads, head_dim]``.

    The Triton path is batch invariant: a row's result depends only on its own q, pages,
    seq_len and ``num_splits``, bitwise, whatever the batch around it.
    """
    # Imported lazily: Triton must not be imported before TRITON_INTERPRET is settled,
    # and the references must work where Triton is absent.
    from ignition.components import triton_attention

    return triton_attention.triton_paged_decode_attention(
        q, kv, page_table, seq_lens, scale, num_splits=num_splits
    )


def triton_paged_decode_attention_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    heads: int,
) -> torch.Tensor:
    """``triton_paged_decode_attention`` of the packed projection ``qkv`` of decode
    rows, finished (q/k norms, rotary, the K/V write to ``rows``) inside its split
    kernel (``triton_attention.triton_paged_decode_attention_rope``)."""
    from ignition.components import triton_attention

    rope = triton_attention.RopeInputs(qkv, q_weight, k_weight, eps, cos, sin, rows)
    return triton_attention.triton_paged_decode_attention_rope(
        rope, kv, page_table, seq_lens, scale, heads
    )


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
    """Flash-attention-style Triton causal attention for one request's prefill chunk.

    q: ``[T, num_heads, head_dim]`` with T the captured chunk capacity; page_table_row:
    int32 ``[max_pages]``; start: int32 ``[1]``, the absolute position of ``q[0]``;
    n_valid: int32 ``[1]``, the number of real tokens. Row ``i < n_valid`` attends keys
    ``[0, start + i]`` (the chunk's own keys are already in the cache); rows
    ``i >= n_valid`` are padding, come back as zeros and affect no other row.

    ``num_splits`` (split-KV over the context's pages, for short chunks after a long
    history) defaults to a count picked from the shapes; 1 is the single-pass kernel.
    ``block_t``, ``key_pages`` (the tile's tokens and pages per key step), ``num_warps``
    and ``num_stages`` default to the tiling picked from the shapes. ``longest_first``
    (the default) starts the single-pass kernel's tiles that walk the most keys first;
    the order changes no bits.
    """
    from ignition.components import triton_attention

    return triton_attention.triton_paged_prefill_attention(
        q,
        kv,
        page_table_row,
        start,
        n_valid,
        scale,
        block_t=block_t,
        num_splits=num_splits,
        key_pages=key_pages,
        num_warps=num_warps,
        num_stages=num_stages,
        longest_first=longest_first,
    )


def triton_paged_prefill_attention_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    kv: torch.Tensor,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
    heads: int,
) -> torch.Tensor:
    """``triton_paged_prefill_attention`` of a long chunk's packed projection ``qkv``,
    finished and written to the cache first: the chunk's attention within itself by
    PyTorch's flash kernel, its history by the Triton kernel, the two merged
    (``triton_attention.triton_paged_prefill_attention_rope``)."""
    from ignition.components import triton_attention

    rope = triton_attention.RopeInputs(qkv, q_weight, k_weight, eps, cos, sin, rows)
    return triton_attention.triton_paged_prefill_attention_rope(
        rope, kv, page_table_row, start, n_valid, scale, heads
    )


def _gather_history(
    kv: torch.Tensor, page_table_row: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of positions ``[0, length)`` as float32 ``[length, kv_heads, dim]``."""
    page_size, num_kv_heads, head_dim = kv.shape[2:]
    num_pages = -(-length // page_size)
    pages = page_table_row[:num_pages].long()
    history = kv[:, pages].float().reshape(2, num_pages * page_size, num_kv_heads, head_dim)
    return history[0, :length], history[1, :length]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    """float32 causal attention: q ``[T, H, D]`` at absolute ``positions`` ``[T]`` over
    k/v ``[n, KVH, D]`` holding positions ``[0, n)``. Returns ``[T, H, D]``."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,nhd->htn", q, k) * scale
    key_pos = torch.arange(k.shape[0], device=q.device)
    visible = key_pos[None, :] <= positions[:, None]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    return torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v)


def paged_decode_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """float32 reference for ``triton_paged_decode_attention`` (host loops; not capturable)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for b in range(q.shape[0]):
        length = int(seq_lens[b].item())
        if length == 0:
            continue
        k, v = _gather_history(kv, page_table[b], length)
        positions = torch.tensor([length - 1], device=q.device)
        out[b] = _attend(q[b : b + 1].float(), k, v, positions, scale)[0]
    return out.to(q.dtype)


def paged_prefill_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """float32 reference for ``triton_paged_prefill_attention`` (host loops; not capturable)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    first = int(start.item())
    count = min(int(n_valid.item()), q.shape[0])
    if count > 0:
        k, v = _gather_history(kv, page_table_row, first + count)
        positions = first + torch.arange(count, device=q.device)
        out[:count] = _attend(q[:count].float(), k, v, positions, scale)
    return out.to(q.dtype)
