"""Sampling inside the graph: penalties, temperature, top-k/top-p/min-p, and commit.

Randomness: one Philox4x32-10 stream per request, keyed only by the request's
device seed and counter. Draw ``n`` of a request uses counter ``n`` with
subsequence zero (curand's ``offset = 4 * n``), so batch packing, row order and
co-scheduled requests never change a request's draws. The counter advances once
per successful live sample. The generator is plain integer arithmetic on int64
tensors (16-bit limbs keep every product exact), so it is capture-safe, runs on
the CPU for tests, and involves no PyTorch generator state.

Filters are applied as probability thresholds: a filter keeps every token whose
probability is at least its threshold, so tokens tied at a threshold are never
truncated to a fixed count. Top-k's threshold is the k-th largest probability,
top-p's the largest probability whose tokens at or above it hold ``top_p`` of the
mass, min-p's that fraction of the largest; none needs the row sorted
(``ignition.components.sampling_thresholds``). The draw inverts the kept mass's
running sum in token order.

Token masks (constrained decoding) come first: a masked row's disallowed tokens
get ``-inf`` logits before penalties, temperature and every filter, so what the
filters keep and the draw picks is always allowed. A row whose flag is 0 is
sampled exactly as without a mask: the flag selects the unmodified logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ignition.components.cumulative import row_cumsum
from ignition.components.sampling_thresholds import sampling_thresholds
from ignition.components.token_state import (
    FINISHED_LENGTH,
    FINISHED_STOP,
    MASK_BITS,
    RUNNING,
    RequestState,
    StagingInputs,
)
from ignition.components.triton_admission import triton_admit
from ignition.export import flare_core_pb2 as pb

_MASK32 = 0xFFFFFFFF
_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_TWO_POW_M32 = 2.0**-32


def _mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * b`` for a 32-bit constant and int64-held words."""
    b_lo = b & 0xFFFF
    b_hi = b >> 16
    p_lo = a * b_lo  # < 2**48
    p_hi = a * b_hi  # < 2**48
    t = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    return (p_hi >> 16) + (t >> 32), t & _MASK32


def philox4x32_10(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random123's Philox4x32 with 10 rounds, on int64 tensors holding 32-bit words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0 = (k0 + _PHILOX_W0) & _MASK32
            k1 = (k1 + _PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(_PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(_PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_uniform(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """curand_uniform of ``curand_init(seed, 0, 4 * counter)``: float32 in (0, 1]."""
    zero = torch.zeros_like(counter)
    words = philox4x32_10(
        (counter & _MASK32, (counter >> 32) & _MASK32, zero, zero),
        (seed & _MASK32, (seed >> 32) & _MASK32),
    )
    return words[0].to(torch.float32) * _TWO_POW_M32 + _TWO_POW_M32 / 2


def apply_mask(logits: torch.Tensor, words: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """``logits`` [rows, vocab] with each masked row's disallowed tokens at ``-inf``:
    ``words`` [rows, >= vocab / 32] int32 packed masks, ``masked`` [rows] flags."""
    vocab = logits.shape[-1]
    shifts = torch.arange(MASK_BITS, dtype=torch.int32, device=logits.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(words.shape[0], -1)[:, :vocab] != 0
    keep = allowed | (masked == 0).unsqueeze(1)
    return torch.where(keep, logits, float("-inf"))


def kept_probabilities(
    logits: torch.Tensor, state: RequestState, slots: torch.Tensor
) -> torch.Tensor:
    """Per row: the probabilities every filter keeps, the others zero."""
    counts = state.histogram.index_select(0, slots)
    present = counts > 0

    def col(t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, slots).unsqueeze(1)

    repetition = col(state.repetition)
    logits = torch.where(
        present, torch.where(logits > 0, logits / repetition, logits * repetition), logits
    )
    logits = logits - col(state.presence) * present - col(state.frequency) * counts
    # Admission rejects temperature <= 0; the clamp only keeps padded rows finite.
    probs = torch.softmax(logits / col(state.temperature).clamp(min=1e-6), dim=-1)
    # Top-k's and top-p's thresholds are selected by the probabilities' bits
    # (``sampling_thresholds``: no sort); min-p's is a fraction of the largest.
    threshold_k, threshold_p = sampling_thresholds(
        probs, state.top_k.index_select(0, slots), state.top_p.index_select(0, slots)
    )
    threshold_min = col(state.min_p) * probs.amax(dim=-1, keepdim=True)
    threshold = torch.maximum(
        torch.maximum(threshold_k.unsqueeze(1), threshold_p.unsqueeze(1)), threshold_min
    )
    return torch.where(probs >= threshold, probs, 0.0)


RowMasks = tuple[torch.Tensor, torch.Tensor]
"""Packed token masks [rows, words] and their flags [rows], one row per sampled row."""
SamplePadded = Callable[[torch.Tensor, RequestState, torch.Tensor, RowMasks | None], torch.Tensor]


def sample_rows(
    logits: torch.Tensor,
    state: RequestState,
    slots: torch.Tensor,
    rows: int,
    sample: SamplePadded | None = None,
    masks: RowMasks | None = None,
) -> torch.Tensor:
    """One token for each of the ``n`` ``slots``, from the first ``n`` rows of
    ``logits`` (float32, at least ``n`` rows), under each slot's sampling parameters,
    penalty histogram and Philox stream.

    The arithmetic always runs on ``rows`` rows (padding with the null slot): scans
    and reductions pick their algorithm by shape (a single-row cumsum takes a
    different path from a batched one), so a fixed row count keeps a request's
    thresholds, and so its tokens, independent of how many requests share the step.
    Rows are independent, so ``logits`` may already hold ``rows`` rows whatever the
    padding rows contain (the graphs pass their staging buffer: no copy); fewer rows
    are padded with zeros. ``sample`` (default ``sample_padded``) is that fixed-shape
    arithmetic: a compiled version sees one shape whatever ``n`` is, so every step
    runs the same kernels. ``masks`` (at least ``rows`` rows) constrain the rows
    whose flag is set.
    """
    n = slots.shape[0]
    if logits.shape[0] < rows:
        pad = logits.new_zeros(rows - logits.shape[0], logits.shape[1])
        logits = torch.cat([logits, pad])
    if n < rows:
        slots = torch.cat([slots, slots.new_zeros(rows - n)])
    if masks is not None:
        masks = (masks[0][:rows], masks[1][:rows])
    return (sample or sample_padded)(logits[:rows], state, slots, masks)[:n]


def sample_padded(
    logits: torch.Tensor,
    state: RequestState,
    slots: torch.Tensor,
    masks: RowMasks | None = None,
) -> torch.Tensor:
    """``sample_rows``'s arithmetic on its padded rows: one token per row."""
    if masks is not None:
        logits = apply_mask(logits, *masks)
    kept = kept_probabilities(logits, state, slots)
    # The draw inverts the kept mass's running sum in token order: the token whose
    # span holds ``uniform`` of it (a removed token spans nothing). A scan with one
    # order of additions: Inductor's split scan rounds differently from run to run
    # (``ignition.components.cumulative``).
    cumulative = row_cumsum(kept)
    uniform = philox_uniform(
        state.seed.index_select(0, slots), state.counter.index_select(0, slots)
    )
    target = uniform.unsqueeze(1) * cumulative[:, -1:]
    choice = (cumulative < target).sum(dim=-1)
    return choice.clamp(max=kept.shape[-1] - 1)


def commit_samples(
    state: RequestState,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    active: torch.Tensor,
    completions: torch.Tensor,
) -> None:
    """Make sampled tokens pending, count them once in the histogram, advance each
    live request's counter, set its finish reason, and write completion records.

    Inactive rows (padding, finished requests, chunks that do not end the prompt)
    write back the values they read: no state changes for them.
    """
    generated = state.generated.index_select(0, slots)
    counter = state.counter.index_select(0, slots)
    done = state.done.index_select(0, slots)
    pending = state.pending.index_select(0, slots)
    is_stop = (tokens.unsqueeze(1) == state.stop_tokens.unsqueeze(0)).any(dim=1)
    new_generated = generated + 1
    limit = new_generated >= state.max_new.index_select(0, slots)
    new_done = torch.where(
        is_stop,
        FINISHED_STOP,
        torch.where(limit, FINISHED_LENGTH, RUNNING),
    ).to(done.dtype)
    state.pending.index_copy_(0, slots, torch.where(active, tokens, pending))
    state.generated.index_copy_(0, slots, torch.where(active, new_generated, generated))
    state.counter.index_copy_(0, slots, torch.where(active, counter + 1, counter))
    state.done.index_copy_(0, slots, torch.where(active, new_done, done))
    state.histogram.index_put_((slots, tokens), active.to(torch.int32), accumulate=True)
    record = torch.stack(
        [
            slots.to(torch.int32),
            torch.where(active, tokens, -1).to(torch.int32),
            state.generated.index_select(0, slots),
            state.consumed.index_select(0, slots),
            state.done.index_select(0, slots),
            active.to(torch.int32),
        ],
        dim=1,
    )
    completions[: record.shape[0]].copy_(record)


def admit(state: RequestState, staging: StagingInputs) -> None:
    """Initialize a slot for a new request: sampling parameters, seed, counters, and
    the penalty histogram built once from the whole prompt (also on a prefix hit). On
    the GPU in two launches (``triton_admission``); elsewhere ``admit_reference``."""
    if state.histogram.is_cuda:
        triton_admit(state, staging)
    else:
        admit_reference(state, staging)


def admit_reference(state: RequestState, staging: StagingInputs) -> None:
    """``admit`` in eager torch: what the two launches write, in about 22 kernels."""
    slot = staging.admit_slot
    tokens = staging.admit_tokens
    present = (torch.arange(tokens.shape[0], device=tokens.device) < staging.admit_len).to(
        torch.int32
    )
    row = torch.zeros(1, state.histogram.shape[1], dtype=torch.int32, device=tokens.device)
    row.scatter_add_(1, tokens.unsqueeze(0), present.unsqueeze(0))
    state.histogram.index_copy_(0, slot, row)

    def at(values: torch.Tensor, position: int) -> torch.Tensor:
        return values[position : position + 1]

    floats = staging.admit_float
    ints = staging.admit_int
    for target, value in (
        (state.temperature, at(floats, pb.ADMIT_FLOAT_TEMPERATURE)),
        (state.top_p, at(floats, pb.ADMIT_FLOAT_TOP_P)),
        (state.min_p, at(floats, pb.ADMIT_FLOAT_MIN_P)),
        (state.repetition, at(floats, pb.ADMIT_FLOAT_REPETITION_PENALTY)),
        (state.presence, at(floats, pb.ADMIT_FLOAT_PRESENCE_PENALTY)),
        (state.frequency, at(floats, pb.ADMIT_FLOAT_FREQUENCY_PENALTY)),
        (state.top_k, at(ints, pb.ADMIT_INT_TOP_K)),
        (state.max_new, at(ints, pb.ADMIT_INT_MAX_NEW_TOKENS)),
        (state.seed, staging.admit_seed),
        (state.consumed, staging.admit_consumed),
    ):
        target.index_copy_(0, slot, value)
    zero32 = torch.zeros(1, dtype=torch.int32, device=tokens.device)
    state.generated.index_copy_(0, slot, zero32)
    state.done.index_copy_(0, slot, zero32)
    state.counter.index_copy_(0, slot, torch.zeros(1, dtype=torch.int64, device=tokens.device))
