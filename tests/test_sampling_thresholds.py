"""The sampler's thresholds by radix selection: against the sorted row's, under
Triton's interpreter here and on the GPU, ties kept, and independent of the batch."""

from __future__ import annotations

import pytest
import torch

from ignition.components import sampling_thresholds as radix
from ignition.components.sampling_thresholds import (
    BINS,
    BITS,
    DIGIT,
    MIN_CHUNK,
    PASSES,
    chunk_columns,
    sampling_thresholds,
    sorted_thresholds,
    triton_sampling_thresholds,
)


def _probs(device: str, vocab: int, scales: list[float], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(scales), vocab, generator=gen) * torch.tensor(scales)[:, None]
    return torch.softmax(logits, dim=-1).to(device)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p keeps, exactly (float64 sums of the sorted row): all at or
    above the value where the running sum first reaches ``top_p``; all at 1 (off)."""
    if top_p >= 1:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p = torch.sort(probs.double(), descending=True).values
    cumulative = torch.cumsum(sorted_p, dim=-1)
    end = int((cumulative < top_p).sum().clamp(max=probs.numel() - 1))
    return probs >= sorted_p[end].float()


def _check(device: str, vocab: int, top_ks: tuple[int, ...], top_ps: tuple[float, ...]) -> None:
    probs = _probs(device, vocab, [0.3, 1.0, 3.0, 8.0])
    rows = probs.shape[0]
    for top_k in top_ks:
        for top_p in top_ps:
            ks = torch.full((rows,), top_k, dtype=torch.int64, device=device)
            ps = torch.full((rows,), top_p, dtype=torch.float32, device=device)
            threshold_k, threshold_p = triton_sampling_thresholds(probs, ks, ps)
            reference_k, _ = sorted_thresholds(probs, ks, ps)
            # The k-th largest value, bit for bit.
            assert torch.equal(threshold_k, reference_k), (top_k, top_p)
            for row in range(rows):
                kept = probs[row] >= threshold_p[row]
                exact = _nucleus(probs[row], top_p)
                # Float32 sums in another order than float64's could move the edge
                # by tokens whose mass is within rounding of it: none in these rows.
                assert torch.equal(kept, exact), (row, top_k, top_p)


# Two and a half chunks, and one partial chunk.
@pytest.mark.parametrize("vocab", [5 * MIN_CHUNK // 2, 64])
def test_thresholds_match_the_sorted_rows_interpreted(vocab: int) -> None:
    _check("cpu", vocab, (0, 1, 40, vocab + 5), (0.05, 0.9, 1.0))


def test_tokens_tied_at_a_threshold_all_stay_interpreted() -> None:
    # Six tokens tied at the second-largest value, spread over three chunks; the
    # rest far below. Top-2 keeps all seven; a nucleus ending inside the tie too.
    vocab = 3 * MIN_CHUNK
    logits = torch.full((1, vocab), -20.0)
    tied = [5, 700, MIN_CHUNK + 3, MIN_CHUNK + 900, 2 * MIN_CHUNK + 1, 3 * MIN_CHUNK - 1]
    logits[0, 11] = 2.0
    logits[0, tied] = 1.0
    probs = torch.softmax(logits, dim=-1)
    ks = torch.tensor([2])
    threshold_k, threshold_p = triton_sampling_thresholds(probs, ks, torch.tensor([0.5]))
    kept_k = torch.nonzero(probs[0] >= threshold_k[0]).flatten().tolist()
    assert kept_k == sorted([11, *tied])
    # The top token holds about 0.31 of the mass: the nucleus of 0.5 ends in the tie.
    kept_p = torch.nonzero(probs[0] >= threshold_p[0]).flatten().tolist()
    assert kept_p == sorted([11, *tied])


def test_masked_tokens_never_count_toward_top_k_interpreted() -> None:
    # Three allowed tokens (the rest -inf, probability 0): top-k of 10 reaches into
    # the zeros, whose threshold 0 keeps every token of any mass; top-p 1 is off.
    logits = torch.full((2, 300), float("-inf"))
    logits[:, [3, 30, 299]] = torch.tensor([1.0, 2.0, 0.5])
    probs = torch.softmax(logits, dim=-1)
    threshold_k, threshold_p = triton_sampling_thresholds(
        probs, torch.tensor([10, 2]), torch.tensor([1.0, 1.0])
    )
    assert threshold_k[0] == 0 and threshold_p[0] == 0
    assert torch.nonzero(probs[1] >= threshold_k[1]).flatten().tolist() == [3, 30]


def test_a_certain_row_and_values_past_one_keep_their_order_interpreted() -> None:
    # Row 0: one token holds all the mass (1.0, the largest value of a distribution).
    # Row 1 is no distribution: values of 2 and more saturate to the largest 30-bit
    # pattern, still above every value below 2, so top-1 keeps them (tied there) and
    # nothing else.
    vocab = 3 * MIN_CHUNK
    probs = torch.zeros(2, vocab)
    probs[0, 77] = 1.0
    probs[1, :] = 1e-5
    probs[1, [9, MIN_CHUNK + 4]] = torch.tensor([3.0, 2.0])
    probs[1, 2 * MIN_CHUNK] = 1.5
    threshold_k, threshold_p = triton_sampling_thresholds(
        probs, torch.tensor([1, 1]), torch.tensor([0.5, 1.0])
    )
    assert threshold_k[0] == 1.0 and threshold_p[0] == 1.0
    assert torch.nonzero(probs[1] >= threshold_k[1]).flatten().tolist() == [9, MIN_CHUNK + 4]
    assert 1.5 < threshold_k[1] <= 2.0


def test_a_top_p_of_zero_or_less_keeps_the_largest_interpreted() -> None:
    # As the sorted row's first position: the largest probability (and its ties).
    probs = _probs("cpu", 700, [2.0, 2.0, 2.0])
    top_p = torch.tensor([0.0, -0.0, -1.0])
    _, threshold_p = triton_sampling_thresholds(probs, torch.zeros(3, dtype=torch.int32), top_p)
    assert torch.equal(threshold_p, probs.amax(dim=-1))
    _, reference = sorted_thresholds(probs, torch.zeros(3, dtype=torch.int32), top_p)
    assert torch.equal(reference, probs.amax(dim=-1))


def test_the_sampler_draws_the_same_tokens_through_the_kernels_interpreted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The served sampler with its thresholds from the kernels (as on the GPU) and from
    # the sort (the CPU operator): the same thresholds here, so the same draws.
    from ignition.components import sampling
    from ignition.components.token_state import RequestState

    vocab = 3000
    state = RequestState.allocate(4, vocab, 1, 1, torch.float32, torch.device("cpu"))
    state.top_k[1:] = torch.tensor([0, 20, 5], dtype=torch.int32)
    state.top_p[1:] = torch.tensor([0.9, 1.0, 0.5])
    state.min_p[3] = 0.2
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(7)) * 3
    slots = torch.tensor([1, 2, 3])
    drawn = {}
    for name, thresholds in (("sort", sorted_thresholds), ("radix", triton_sampling_thresholds)):
        monkeypatch.setattr(sampling, "sampling_thresholds", thresholds)
        tokens = []
        for counter in range(6):
            state.counter.fill_(counter)
            tokens.append(sampling.sample_rows(logits, state, slots, 4).tolist())
        drawn[name] = tokens
    assert drawn["radix"] == drawn["sort"]
    # Each draw is a kept token: within row 3's top-5.
    top5 = set(torch.topk(logits[2], 5).indices.tolist())
    assert all(tokens[2] in top5 for tokens in drawn["radix"])


def test_a_rows_thresholds_never_depend_on_its_batch_interpreted() -> None:
    probs = _probs("cpu", 3000, [0.5, 2.0, 1.0, 4.0], seed=3)
    ks, ps = torch.tensor([0, 20, 5, 0]), torch.tensor([0.9, 0.8, 1.0, 0.3])
    together = triton_sampling_thresholds(probs, ks, ps)
    for row in range(4):
        one = slice(row, row + 1)
        alone = triton_sampling_thresholds(probs[one], ks[one], ps[one])
        assert torch.equal(alone[0][0], together[0][row])
        assert torch.equal(alone[1][0], together[1][row])


def test_a_row_that_filters_nothing_keeps_every_token_and_writes_nothing_interpreted() -> None:
    # Top-k off (0), at the vocabulary or past it, with top-p 1: every token is kept,
    # both thresholds 0 (the sort's too), and the row's programs write no histogram:
    # the default request's row, and a padding row, cost each pass only its wait.
    vocab = 3 * MIN_CHUNK
    probs = _probs("cpu", vocab, [1.0, 2.0, 3.0, 1.5], seed=5)
    ks = torch.tensor([0, vocab, vocab + 9, 20])
    ps = torch.tensor([1.0, 1.0, 1.5, 0.9])
    for got in (triton_sampling_thresholds(probs, ks, ps), sorted_thresholds(probs, ks, ps)):
        assert got[0][:3].tolist() == [0.0] * 3 and got[1][:3].tolist() == [0.0] * 3
        assert got[0][3] > 0 and got[1][3] > 0  # the row that filters
    assert torch.equal(
        triton_sampling_thresholds(probs, ks, ps)[0], sorted_thresholds(probs, ks, ps)[0]
    )
    sentinel = -7
    counts = torch.full((PASSES, 4, 3, BINS), sentinel, dtype=torch.int32)
    masses = torch.full((PASSES, 4, 3, BINS), float(sentinel))
    state = torch.zeros(PASSES - 1, 4, 3, dtype=torch.int32)
    above = torch.zeros(PASSES - 1, 4)
    radix._pass_kernel[(4, 3)](
        probs, ks, ps, counts, masses, state, above, vocab, probs.stride(0), 4, 3, 0,
        PROGRAMS=4, BINS=BINS, CHUNK=MIN_CHUNK, DIGIT=DIGIT, BITS=BITS,
    )  # fmt: skip
    assert (counts[0, :3] == sentinel).all() and (masses[0, :3] == sentinel).all()
    # The filtering row: its chunks' counts cover the row.
    assert int(counts[0, 3].sum()) == vocab and (masses[0, 3] >= 0).all()


def test_a_programs_chunk_follows_the_vocabulary() -> None:
    # At least MIN_CHUNK columns a program, at most MAX_PROGRAMS programs a row: SmolLM2's
    # vocabulary in 48 programs of 1,024, Qwen3's in 75 of 2,048.
    assert [chunk_columns(v) for v in (64, 49152, 131072, 131073, 151936, 300000)] == [
        MIN_CHUNK,
        1024,
        1024,
        2048,
        2048,
        4096,
    ]


def test_the_operator_takes_the_sort_on_the_cpu() -> None:
    probs = _probs("cpu", 500, [1.0, 5.0])
    ks, ps = torch.tensor([0, 3]), torch.tensor([0.7, 0.95])
    for got, want in zip(
        sampling_thresholds(probs, ks, ps), sorted_thresholds(probs, ks, ps), strict=True
    ):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="rows"):
        triton_sampling_thresholds(probs, ks[:1], ps)
    with pytest.raises(ValueError, match="power of two"):
        triton_sampling_thresholds(probs, ks, ps, chunk=1000)


def test_every_chunk_gives_the_same_thresholds_interpreted() -> None:
    # A program's chunk changes which program sums which columns, not what top-k
    # selects; the nucleus here is far from any rounding edge.
    probs = _probs("cpu", 1500, [1.0, 4.0])
    ks, ps = torch.tensor([0, 10]), torch.tensor([0.8, 0.9])
    results = [triton_sampling_thresholds(probs, ks, ps, chunk) for chunk in (256, 1024, 2048)]
    for other in results[1:]:
        assert torch.equal(other[0], results[0][0])
        for row in range(2):
            assert torch.equal(probs[row] >= other[1][row], probs[row] >= results[0][1][row])


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [49152, 151936])
def test_thresholds_match_the_sorted_rows_on_gpu(vocab: int) -> None:
    _check("cuda", vocab, (0, 1, 7, 40, vocab, vocab + 5), (0.05, 0.5, 0.9, 0.99, 1.0))


@pytest.mark.gpu
def test_thresholds_repeat_bitwise_at_every_row_count_on_gpu() -> None:
    # Flat rows: the nucleus spans most of the row, every program's mass counts. Run
    # as served (launched programmatically where the GPU can), alone and batched.
    from ignition.components.programmatic_launch import programmatic_launch

    rows = 64
    probs = _probs("cuda", 151936, [0.2, 1.0, 1.0, 4.0] * (rows // 4), seed=5)
    ks = torch.tensor([0, 0, 50, 20] * (rows // 4), dtype=torch.int32, device="cuda")
    ps = torch.tensor([0.95, 0.9, 0.95, 1.0] * (rows // 4), device="cuda")
    with programmatic_launch():
        first = triton_sampling_thresholds(probs, ks, ps)
        for _ in range(20):
            again = triton_sampling_thresholds(probs, ks, ps)
            assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
        for count in (1, 4, 16):
            fewer = triton_sampling_thresholds(probs[:count], ks[:count], ps[:count])
            for a, b in zip(first, fewer, strict=True):
                assert torch.equal(a[:count], b), count
