"""Row-wise cumulative sums with one fixed order of additions (the sampler's scan)."""

from __future__ import annotations

import math

import pytest
import torch

from ignition.components import sampling
from ignition.components.cumulative import BLOCK, row_cumsum, triton_row_cumsum
from ignition.components.token_state import RequestState


def _bound(x: torch.Tensor) -> torch.Tensor:
    """Per element, the float32 rounding bound of any order of summation of its
    prefix and the block offsets: the terms' count times the unit roundoff times
    the prefix's absolute sum."""
    blocks = math.ceil(x.shape[-1] / BLOCK)
    terms = torch.arange(1, x.shape[-1] + 1, dtype=torch.float64, device=x.device) + blocks
    return terms * 2.0**-24 * x.double().abs().cumsum(dim=-1)


def _sorted_probs(rows: int, n: int, seed: int, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, n, generator=gen)
    probs = torch.softmax(logits, dim=-1)
    return torch.sort(probs, dim=-1, descending=True).values.to(device)


@pytest.mark.parametrize("n", [1, 5, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_matches_a_float64_scan_within_rounding(n: int) -> None:
    # Values of one magnitude: a block offset added twice or left out is off by
    # about a block's sum, far outside the bound.
    x = 0.5 + torch.rand(3, n, generator=torch.Generator().manual_seed(n))
    y = triton_row_cumsum(x)
    reference = x.double().cumsum(dim=-1)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert bool(((y.double() - reference).abs() <= _bound(x)).all())


def test_signed_values_and_a_strided_input() -> None:
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 2 * BLOCK + 300, generator=gen)
    x = wide[:, 100 : 100 + BLOCK + 200]  # rows with a stride larger than their length
    y = triton_row_cumsum(x)
    assert bool(((y.double() - x.double().cumsum(dim=-1)).abs() <= _bound(x)).all())


def test_a_row_sums_alike_alone_and_among_others() -> None:
    x = _sorted_probs(4, 2 * BLOCK + 5, seed=9)
    together = triton_row_cumsum(x)
    for row in range(4):
        assert torch.equal(triton_row_cumsum(x[row : row + 1])[0], together[row])


def test_rejects_what_it_does_not_scan() -> None:
    with pytest.raises(ValueError, match="2-D float32"):
        triton_row_cumsum(torch.ones(8))
    with pytest.raises(ValueError, match="2-D float32"):
        triton_row_cumsum(torch.ones(2, 8, dtype=torch.bfloat16))
    assert triton_row_cumsum(torch.ones(0, 8)).shape == (0, 8)


def test_the_custom_op_traces_as_one_opaque_call() -> None:
    x = _sorted_probs(2, BLOCK + 3, seed=1)
    traced = torch.compile(lambda t: row_cumsum(t) * 2, backend="aot_eager", fullgraph=True)
    assert torch.equal(traced(x), row_cumsum(x) * 2)


@pytest.mark.gpu
def test_row_cumsum_repeats_bitwise_on_gpu() -> None:
    x = _sorted_probs(4, 151936, seed=5, device="cuda")
    first = row_cumsum(x)
    reference = x.double().cumsum(dim=-1)
    assert bool(((first.double() - reference).abs() <= _bound(x)).all())
    for _ in range(100):
        assert torch.equal(row_cumsum(x), first)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [49152, 151936])
def test_the_compiled_filters_repeat_bitwise_on_gpu(vocab: int) -> None:
    """The sampler's filters as preparation compiles them give the same cumulative
    mass on every run of the same inputs (Inductor's split scan did not, so a
    qualification sequence of Qwen3-8B did not reproduce)."""
    torch._dynamo.reset()

    def kept_and_cumulative(
        logits: torch.Tensor, state: RequestState, slots: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kept = sampling.kept_probabilities(logits, state, slots)
        return kept, row_cumsum(kept)

    filters = torch.compile(kept_and_cumulative, backend="inductor", fullgraph=True, dynamic=False)
    state = cumulative_state(vocab)
    # Flat logits, like a random-weight model's: the nucleus spans most of the row,
    # so every block's partial sum reaches the kept mass (with peaked ones the
    # look-back's rounding vanished beside the first block's mass, and the
    # Inductor scan repeated).
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(2)).cuda()
    slots = torch.tensor([1, 2, 3, 4], device="cuda")
    first = [t.clone() for t in filters(logits, state, slots)]
    for _ in range(100):
        again = filters(logits, state, slots)
        for a, b in zip(first, again, strict=True):
            assert torch.equal(a, b)


def cumulative_state(vocab: int) -> RequestState:
    """Five slots of top-p 0.95 (top-k off, temperature 1): the sampler's inputs."""
    state = RequestState.allocate(5, vocab, 4, 8, torch.bfloat16, torch.device("cuda"))
    state.top_p.fill_(0.95)
    return state
