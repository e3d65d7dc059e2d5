"""Triton kernel writing one layer's K/V of a step into the paged cache.

One program per token copies its keys and values ``[kv_heads, head_dim]`` to its
flat cache row. Tokens that are not live (padding, finished requests) have rows in
the null page; they store zeros there instead of their values, so whichever of
several such tokens lands last, the null page holds the same bytes: it stays zero,
and the cache's contents never depend on a write race.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    rows_ptr,
    cache_k_ptr,
    cache_v_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    HEAD_DIM: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    row = tl.load(rows_ptr + t).to(tl.int64)
    live = row >= PAGE_SIZE  # rows below PAGE_SIZE belong to the null page
    offs = tl.arange(0, BLOCK)
    ok = offs < WIDTH
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    k = tl.load(k_ptr + t * stride_kt + head * stride_kh + dim, mask=ok, other=0.0)
    v = tl.load(v_ptr + t * stride_vt + head * stride_vh + dim, mask=ok, other=0.0)
    k = tl.where(live, k, 0.0)
    v = tl.where(live, v, 0.0)
    dst = row * WIDTH + offs
    tl.store(cache_k_ptr + dst, k.to(cache_k_ptr.dtype.element_ty), mask=ok)
    tl.store(cache_v_ptr + dst, v.to(cache_v_ptr.dtype.element_ty), mask=ok)


def triton_write_kv(layer_kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor):
    """``layer_kv [2, pages, page_size, kv_heads, head_dim]`` (contiguous); ``k``, ``v``
    ``[tokens, kv_heads, head_dim]`` with unit stride in head_dim; ``rows`` int64."""
    _, _, page_size, kv_heads, head_dim = layer_kv.shape
    if not layer_kv.is_contiguous():
        raise ValueError("the layer's cache must be contiguous")
    if k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("k and v need unit stride in head_dim")
    tokens = k.shape[0]
    if tokens == 0:
        return
    width = kv_heads * head_dim
    _write_kv_kernel[(tokens,)](
        k,
        v,
        rows,
        layer_kv[0],
        layer_kv[1],
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        HEAD_DIM=head_dim,
        WIDTH=width,
        BLOCK=triton.next_power_of_2(width),
        PAGE_SIZE=page_size,
        num_warps=4,
    )
