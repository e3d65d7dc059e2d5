"""Triton kernel finishing a layer's QKV projection: the q/k norms (when the model
has them) and rotary embeddings, the queries out, the keys and values into the
paged cache, in one launch.

One program per block of tokens and head of the packed projection ``[tokens, (heads +
2 * kv_heads) * head_dim]``: a query head is normalized, rotated and stored to ``q``;
a kv head's keys are normalized and rotated, and its keys and values stored to each
token's flat cache row. Decode's few rows take one token a program (one warp); a
prefill chunk takes ``PREFILL_TOKENS`` a program over four warps: one token a program
left each 128-byte program at a few loads in flight, and a 4,096-token chunk of the
8B geometry took 198 us a layer on an H100, against about 35 for its bytes, and 39 at
16 tokens a program (``bench/results/issue23/2026-12-06i-h100-prefill-rope/``). The
arithmetic is the canonical eager one, rounding to the execution dtype where eager
torch does (Qwen3's ``RMSNorm``: the normalized vector, then its product with the
weight; ``apply_rotary_pos_emb``: ``q * cos``, ``rotate_half(q) * sin`` and their
sum), so only the norm's fp32 statistic can differ: its sum of squares in another
order (one spelled-out order, the same in every kernel that finishes a projection:
``_sum_of_squares``), and its reciprocal square root computed as a division. A
token's result never depends on the other tokens.

Tokens that are not live (padding, finished requests) have rows in the null page;
they store zeros there instead of their values, so whichever of several such tokens
lands last, the null page holds the same bytes: it stays zero, and the cache's
contents never depend on a write race.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.linear import _log2, _pair_sums
from ignition.components.programmatic_launch import await_producer, kernel_options


@triton.jit
def _rounded(x, dtype: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (to nearest, ties to even), back in fp32. For
    bfloat16 by integer arithmetic: through a pair of casts the compiler narrows a
    product to a bfloat16 multiply and fuses it with the sum that follows into one
    FMA, which skips eager's rounding of the product (on the H200, a rotary output in
    about five differed from eager's by one bfloat16 step). A NaN stays NaN: the
    GPU's is 0x7FFFFFFF, which the integer rounding would carry into -0.0."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return tl.where(x != x, x, ((bits >> 16) << 16).to(tl.float32, bitcast=True))
    else:
        return x.to(dtype).to(tl.float32)


# Tokens a program of a prefill chunk finishes (at four warps), and the rows from which
# a launch counts as one.
PREFILL_TOKENS = 16
PREFILL_ROWS = 64


@triton.jit
def _sum_of_squares(f1, f2, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``[ROWS, 1]`` fp32: each row's sum of ``f1``'s and ``f2``'s squares (a head's
    two halves, ``[ROWS, BLOCK]`` each, zeros past the head) by one spelled-out order,
    whatever the kernel's warps, layout or rows: ``fma(f1, f1, f2 * f2)`` element by
    element, then a pairwise tree along the row. A ``tl.sum``'s order follows the
    layout, which the warps change: this kernel (one warp for decode, four for
    prefill) and decode attention's split kernel (four), which finishes decode's rows
    with this arithmetic, summed a 128-wide head in different orders. The first level
    is an explicit FMA so that no compiler contraction can differ either."""
    q = tl.fma(f1, f1, f2 * f2)
    for level in tl.static_range(_log2(BLOCK)):
        q = _pair_sums(q, ROWS, BLOCK >> level)
    return q


@triton.jit
def _norm_rope(
    src,
    w_ptr,
    cos_ptr,
    sin_ptr,
    eps,
    offs,
    ok,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """One head's two rotary halves for each of a block of tokens, ``[ROWS, BLOCK]``:
    normalized (``HAS_NORM``), then rotated. ``offs``: the half's columns, ``[1,
    BLOCK]``; ``src``, ``cos_ptr`` and ``sin_ptr``: each token's row (``[ROWS, 1]``, or
    one row's pointer); ``ok``: the live elements, of the loads' shape."""
    half: tl.constexpr = HEAD_DIM // 2
    dtype = src.dtype.element_ty
    x1 = tl.load(src + offs, mask=ok, other=0.0)
    x2 = tl.load(src + half + offs, mask=ok, other=0.0)
    if HAS_NORM:
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        ROWS: tl.constexpr = x1.shape[0]
        BLOCK: tl.constexpr = x1.shape[1]
        variance = _sum_of_squares(f1, f2, ROWS, BLOCK) / HEAD_DIM
        scale = 1.0 / tl.sqrt(variance + eps)
        in_head = offs < half
        w1 = tl.load(w_ptr + offs, mask=in_head, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + half + offs, mask=in_head, other=0.0).to(tl.float32)
        x1 = (w1 * (f1 * scale).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (f2 * scale).to(dtype).to(tl.float32)).to(dtype)
    c1 = tl.load(cos_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + half + offs, mask=ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + half + offs, mask=ok, other=0.0).to(tl.float32)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    o1 = _rounded(f1 * c1, dtype) + _rounded(-f2 * s1, dtype)
    o2 = _rounded(f2 * c2, dtype) + _rounded(f1 * s2, dtype)
    return o1.to(dtype), o2.to(dtype)


@triton.jit
def _write_kv(
    k_src, v_src, k_w_ptr, cos_ptr, sin_ptr, eps, row, k_dst, v_dst, offs, ok,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    """One kv head of a block of tokens into the cache: their keys normalized and
    rotated (``_norm_rope``) to ``k_dst``, their values as projected to ``v_dst``;
    zeros where a token's flat ``row`` lies in the null page (rows below PAGE_SIZE).
    Pointers and rows as ``_norm_rope`` takes them (``[ROWS, 1]``, or one row's).
    Returns the halves stored (keys, then values), in the cache's dtype."""
    half: tl.constexpr = HEAD_DIM // 2
    live = row >= PAGE_SIZE
    k1, k2 = _norm_rope(k_src, k_w_ptr, cos_ptr, sin_ptr, eps, offs, ok, HEAD_DIM, HAS_NORM)
    v1 = tl.load(v_src + offs, mask=ok, other=0.0)
    v2 = tl.load(v_src + half + offs, mask=ok, other=0.0)
    out_ty = k_dst.dtype.element_ty
    k1 = tl.where(live, k1, 0.0).to(out_ty)
    k2 = tl.where(live, k2, 0.0).to(out_ty)
    v1 = tl.where(live, v1, 0.0).to(out_ty)
    v2 = tl.where(live, v2, 0.0).to(out_ty)
    tl.store(k_dst + offs, k1, mask=ok)
    tl.store(k_dst + half + offs, k2, mask=ok)
    tl.store(v_dst + offs, v1, mask=ok)
    tl.store(v_dst + half + offs, v2, mask=ok)
    return k1, k2, v1, v2


@triton.jit
def _rope_write_kv_kernel(
    qkv_ptr,
    q_w_ptr,
    k_w_ptr,
    cos_ptr,
    sin_ptr,
    rows_ptr,
    q_ptr,
    cache_k_ptr,
    cache_v_ptr,
    eps,
    stride_t,
    stride_cos,
    tokens,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_NORM: tl.constexpr,
    FINISHED: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """Tokens ``BLOCK_T * program_id(0)`` on (of ``tokens``), head ``program_id(1)``
    (the module's docs). With ``FINISHED``, ``q_ptr`` is the whole projection finished,
    ``[tokens, HEADS + 2 * KV_HEADS, HEAD_DIM]``: the queries, then the keys and
    values as the cache holds them. With ``PDL``, launched programmatically: the wait
    before anything else (``programmatic_launch``)."""
    OUT_HEADS: tl.constexpr = HEADS + 2 * KV_HEADS if FINISHED else HEADS
    if PDL:
        await_producer()
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    h = tl.program_id(1)
    half: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, BLOCK)[None, :]
    present = t < tokens
    ok = present & (offs < half)
    src = qkv_ptr + t * stride_t + h * HEAD_DIM
    cos = cos_ptr + t * stride_cos
    sin = sin_ptr + t * stride_cos
    if h < HEADS:
        o1, o2 = _norm_rope(src, q_w_ptr, cos, sin, eps, offs, ok, HEAD_DIM, HAS_NORM)
        q_dst = q_ptr + (t * OUT_HEADS + h) * HEAD_DIM
        tl.store(q_dst + offs, o1, mask=ok)
        tl.store(q_dst + half + offs, o2, mask=ok)
    else:
        j = h - HEADS
        row = tl.load(rows_ptr + t, mask=present, other=0).to(tl.int64)
        k_dst = cache_k_ptr + (row * KV_HEADS + j) * HEAD_DIM
        v_dst = cache_v_ptr + (row * KV_HEADS + j) * HEAD_DIM
        k1, k2, v1, v2 = _write_kv(
            src, src + KV_HEADS * HEAD_DIM, k_w_ptr, cos, sin, eps, row, k_dst, v_dst, offs, ok,
            HEAD_DIM, PAGE_SIZE, HAS_NORM,
        )  # fmt: skip
        if FINISHED:
            k_out = q_ptr + (t * OUT_HEADS + h) * HEAD_DIM
            v_out = k_out + KV_HEADS * HEAD_DIM
            tl.store(k_out + offs, k1, mask=ok)
            tl.store(k_out + half + offs, k2, mask=ok)
            tl.store(v_out + offs, v1, mask=ok)
            tl.store(v_out + half + offs, v2, mask=ok)


def rope_tile(tokens: int) -> tuple[int, int]:
    """(tokens a program, warps) for a launch over ``tokens`` rows: decode's one
    token a program at one warp; a prefill chunk's ``PREFILL_TOKENS`` at four."""
    return (PREFILL_TOKENS, 4) if tokens >= PREFILL_ROWS else (1, 1)


def triton_rope_write_kv(
    layer_kv: torch.Tensor,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    tile: tuple[int, int] | None = None,
    *,
    finished: bool = False,
) -> torch.Tensor:
    """Queries ``[tokens, heads, head_dim]`` of the packed projection ``qkv``, and its
    keys and values written to ``layer_kv [2, pages, page_size, kv_heads, head_dim]``
    (contiguous) at flat ``rows`` (int64). ``cos``/``sin``: ``[tokens, head_dim]``;
    ``q_weight``/``k_weight``: the ``[head_dim]`` norm weights, both or neither.
    ``tile``: (tokens a program, a power of two; warps), ``rope_tile``'s by default;
    a token's bits never depend on it. With ``finished``, the whole projection
    finished, ``[tokens, heads + 2 * kv_heads, head_dim]``: the queries, then the keys
    and values as written (zeros for tokens in the null page)."""
    _, _, page_size, kv_heads, head_dim = layer_kv.shape
    tokens = qkv.shape[0]
    if not layer_kv.is_contiguous():
        raise ValueError("the layer's cache must be contiguous")
    if qkv.shape[1] != (heads + 2 * kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValueError(
            f"qkv {tuple(qkv.shape)} is not a packed projection of {heads} query and "
            f"{kv_heads} kv heads of {head_dim} with unit column stride"
        )
    if cos.shape != (tokens, head_dim) or sin.shape != cos.shape or cos.stride() != sin.stride():
        raise ValueError(f"cos/sin must be [{tokens}, {head_dim}] alike, not {tuple(cos.shape)}")
    if cos.stride(1) != 1 or head_dim % 2:
        raise ValueError("rotary tables need unit column stride over an even head_dim")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q and k norms come together or not at all")
    out_heads = heads + 2 * kv_heads if finished else heads
    q = torch.empty(tokens, out_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    has_norm = q_weight is not None
    block_t, warps = tile or rope_tile(tokens)
    if block_t < 1 or block_t & (block_t - 1):
        raise ValueError(f"tokens a program must be a power of two, not {block_t}")
    _rope_write_kv_kernel[(triton.cdiv(tokens, block_t), heads + kv_heads)](
        qkv, q_weight if has_norm else qkv, k_weight if has_norm else qkv, cos, sin, rows,
        q, layer_kv[0], layer_kv[1], eps, qkv.stride(0), cos.stride(0), tokens,
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(head_dim // 2), BLOCK_T=block_t, PAGE_SIZE=page_size,
        HAS_NORM=has_norm, FINISHED=finished, num_warps=warps, **kernel_options(qkv.device),
    )  # fmt: skip
    return q
