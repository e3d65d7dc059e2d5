"""Triton kernels for a few tokens' routed experts: each (token, slot) pair reads its
expert's weights once, as a matrix-vector product, with nothing sorted or grouped.

At decode (a handful of tokens, ``k`` experts each) Transformers' ``grouped_mm`` path
sorts the pairs by expert and runs CUTLASS grouped GEMMs whose 64-row tiles hold one
or two rows: at the hybrid's H200 geometry about 1.7 TB/s at one token. Here:

- ``_gate_up_kernel``: program (pair, column block) reads its expert's gate and up
  rows for the block and the token's hidden vector, and writes the GLU product
  ``silu(gate) * up`` of the block;
- ``_down_kernel``: program (token, column block) runs the down projection of each of
  the token's ``k`` slots for the block, scales it by the slot's routing weight and
  sums the slots in order;
- or, with ``DOWN_BY_SLOT``, ``_down_slot_kernel``: program (pair, column block)
  writes one slot's weighted down projection, ``k`` times the programs for one
  token, and ``_slot_sum_kernel`` sums each token's slots in the same order: the same
  values (each weighted slot is rounded before the sum either way), for a launch more.

Rounding follows Transformers' ``grouped_mm`` path step by step (to the operands'
dtype after each of its operations: the projections, silu, the product, the
weighting; fp32 for the sum over slots) and silu is computed as PyTorch computes it,
so only the order of each dot product's additions differs. A token's
result depends on its own routing alone: bitwise the same at every batch size.
Pairs that share an expert read it once each (at 4 tokens, 40 reads for about 35
distinct experts of 128), which is why preparation uses these only for few tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ignition.components.triton_attention import _INTERPRETED

# Output columns per program, and the reduction step. Measured on the H200 at its
# expert geometry (top-10 of 640-wide experts, hidden 2560; bench/experts_bench.py,
# results under bench/results/issue22/2026-12-03-h200-kernels): 8 and 8 was the
# fastest of the four choices at 1 and 4 tokens (63.7 and 125.6 us a layer, against
# grouped_mm's 112.1 and 211.6 us). At one token the gate/up grid is 10 x 80
# programs and the down grid 1 x 320.
GATE_UP_BLOCK_N = 8
DOWN_BLOCK_N = 8
BLOCK_K = 256
# Whether the down projection runs one program per (pair, column block) and sums the
# slots in a second kernel: at one token the fused kernel's 320 programs each walk
# ten experts one after another (36.5 us a layer on the H200, 0.9 TB/s). Measured on
# the H200 (bench/experts_bench.py, bench/results/issue22/2026-12-03-h200-serve): a
# layer's experts in 39.4 us against the fused kernel's 63.1 at one token (2.50 TB/s)
# and 116.1 against 126.1 at four, the same bits.
DOWN_BY_SLOT = True
SUM_BLOCK = 256


@triton.jit
def _round(x, BF16: tl.constexpr):
    """fp32 ``x`` at the operands' precision: rounded to the nearest bf16 (ties to
    even, by its bits: Triton's interpreter truncates in ``.to(tl.bfloat16)``) when
    BF16, else unchanged."""
    if BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        # NaN stays NaN (its bits would carry into the sign or the exponent).
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    return x


@triton.jit
def _silu(x, ACCURATE: tl.constexpr):
    """``x / (1 + exp(-x))`` as PyTorch's silu computes it in fp32: libdevice's exp
    and a rounded division on the GPU (``tl.exp`` and ``/`` compile to approximate
    instructions); the interpreter's are NumPy's, exact already."""
    if ACCURATE:
        out = tl.math.div_rn(x, 1.0 + libdevice.exp(-x))
    else:
        out = x / (1.0 + tl.exp(-x))
    return out


@triton.jit
def _mul(a, b, ACCURATE: tl.constexpr):
    """``a * b`` rounded to fp32 on its own: on the GPU a product that an addition
    consumes may be contracted into a fused multiply-add, which rounds once where
    Transformers' path (and a product stored before its sum) rounds twice; the
    interpreter's NumPy product is rounded already."""
    if ACCURATE:
        out = libdevice.mul_rn(a, b)
    else:
        out = a * b
    return out


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    index_ptr,
    out_ptr,
    stride_xt,
    stride_we,
    stride_wn,
    stride_ot,
    K_SLOTS: tl.constexpr,
    HIDDEN: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    pair = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = cols < INTER
    token = pair // K_SLOTS
    expert = tl.load(index_ptr + pair).to(tl.int64)
    gate_rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn
    up_rows = gate_rows + INTER * stride_wn
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < HIDDEN
        x = tl.load(x_ptr + token * stride_xt + ks, mask=kmask, other=0.0).to(tl.float32)
        wmask = keep[:, None] & kmask[None, :]
        g = tl.load(gate_rows + ks[None, :], mask=wmask, other=0.0).to(tl.float32)
        u = tl.load(up_rows + ks[None, :], mask=wmask, other=0.0).to(tl.float32)
        gate += tl.sum(g * x[None, :], axis=1)
        up += tl.sum(u * x[None, :], axis=1)
    gate = _round(gate, BF16)
    act = _round(_silu(gate, ACCURATE), BF16)
    product = _round(act * _round(up, BF16), BF16)
    tl.store(out_ptr + pair * stride_ot + cols, product.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _weighted_down(
    h_ptr,
    w_ptr,
    index_ptr,
    weight_ptr,
    pair,
    cols,
    keep,
    stride_hp,
    stride_we,
    stride_wn,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    """One pair's down projection for the column block, rounded, scaled by its routing
    weight and rounded again, as Transformers' path rounds it."""
    expert = tl.load(index_ptr + pair).to(tl.int64)
    scale = tl.load(weight_ptr + pair).to(tl.float32)
    rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < INTER
        h = tl.load(h_ptr + pair * stride_hp + ks, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(rows + ks[None, :], mask=keep[:, None] & kmask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
    return _round(_mul(_round(acc, BF16), scale, ACCURATE), BF16)


@triton.jit
def _down_kernel(
    h_ptr,
    w_ptr,
    index_ptr,
    weight_ptr,
    out_ptr,
    stride_hp,
    stride_we,
    stride_wn,
    stride_ot,
    K_SLOTS: tl.constexpr,
    HIDDEN: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = cols < HIDDEN
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for slot in range(K_SLOTS):
        total += _weighted_down(
            h_ptr,
            w_ptr,
            index_ptr,
            weight_ptr,
            token * K_SLOTS + slot,
            cols,
            keep,
            stride_hp,
            stride_we,
            stride_wn,
            INTER,
            BLOCK_N,
            BLOCK_K,
            BF16,
            ACCURATE,
        )
    total = _round(total, BF16)
    tl.store(out_ptr + token * stride_ot + cols, total.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _down_slot_kernel(
    h_ptr,
    w_ptr,
    index_ptr,
    weight_ptr,
    out_ptr,
    stride_hp,
    stride_we,
    stride_wn,
    stride_op,
    HIDDEN: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BF16: tl.constexpr,
    ACCURATE: tl.constexpr,
):
    pair = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = cols < HIDDEN
    weighted = _weighted_down(
        h_ptr,
        w_ptr,
        index_ptr,
        weight_ptr,
        pair,
        cols,
        keep,
        stride_hp,
        stride_we,
        stride_wn,
        INTER,
        BLOCK_N,
        BLOCK_K,
        BF16,
        ACCURATE,
    )
    tl.store(out_ptr + pair * stride_op + cols, weighted, mask=keep)


@triton.jit
def _slot_sum_kernel(
    in_ptr,
    out_ptr,
    stride_ip,
    stride_ot,
    K_SLOTS: tl.constexpr,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    BF16: tl.constexpr,
):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < HIDDEN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for slot in range(K_SLOTS):
        pair = token * K_SLOTS + slot
        total += tl.load(in_ptr + pair * stride_ip + cols, mask=keep, other=0.0)
    total = _round(total, BF16)
    tl.store(out_ptr + token * stride_ot + cols, total.to(out_ptr.dtype.element_ty), mask=keep)


def triton_routed_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """``[tokens, hidden]``: each token's routed experts (``index``, ``weights``
    ``[tokens, k]``) over ``x [tokens, hidden]``, ``gate_up [experts, 2 * inter,
    hidden]`` and ``down [experts, hidden, inter]`` (module docs)."""
    tokens, hidden = x.shape
    slots = index.shape[1]
    inter = down.shape[2]
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"routed experts run in bf16 or fp32, not {x.dtype}")
    if gate_up.stride(2) != 1 or down.stride(2) != 1 or x.stride(1) != 1:
        raise ValueError("expert weights and hidden states must be contiguous in their rows")
    index = index.contiguous()
    weights = weights.contiguous()
    products = torch.empty(tokens * slots, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(tokens * slots, triton.cdiv(inter, GATE_UP_BLOCK_N))](
        x,
        gate_up,
        index,
        products,
        x.stride(0),
        gate_up.stride(0),
        gate_up.stride(1),
        products.stride(0),
        K_SLOTS=slots,
        HIDDEN=hidden,
        INTER=inter,
        BLOCK_N=GATE_UP_BLOCK_N,
        BLOCK_K=BLOCK_K,
        BF16=x.dtype == torch.bfloat16,
        ACCURATE=not _INTERPRETED,
        num_warps=4,
    )
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    down_k = min(BLOCK_K, triton.next_power_of_2(inter))
    if DOWN_BY_SLOT:
        # fp32, so the sum adds exactly the values the fused kernel adds.
        weighted = torch.empty(tokens * slots, hidden, dtype=torch.float32, device=x.device)
        _down_slot_kernel[(tokens * slots, triton.cdiv(hidden, DOWN_BLOCK_N))](
            products,
            down,
            index,
            weights,
            weighted,
            products.stride(0),
            down.stride(0),
            down.stride(1),
            weighted.stride(0),
            HIDDEN=hidden,
            INTER=inter,
            BLOCK_N=DOWN_BLOCK_N,
            BLOCK_K=down_k,
            BF16=x.dtype == torch.bfloat16,
            ACCURATE=not _INTERPRETED,
            num_warps=4,
        )
        _slot_sum_kernel[(tokens, triton.cdiv(hidden, SUM_BLOCK))](
            weighted,
            out,
            weighted.stride(0),
            out.stride(0),
            K_SLOTS=slots,
            HIDDEN=hidden,
            BLOCK=SUM_BLOCK,
            BF16=x.dtype == torch.bfloat16,
            num_warps=4,
        )
        return out
    _down_kernel[(tokens, triton.cdiv(hidden, DOWN_BLOCK_N))](
        products,
        down,
        index,
        weights,
        out,
        products.stride(0),
        down.stride(0),
        down.stride(1),
        out.stride(0),
        K_SLOTS=slots,
        HIDDEN=hidden,
        INTER=inter,
        BLOCK_N=DOWN_BLOCK_N,
        BLOCK_K=down_k,
        BF16=x.dtype == torch.bfloat16,
        ACCURATE=not _INTERPRETED,
        num_warps=4,
    )
    return out
