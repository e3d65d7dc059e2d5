"""The in-graph sampler: Philox stream, threshold filters, penalties, exact-once commit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ignition.components import sampling
from ignition.components.token_state import (
    FINISHED_LENGTH,
    FINISHED_STOP,
    RUNNING,
    RequestState,
    StagingInputs,
)
from ignition.preparation.steps import SamplingOps
from ignition.replay.packing import pack_decode, pack_masks, token_mask

VOCAB = 64


def _philox_numpy(counter: list[int], key: list[int]) -> list[int]:
    """Random123 Philox4x32-10 in plain uint64 numpy arithmetic (independent reference)."""
    c = [np.uint64(x) for x in counter]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for r in range(10):
        if r:
            k0 = (k0 + np.uint64(0x9E3779B9)) & mask
            k1 = (k1 + np.uint64(0xBB67AE85)) & mask
        p0 = int(np.uint64(0xD2511F53)) * int(c[0])
        p1 = int(np.uint64(0xCD9E8D57)) * int(c[2])
        hi0, lo0 = np.uint64(p0 >> 32), np.uint64(p0 & 0xFFFFFFFF)
        hi1, lo1 = np.uint64(p1 >> 32), np.uint64(p1 & 0xFFFFFFFF)
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return [int(x) for x in c]


def _philox_torch(counter: list[int], key: list[int]) -> list[int]:
    words = sampling.philox4x32_10(
        tuple(torch.tensor([x]) for x in counter),  # type: ignore[arg-type]
        (torch.tensor([key[0]]), torch.tensor([key[1]])),
    )
    return [int(w) for w in words]


def test_philox_known_answers() -> None:
    """Random123's published known-answer vectors for philox4x32-10."""
    assert _philox_torch([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 0xFFFFFFFF
    assert _philox_torch([ones] * 4, [ones, ones]) == [
        0x408F276D,
        0x41C83B0E,
        0xA20BC7C6,
        0x6D5451FD,
    ]


def test_philox_matches_numpy_reference_on_random_inputs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        counter = [int(x) for x in rng.integers(0, 1 << 32, 4)]
        key = [int(x) for x in rng.integers(0, 1 << 32, 2)]
        assert _philox_torch(counter, key) == _philox_numpy(counter, key)


def test_uniform_is_in_open_unit_interval_and_keyed_by_seed_and_counter() -> None:
    seeds = torch.tensor([0, 1, 1, 2**40 + 7])
    counters = torch.tensor([0, 0, 1, 5])
    u = sampling.philox_uniform(seeds, counters)
    assert u.dtype == torch.float32
    assert bool(((u > 0) & (u <= 1)).all())
    assert len(set(u.tolist())) == 4
    again = sampling.philox_uniform(seeds.flip(0), counters.flip(0)).flip(0)
    assert torch.equal(u, again)


def _state(slots: int = 5) -> RequestState:
    return RequestState.allocate(slots, VOCAB, 4, 8, torch.float32, torch.device("cpu"))


def _set(state: RequestState, slot: int, **values: float) -> None:
    for name, value in values.items():
        getattr(state, name)[slot] = value


def test_top_k_one_and_tiny_top_p_pick_the_argmax() -> None:
    state = _state()
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1))
    _set(state, 1, top_k=1)
    _set(state, 2, top_p=1e-6)
    for seed in range(20):
        state.seed.fill_(seed)
        tokens = sampling.sample_rows(logits, state, torch.tensor([1, 2]), 4)
        assert tokens.tolist() == logits.argmax(-1).tolist()


def test_threshold_ties_are_never_truncated() -> None:
    """Four tokens tied at the top-2 threshold all stay eligible."""
    state = _state()
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, [5, 9, 17, 40]] = 3.0
    _set(state, 1, top_k=2)
    drawn = set()
    for counter in range(200):
        state.counter[1] = counter
        drawn.add(int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]))
    assert drawn == {5, 9, 17, 40}


def test_min_p_removes_tokens_below_its_fraction_of_the_best() -> None:
    state = _state()
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, 3] = 0.0
    logits[0, 4] = float(np.log(0.5))  # p = 0.5 * p_max: kept at min_p 0.4
    logits[0, 6] = float(np.log(0.3))  # removed at min_p 0.4
    _set(state, 1, min_p=0.4)
    drawn = set()
    for counter in range(300):
        state.counter[1] = counter
        drawn.add(int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]))
    assert drawn == {3, 4}


def test_draws_follow_the_distribution() -> None:
    """Empirical frequencies over 4000 counters match the softmax within 4 sigma."""
    state = _state()
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0] + [-40.0] * (VOCAB - 4)])
    probs = torch.softmax(logits, -1)[0, :4]
    n = 4000
    slots = torch.ones(n, dtype=torch.int64)
    state.counter[1] = 0
    big = RequestState.allocate(2, VOCAB, 1, 1, torch.float32, torch.device("cpu"))
    big.seed.fill_(11)
    tokens = []
    for counter in range(n):
        big.counter[1] = counter
        tokens.append(int(sampling.sample_rows(logits, big, slots[:1], 4)[0]))
    counts = torch.bincount(torch.tensor(tokens), minlength=4)[:4].float() / n
    sigma = (probs * (1 - probs) / n).sqrt()
    assert bool(((counts - probs).abs() < 4 * sigma).all()), (counts, probs)


def test_batch_packing_never_changes_a_requests_draw() -> None:
    state = _state()
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, VOCAB, generator=gen)
    for slot, seed in zip((1, 2, 3, 4), (10, 20, 30, 40), strict=True):
        _set(state, slot, seed=seed, counter=slot * 3)
    batch = sampling.sample_rows(logits, state, torch.tensor([1, 2, 3, 4]), 4)
    for row, slot in enumerate((1, 2, 3, 4)):
        alone = sampling.sample_rows(logits[row : row + 1], state, torch.tensor([slot]), 4)
        assert int(alone[0]) == int(batch[row])
    shuffled = sampling.sample_rows(logits[[2, 0, 3, 1]], state, torch.tensor([3, 1, 4, 2]), 4)
    assert shuffled.tolist() == batch[[2, 0, 3, 1]].tolist()


def test_penalties_push_counted_tokens_down() -> None:
    state = _state()
    logits = torch.ones(1, VOCAB)
    logits[0, 7] = 5.0
    _set(state, 1, top_k=1, frequency=10.0)
    state.histogram[1, 7] = 1
    assert int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]) != 7
    _set(state, 1, frequency=0.0, presence=10.0)
    assert int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]) != 7
    _set(state, 1, presence=0.0, repetition=100.0)
    assert int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]) != 7
    _set(state, 1, repetition=1.0)
    assert int(sampling.sample_rows(logits, state, torch.tensor([1]), 4)[0]) == 7


def _staging() -> StagingInputs:
    return StagingInputs.allocate(4, 64, 32, VOCAB, torch.device("cpu"))


def test_admission_counts_the_prompt_exactly_once() -> None:
    state, staging = _state(), _staging()
    state.histogram[2, :] = 9  # left by an earlier request
    prompt = [5, 5, 7, 63, 5]
    staging.admit_slot.fill_(2)
    staging.admit_tokens[: len(prompt)] = torch.tensor(prompt)
    staging.admit_tokens[len(prompt) :] = 7  # stale bytes beyond the prompt must not count
    staging.admit_len.fill_(len(prompt))
    staging.admit_int.copy_(torch.tensor([20, 64], dtype=torch.int32))
    staging.admit_float.copy_(torch.tensor([0.7, 0.9, 0.05, 1.1, 0.2, 0.3]))
    staging.admit_seed.fill_(1234)
    sampling.admit(state, staging)
    expected = torch.zeros(VOCAB, dtype=torch.int32)
    for t in prompt:
        expected[t] += 1
    assert torch.equal(state.histogram[2], expected)
    assert int(state.top_k[2]) == 20 and int(state.max_new[2]) == 64
    assert float(state.temperature[2]) == pytest.approx(0.7)
    assert int(state.seed[2]) == 1234 and int(state.counter[2]) == 0
    assert int(state.histogram[1].sum()) == 0


def test_commit_counts_each_sample_once_and_masks_inactive_rows() -> None:
    state, staging = _state(), _staging()
    state.stop_tokens[0] = 1
    state.max_new[1:] = 3
    before = {name: t.clone() for name, t in state.tensors().items()}
    slots = torch.tensor([1, 2, 0, 3])
    tokens = torch.tensor([9, 1, 9, 4])
    active = torch.tensor([True, True, False, False])
    sampling.commit_samples(state, slots, tokens, active, staging.completions)
    assert state.pending[[1, 2]].tolist() == [9, 1]
    assert int(state.histogram[1, 9]) == 1 and int(state.histogram[2, 1]) == 1
    assert state.counter[[1, 2]].tolist() == [1, 1]
    assert state.done[[1, 2]].tolist() == [RUNNING, FINISHED_STOP]
    for name, tensor in state.tensors().items():
        assert torch.equal(tensor[[0, 3]], before[name][[0, 3]]), name
    assert staging.completions[:4, 5].tolist() == [1, 1, 0, 0]
    assert staging.completions[:4, 1].tolist() == [9, 1, -1, -1]
    sampling.commit_samples(state, slots[:1], tokens[:1], active[:1], staging.completions)
    sampling.commit_samples(state, slots[:1], tokens[:1], active[:1], staging.completions)
    assert int(state.done[1]) == FINISHED_LENGTH
    assert int(state.histogram[1, 9]) == 3


@pytest.mark.gpu
def test_sampler_arithmetic_is_independent_of_live_rows_on_gpu() -> None:
    """The regression behind a token that changed when a request ran alone: a one-row
    cumsum takes a different CUDA path from a batched one. With the fixed row count,
    the kept cumulative mass of a row is bitwise the same whatever else is in the step."""
    vocab = 49152
    state = RequestState.allocate(5, vocab, 1, 1, torch.float32, torch.device("cuda"))
    state.top_p.fill_(0.95)
    state.top_k.fill_(20)
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(4, vocab, generator=gen)).cuda()
    slots = torch.tensor([1, 2, 3, 4], device="cuda")
    padded_alone = torch.cat([logits[:1], logits.new_zeros(3, vocab)])
    alone = sampling.kept_probabilities(padded_alone, state, torch.tensor([1, 0, 0, 0]).cuda())
    batch = sampling.kept_probabilities(logits, state, slots)
    assert torch.equal(alone[0], batch[0])
    state.top_k.fill_(0)
    for counter in range(64):
        state.counter.fill_(counter)
        one = sampling.sample_rows(logits[:1], state, slots[:1], 4)
        four = sampling.sample_rows(logits, state, slots, 4)
        assert int(one[0]) == int(four[0])


def test_padding_rows_never_change_a_requests_draw() -> None:
    """The graphs sample straight from their staging buffer, whose rows past the step's
    requests hold stale logits: a request's token must not depend on them."""
    state, logits = _random_requests("cpu", 7)
    slots = torch.tensor([2])
    stale = torch.cat([logits[:1], 50 * torch.randn(3, logits.shape[1])])
    for counter in range(32):
        state.counter.fill_(counter)
        padded = sampling.sample_rows(logits[:1], state, slots, 4)
        in_place = sampling.sample_rows(stale, state, slots, 4)
        assert padded.tolist() == in_place.tolist()


def _random_requests(device: str, seed: int, vocab: int = 512) -> tuple[RequestState, torch.Tensor]:
    """Five slots of mixed sampling parameters, histories and streams, and 4 rows of
    logits over a vocabulary large enough for real thresholds."""
    gen = torch.Generator().manual_seed(seed)
    state = RequestState.allocate(5, vocab, 4, 8, torch.float32, torch.device(device))
    state.temperature.copy_(torch.tensor([1.0, 0.7, 1.0, 1.3, 0.9]))
    state.top_k.copy_(torch.tensor([0, 20, 0, 5, 0], dtype=torch.int32))
    state.top_p.copy_(torch.tensor([1.0, 0.95, 0.8, 1.0, 0.9]))
    state.min_p.copy_(torch.tensor([0.0, 0.0, 0.05, 0.0, 0.1]))
    state.repetition.copy_(torch.tensor([1.0, 1.2, 1.0, 1.1, 1.0]))
    state.presence.copy_(torch.tensor([0.0, 0.3, 0.0, 0.5, 0.0]))
    state.frequency.copy_(torch.tensor([0.0, 0.1, 0.2, 0.0, 0.0]))
    state.seed.copy_(torch.randint(0, 2**62, (5,), generator=gen))
    state.counter.copy_(torch.randint(0, 1000, (5,), generator=gen))
    state.max_new.fill_(1000)
    state.stop_tokens[0] = 7
    state.histogram.copy_(torch.randint(0, 3, state.histogram.shape, generator=gen))
    logits = 4 * torch.randn(4, vocab, generator=gen)
    return state, logits.to(device)


def _compiled_sampler_matches_eager(device: str, backend: str, vocab: int = 512) -> None:
    # Each call compiles the commit at three shapes; Dynamo's per-function recompile
    # limit (8) counts across calls, so every call starts from an empty cache.
    torch._dynamo.reset()
    eager = SamplingOps()
    ops = SamplingOps(
        sample=torch.compile(
            sampling.sample_padded, backend=backend, fullgraph=True, dynamic=False
        ),
        commit=torch.compile(
            sampling.commit_samples, backend=backend, fullgraph=True, dynamic=False
        ),
    )
    masks = _mixed_masks(device, vocab)
    for seed in range(3):
        for rows_used in (1, 2, 4):  # decode capacities 1, 2, 4 and a prefill's one row
            runs = []
            for step in (eager, ops):
                state, logits = _random_requests(device, seed, vocab)
                completions = torch.zeros(4, 6, dtype=torch.int32, device=device)
                slots = torch.tensor([1, 2, 3, 4][:rows_used], device=device)
                active = torch.tensor([True, True, False, True][:rows_used], device=device)
                for _ in range(5):  # the commit advances counters and histograms
                    tokens = sampling.sample_rows(
                        logits[:rows_used], state, slots, 4, step.sample, masks
                    )
                    step.commit(state, slots, tokens, active, completions)
                runs.append((tokens, state.tensors(), completions))
            (tokens_e, state_e, done_e), (tokens_c, state_c, done_c) = runs
            assert torch.equal(tokens_e, tokens_c), (seed, rows_used)
            assert torch.equal(done_e, done_c)
            for name in state_e:
                assert torch.equal(state_e[name], state_c[name]), name


def test_the_traced_sampler_and_commit_match_eager_exactly() -> None:
    # aot_eager runs the captured graph without code generation: the traced
    # functions (state mutations included) are the eager ones.
    _compiled_sampler_matches_eager("cpu", "aot_eager")


@pytest.mark.gpu
def test_the_compiled_sampler_and_commit_match_eager_on_gpu() -> None:
    # Inductor's fused kernels: the integer Philox and commit are exact; the filters'
    # float reductions may round differently from eager's, so a token could differ
    # only at a near-tie of a threshold (none in these draws).
    _compiled_sampler_matches_eager("cuda", "inductor")


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [49152, 151936])
def test_the_sampler_compiles_at_served_vocabularies_on_gpu(vocab: int) -> None:
    # SmolLM2's and Qwen3's vocabularies over 4 rows: Inductor splits each row's scan
    # over several programs there (a 512-token row takes one), and failed to generate
    # the split scan of the thresholded mass that preparation compiled.
    _compiled_sampler_matches_eager("cuda", "inductor", vocab)


@pytest.mark.gpu
def test_the_compiled_sampler_is_independent_of_live_rows_on_gpu() -> None:
    """One compiled shape serves every step: a request's draw alone equals its draw
    among four rows, over many counters."""
    sample = SamplingOps.compiled().sample
    state, logits = _random_requests("cuda", 5)
    slots = torch.tensor([1, 2, 3, 4], device="cuda")
    for counter in range(64):
        state.counter.fill_(counter)
        one = sampling.sample_rows(logits[:1], state, slots[:1], 4, sample)
        four = sampling.sample_rows(logits, state, slots, 4, sample)
        assert int(one[0]) == int(four[0])


def _mixed_masks(device: str, vocab: int) -> sampling.RowMasks:
    """Rows as the graphs see them: all-ones, a few tokens, unmasked over stale
    words, and a few tokens again."""
    gen = torch.Generator().manual_seed(3)
    few = [token_mask(torch.randint(0, vocab, (6,), generator=gen).tolist(), vocab) for _ in "ab"]
    stale = token_mask([0], vocab)
    words = torch.stack([token_mask(range(vocab), vocab), few[0], stale, few[1]])
    return words.to(device), torch.tensor([1, 1, 0, 1], dtype=torch.int32, device=device)


def _allowed(words: torch.Tensor, vocab: int) -> set[int]:
    return {t for t in range(vocab) if (int(words[t // 32]) >> (t % 32)) & 1}


def test_token_masks_pack_bit_t_of_word_t_over_32() -> None:
    mask = token_mask([0, 31, 32, 99], 100)
    assert mask.dtype == torch.int32 and mask.shape == (4,)
    assert mask.tolist() == [1 - 2**31, 1, 0, 1 << 3]  # bit 31 makes word 0 negative
    assert _allowed(mask, 100) == {0, 31, 32, 99}
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_mask([100], 100)


def test_a_masked_row_samples_only_its_allowed_tokens() -> None:
    state, logits = _random_requests("cpu", 2)
    words, flags = _mixed_masks("cpu", 512)
    slots = torch.tensor([1, 2, 3, 4])
    for counter in range(64):
        state.counter.fill_(counter)
        masked = sampling.sample_rows(logits, state, slots, 4, masks=(words, flags))
        free = sampling.sample_rows(logits, state, slots, 4)
        for row in (1, 3):
            assert int(masked[row]) in _allowed(words[row], 512), (counter, row)
        # All-ones, and an unflagged row over stale words, sample as no mask does.
        assert int(masked[0]) == int(free[0]) and int(masked[2]) == int(free[2])


def test_an_all_ones_mask_keeps_the_whole_distribution_bitwise() -> None:
    state, logits = _random_requests("cpu", 4)
    slots = torch.tensor([1, 2, 3, 4])
    masked = sampling.apply_mask(
        logits, torch.stack([token_mask(range(512), 512)] * 4), torch.ones(4, dtype=torch.int32)
    )
    assert torch.equal(masked, logits)
    kept = sampling.kept_probabilities(masked, state, slots)
    assert torch.equal(kept, sampling.kept_probabilities(logits, state, slots))


def test_mask_padding_past_the_vocabulary_is_never_sampled() -> None:
    # 500 tokens take 16 words: the last word's 12 high bits lie past the logits.
    vocab = 500
    state, _ = _random_requests("cpu", 6, vocab)
    logits = torch.zeros(4, vocab)
    words = token_mask([3], vocab).clone()
    words[-1] |= torch.tensor(-(1 << 20), dtype=torch.int32)  # bits 20..31: tokens 500..511
    assert _allowed(words, vocab) == {3}
    flags = torch.ones(4, dtype=torch.int32)
    for counter in range(32):
        state.counter.fill_(counter)
        tokens = sampling.sample_rows(
            logits, state, torch.tensor([1, 2, 3, 4]), 4, masks=(words.repeat(4, 1), flags)
        )
        assert tokens.tolist() == [3, 3, 3, 3]


def test_a_mask_of_only_the_stop_token_ends_the_request() -> None:
    state, logits = _random_requests("cpu", 8)
    staging = StagingInputs.allocate(4, 64, 32, 512, torch.device("cpu"))
    slots = torch.tensor([1])
    pack_decode(staging, [1], 1, [token_mask([7], 512)])
    masks = (staging.sample_mask, staging.sample_masked)
    tokens = sampling.sample_rows(logits, state, slots, 4, masks=masks)
    assert tokens.tolist() == [7]
    sampling.commit_samples(state, slots, tokens, torch.tensor([True]), staging.completions)
    assert int(state.done[1]) == FINISHED_STOP


def test_packing_writes_every_rows_flag_and_only_masked_rows_words() -> None:
    vocab = 512
    staging = StagingInputs.allocate(4, 64, 32, vocab, torch.device("cpu"))
    staging.sample_mask.fill_(5)  # a previous launch's words
    staging.sample_masked.fill_(1)
    pack_masks(staging, [None, token_mask([1], vocab)], 4)
    assert staging.sample_masked.tolist() == [0, 1, 0, 0]
    assert staging.sample_mask[0].tolist() == [5] * 16
    assert staging.sample_mask[1].tolist() == [2] + [0] * 15
    pack_decode(staging, [1, 2], 2)
    assert staging.sample_masked.tolist()[:2] == [0, 0]
    with pytest.raises(ValueError, match="3 masks for 2 rows"):
        pack_masks(staging, [None] * 3, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [49152, 151936])
def test_the_compiled_sampler_keeps_to_masks_on_gpu(vocab: int) -> None:
    """What the captured graphs run: masked rows draw only allowed tokens, and an
    all-ones row, like an unflagged row over stale words, draws as without a mask."""
    torch._dynamo.reset()
    sample = SamplingOps.compiled().sample
    state, logits = _random_requests("cuda", 9, vocab)
    words, flags = _mixed_masks("cuda", vocab)
    allowed = [_allowed(words[row].cpu(), vocab) for row in range(4)]
    slots = torch.tensor([1, 2, 3, 4], device="cuda")
    for counter in range(64):
        state.counter.fill_(counter)
        masked = sampling.sample_rows(logits, state, slots, 4, sample, (words, flags)).tolist()
        free = sampling.sample_rows(logits, state, slots, 4, sample, (words, 0 * flags)).tolist()
        assert masked[1] in allowed[1] and masked[3] in allowed[3], counter
        assert masked[0] == free[0] and masked[2] == free[2], counter
