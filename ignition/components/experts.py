"""Routed experts of a few tokens: one operator, ``flare::routed_experts``.

Each token's ``k`` routed experts (SiLU-GLU ``gate_up [experts, 2 * inter, hidden]``,
``down [experts, hidden, inter]``, as Transformers stores them) applied to its hidden
vector, scaled by its routing weights and summed. On CUDA the Triton kernels of
``ignition.components.triton_experts`` run it, one matrix-vector product per (token,
slot) pair; elsewhere ``routed_experts_ref`` does, rounding at the same points as
Transformers' ``grouped_mm`` path (bf16 after each projection, the activation, the
product and the weighting; the slots summed in fp32).

``FUSED_MAX_TOKENS`` bounds where preparation uses it: a decode step at any prepared
concurrency (``INVARIANT_ROWS``), since each pair's result is independent of the
batch, which the grouped GEMMs' (cuBLAS's kernel by group size) is not. Each pair
reads its expert once, so pairs that share an expert read it again: at 8 tokens of
top-10 over 128 experts that is 80 reads for about 60 distinct experts, at 32 tokens
320 for about 118. The sorted grouped GEMMs of a prefill chunk read each expert once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ignition.components.linear import INVARIANT_ROWS

FUSED_MAX_TOKENS = INVARIANT_ROWS


def routed_experts_ref(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """``[tokens, hidden]`` of ``x [tokens, hidden]`` through each token's experts
    ``index [tokens, k]`` weighted by ``weights [tokens, k]`` (module docs)."""
    tokens, slots = index.shape
    pairs = index.reshape(-1)
    rows = x.repeat_interleave(slots, dim=0)  # [tokens * k, hidden]
    # Products summed along each weight row: every pair's result is computed alike
    # wherever it stands in the batch (a batched matmul's blocking need not be).
    projected = (rows.float().unsqueeze(1) * gate_up[pairs].float()).sum(-1).to(x.dtype)
    gate, up = projected.chunk(2, dim=-1)
    product = F.silu(gate) * up
    out = (product.float().unsqueeze(1) * down[pairs].float()).sum(-1).to(x.dtype)
    weighted = out * weights.reshape(-1, 1).to(x.dtype)
    return weighted.view(tokens, slots, -1).float().sum(dim=1).to(x.dtype)


@torch.library.custom_op("flare::routed_experts", mutates_args=())
def routed_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """``routed_experts_ref``; on CUDA the Triton kernels (``triton_experts``)."""
    return routed_experts_ref(x, gate_up, down, index, weights)


@routed_experts.register_kernel("cuda")
def _routed_experts_cuda(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    from ignition.components import triton_experts

    return triton_experts.triton_routed_experts(x, gate_up, down, index, weights)


@routed_experts.register_fake
def _routed_experts_fake(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    return x.new_empty(x.shape)
