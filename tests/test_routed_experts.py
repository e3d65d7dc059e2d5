"""The routed-experts operator (``ignition.components.experts``) and its Triton kernels
(under Triton's interpreter without CUDA, conftest.py) against Transformers'
``grouped_mm`` experts and the eager expert loop.

Tolerances: the kernels round at the same points as Transformers' ``grouped_mm`` path,
so in fp32 only the order of each dot product's additions differs (relative 1e-5);
in bf16 that order can move a rounding by one bf16 step (2^-8 relative) in any
intermediate, so elementwise bounds are a few such steps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import triton
import triton.language as tl
from transformers.integrations.moe import grouped_mm_experts_forward

from bench.experts_bench import GroupedMmExperts
from ignition.components import triton_experts
from ignition.components.experts import routed_experts, routed_experts_ref

LOCAL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEVICES = [LOCAL_DEVICE, pytest.param("cuda", marks=pytest.mark.gpu, id="gpu")]
EXPERTS, HIDDEN, INTER, K = 8, 96, 40, 3  # columns and reductions not multiples of a block


def _operands(tokens: int, dtype: torch.dtype, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    gate_up = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5
    down = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER**0.5
    index = torch.stack([torch.randperm(EXPERTS, generator=gen)[:K] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, K, generator=gen), dim=-1)
    floats = [t.to(dtype).to(device) for t in (x, gate_up, down, weights)]
    return floats[0], floats[1], floats[2], index.to(device), floats[3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_reference_matches_transformers_grouped_experts(dtype: torch.dtype) -> None:
    x, gate_up, down, index, weights = _operands(5, dtype, "cpu")
    want = grouped_mm_experts_forward(GroupedMmExperts(gate_up, down), x, index, weights)
    got = routed_experts_ref(x, gate_up, down, index, weights)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 4])
def test_the_kernels_match_the_reference(tokens: int, dtype: torch.dtype, device: str) -> None:
    x, gate_up, down, index, weights = _operands(tokens, dtype, device, seed=tokens)
    want = routed_experts_ref(x, gate_up, down, index, weights)
    got = triton_experts.triton_routed_experts(x, gate_up, down, index, weights)
    assert got.dtype == dtype and got.shape == (tokens, HIDDEN)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2**-9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "run", [triton_experts.triton_routed_experts, routed_experts_ref], ids=["kernels", "ref"]
)
def test_a_token_is_computed_alike_at_every_batch_size(run: Callable, device: str) -> None:
    # Each (token, slot) pair is computed on its own: a token's result is bitwise the
    # same alone, in a batch, and at another position of the batch.
    x, gate_up, down, index, weights = _operands(4, torch.bfloat16, device, seed=7)
    batch = run(x, gate_up, down, index, weights)
    for t in range(4):
        alone = run(x[t : t + 1], gate_up, down, index[t : t + 1], weights[t : t + 1])
        assert torch.equal(alone[0], batch[t])
    flipped = run(x.flip(0), gate_up, down, index.flip(0), weights.flip(0))
    assert torch.equal(flipped.flip(0), batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_down_projection_by_slot_equals_the_fused_one_bitwise(
    dtype: torch.dtype, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One program per (pair, column block) and a second kernel summing the slots in
    # order add the same rounded values as the fused kernel: the same bits.
    x, gate_up, down, index, weights = _operands(4, dtype, device, seed=11)
    fused = triton_experts.triton_routed_experts(x, gate_up, down, index, weights)
    monkeypatch.setattr(triton_experts, "DOWN_BY_SLOT", True)
    monkeypatch.setattr(triton_experts, "SUM_BLOCK", 32)  # HIDDEN is not a multiple
    by_slot = triton_experts.triton_routed_experts(x, gate_up, down, index, weights)
    assert torch.equal(by_slot, fused)


def test_the_operator_passes_opcheck() -> None:
    x, gate_up, down, index, weights = _operands(2, torch.float32, "cpu")
    torch.library.opcheck(routed_experts, (x, gate_up, down, index, weights))


@pytest.mark.parametrize("device", DEVICES)
def test_a_nan_propagates_as_in_the_reference(device: str) -> None:
    # The kernels round to bf16 by the bits; NaN must stay NaN (its bits would carry
    # into the sign or the exponent and read as zero or infinity).
    x, gate_up, down, index, weights = _operands(2, torch.bfloat16, device, seed=9)
    x[1, 3] = float("nan")
    want = routed_experts_ref(x, gate_up, down, index, weights)
    got = triton_experts.triton_routed_experts(x, gate_up, down, index, weights)
    assert want[1].isnan().all() and got[1].isnan().all()
    assert torch.equal(got[0], want[0])


@triton.jit
def _round_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, triton_experts._round(tl.load(x_ptr + offsets), True))


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_rounding_by_the_bits_is_torchs(device: str) -> None:
    # Ties to even, both signs, infinities, and NaN of every payload: the GPU's own
    # NaN is 0x7FFFFFFF, whose rounding carry would make it -0.0 without its guard.
    values = torch.randn(64, generator=torch.Generator().manual_seed(10)) * 1e3
    values[:4] = torch.tensor([float("inf"), -float("inf"), 1 + 2**-8, 1 + 3 * 2**-8])
    nans = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7FC00000], dtype=torch.int32)
    values[4:8] = nans.view(torch.float32)
    out = torch.empty_like(values, device=device)
    _round_kernel[(1,)](values.to(device), out, N=64)
    want = values.to(torch.bfloat16).float()
    assert out.isnan().cpu().equal(want.isnan())
    assert torch.equal(out.cpu()[~want.isnan()], want[~want.isnan()])
