"""Admission in two launches: a slot's sampling parameters, counters and prompt
histogram written by two Triton kernels instead of the two dozen small ones eager
torch launches (``sampling.admit``'s reference).

An admit graph runs once per request, and again for each message endpoint a
positional-KV core snapshots inside a chunk (the slot is readmitted at the
endpoint's count), so a tool request runs several before its first token. Eager, each
was about 22 kernels (a zeroed row, the prompt's ``scatter_add``, fourteen
``index_copy_`` of one element, their fills), each a graph node of a few
microseconds at any size. Here:

- ``_clear_kernel``: one program per ``CHUNK`` columns of the vocabulary zeroes the
  slot's histogram row there; the first also writes every scalar field of the slot
  (the staged sampling parameters, seed and consumed count; generated, done and the
  Philox counter zero);
- ``_count_kernel``: one program per ``BLOCK`` positions of the staged prompt adds one
  to the row's column of each token before ``admit_len`` (integer atomics: the counts
  are exact whatever order they land in).

The second launch follows the first on the stream, so every count lands on a zeroed
row. The grid of the second is the staged prompt's capacity (fixed at capture); its
programs past ``admit_len`` read nothing past the length and write nothing. What is
written is what the eager code writes, bit for bit: copies, zeros and integer counts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ignition.components.token_state import RequestState, StagingInputs
from ignition.export import flare_core_pb2 as pb

# Histogram columns a clearing program zeroes, and prompt positions a counting
# program reads.
CHUNK = 4096
BLOCK = 1024


@triton.jit
def _clear_kernel(
    slot_ptr, histogram_ptr, stride_h, vocab, floats_ptr, ints_ptr, seed_in_ptr,
    consumed_in_ptr, temperature_ptr, top_p_ptr, min_p_ptr, repetition_ptr, presence_ptr,
    frequency_ptr, top_k_ptr, max_new_ptr, seed_ptr, consumed_ptr, generated_ptr, done_ptr,
    counter_ptr, F_TEMPERATURE: tl.constexpr, F_TOP_P: tl.constexpr, F_MIN_P: tl.constexpr,
    F_REPETITION: tl.constexpr, F_PRESENCE: tl.constexpr, F_FREQUENCY: tl.constexpr,
    I_TOP_K: tl.constexpr, I_MAX_NEW: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Columns ``program_id(0) * CHUNK`` on of the slot's histogram row zeroed; the
    first program also writes the slot's scalar fields."""
    chunk = tl.program_id(0)
    slot = tl.load(slot_ptr)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    tl.store(histogram_ptr + slot * stride_h + cols, tl.zeros([CHUNK], tl.int32), mask=cols < vocab)
    if chunk == 0:
        tl.store(temperature_ptr + slot, tl.load(floats_ptr + F_TEMPERATURE))
        tl.store(top_p_ptr + slot, tl.load(floats_ptr + F_TOP_P))
        tl.store(min_p_ptr + slot, tl.load(floats_ptr + F_MIN_P))
        tl.store(repetition_ptr + slot, tl.load(floats_ptr + F_REPETITION))
        tl.store(presence_ptr + slot, tl.load(floats_ptr + F_PRESENCE))
        tl.store(frequency_ptr + slot, tl.load(floats_ptr + F_FREQUENCY))
        tl.store(top_k_ptr + slot, tl.load(ints_ptr + I_TOP_K))
        tl.store(max_new_ptr + slot, tl.load(ints_ptr + I_MAX_NEW))
        tl.store(seed_ptr + slot, tl.load(seed_in_ptr))
        tl.store(consumed_ptr + slot, tl.load(consumed_in_ptr))
        tl.store(generated_ptr + slot, tl.zeros([], tl.int32))
        tl.store(done_ptr + slot, tl.zeros([], tl.int32))
        tl.store(counter_ptr + slot, tl.zeros([], tl.int64))


@triton.jit
def _count_kernel(
    slot_ptr, tokens_ptr, len_ptr, histogram_ptr, stride_h, vocab, BLOCK: tl.constexpr
):  # fmt: skip
    """One count in the slot's row for each token at positions ``program_id(0) *
    BLOCK`` on, before the prompt's length. A token outside the vocabulary (which the
    server never stages) counts nothing rather than another slot's column."""
    slot = tl.load(slot_ptr)
    n = tl.load(len_ptr)
    positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    present = positions < n
    tokens = tl.load(tokens_ptr + positions, mask=present, other=0)
    counted = present & (tokens >= 0) & (tokens < vocab)
    ones = tl.full([BLOCK], 1, tl.int32)
    tl.atomic_add(histogram_ptr + slot * stride_h + tokens, ones, mask=counted, sem="relaxed")


def triton_admit(state: RequestState, staging: StagingInputs) -> None:
    """``sampling.admit`` in two launches (above): ``staging``'s request into slot
    ``staging.admit_slot`` of ``state``."""
    histogram = state.histogram
    vocab = histogram.shape[1]
    if histogram.stride(1) != 1:
        raise ValueError("the histogram's rows must be contiguous")
    _clear_kernel[(triton.cdiv(vocab, CHUNK),)](
        staging.admit_slot, histogram, histogram.stride(0), vocab, staging.admit_float,
        staging.admit_int, staging.admit_seed, staging.admit_consumed, state.temperature,
        state.top_p, state.min_p, state.repetition, state.presence, state.frequency,
        state.top_k, state.max_new, state.seed, state.consumed, state.generated, state.done,
        state.counter, F_TEMPERATURE=pb.ADMIT_FLOAT_TEMPERATURE, F_TOP_P=pb.ADMIT_FLOAT_TOP_P,
        F_MIN_P=pb.ADMIT_FLOAT_MIN_P, F_REPETITION=pb.ADMIT_FLOAT_REPETITION_PENALTY,
        F_PRESENCE=pb.ADMIT_FLOAT_PRESENCE_PENALTY,
        F_FREQUENCY=pb.ADMIT_FLOAT_FREQUENCY_PENALTY, I_TOP_K=pb.ADMIT_INT_TOP_K,
        I_MAX_NEW=pb.ADMIT_INT_MAX_NEW_TOKENS, CHUNK=CHUNK, num_warps=4,
    )  # fmt: skip
    tokens = staging.admit_tokens
    _count_kernel[(triton.cdiv(tokens.shape[0], BLOCK),)](
        staging.admit_slot, tokens, staging.admit_len, histogram, histogram.stride(0), vocab,
        BLOCK=BLOCK, num_warps=4,
    )  # fmt: skip
