"""The sampler's top-k and top-p thresholds without a sort: radix selection over the
probabilities' bits.

A filter keeps every token whose probability is at least its threshold
(``ignition.components.sampling``). Top-k's threshold is the k-th largest
probability; top-p's is the largest probability ``v`` whose tokens at or above it
hold at least ``top_p`` of the mass (the nucleus, with every token tied at its edge).
Both are found without ordering the row: probabilities are never negative, so their
float32 bits order as they do, and each threshold is built four bits at a time from
the top. In pass ``j`` every program histograms the ``BINS`` values of bits
``28 - 4j`` up of its ``CHUNK`` columns, among the columns whose higher bits are the
threshold's so far: counts for top-k, masses for top-p. The next pass's programs each
sum those histograms over the row's programs (one fixed tree) and take the highest
digit at which what lies at or above it still reaches k (or ``top_p``), and the first
of them records the decision for the pass after. Eight passes and a last decision
give all 32 bits: nine launches of small programs over every SM, where the sort took
four radix passes of the whole row plus its fills (about 80 us of a Qwen3-8B decode
step with its gaps, 75 of SmolLM2's, on the H200).

The result never depends on the batch: a row's programs, their histograms and the
order of every sum follow the vocabulary alone. Masses are float32 sums in a fixed
order, so a threshold is the one the row's own sums give: the same at every call.
Top-k's is the k-th largest value exactly (counts are integers). Top-p's sums differ
from pass to pass in their order: where a later pass finds no digit reaching
``top_p`` inside the bucket an earlier one chose, it takes the bucket's floor (the
whole bucket kept), so the threshold may fall between two of the row's values, and
the nucleus's edge may move by the tokens whose mass is within rounding of it; ties
are never split. A ``top_p`` of 1 or more is off, and one the row's rounded mass does
not reach keeps every token too (threshold 0): which tokens 1.0 kept must not hang on
whether a row's sum rounds above or below it. One of 0 or less keeps the largest
probability and its ties, as the sorted row's first position does.

A row that filters nothing (top-k off or at least the vocabulary, and top-p off: the
default request's, and a padding row's) keeps every token: its thresholds are 0, and
its programs read and write nothing past their wait, so a pass costs it only its
launch. A row with one filter off histograms nothing for it (zeros, which select 0).

On the CPU the operator computes the same thresholds from a sort (the definitions
above over the sorted row; the CPU tests run the kernels themselves under Triton's
interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ignition.components.programmatic_launch import await_producer, kernel_options

# Bits decided a pass, the histogram's bins, the passes over 32 bits, and the columns
# a program histograms.
DIGIT = 4
BINS = 1 << DIGIT
PASSES = 32 // DIGIT
CHUNK = 2048


@triton.jit
def _suffix_sums(values, BINS: tl.constexpr):
    """``[BINS]``: ``values[d:]``'s sum for each ``d``, each by one masked tree."""
    bins = tl.arange(0, BINS)
    at_or_above = bins[None, :] >= bins[:, None]
    return tl.sum(tl.where(at_or_above, values[None, :], tl.zeros_like(values)[None, :]), axis=1)


@triton.jit
def _decide(
    count_ptr, mass_ptr, state_ptr, above_ptr, row, rows, digit, programs, k, top_p,
    PROGRAMS: tl.constexpr, BINS: tl.constexpr,
):  # fmt: skip
    """The thresholds' bits through ``digit`` for ``row``: the decisions before it
    (``state_ptr``/``above_ptr`` at ``digit - 1``: prefixes, top-k's count above,
    top-p's mass above; none before the first) and its histograms, summed over the
    row's ``programs``. Each select takes the highest digit at which what lies at or
    above still reaches its target (top-p: none, then the lowest). Before the first
    digit (``digit`` -1, the first pass), nothing: zeros."""
    before = digit - 1
    decided = digit > 0
    at = (before * rows + row) * 3
    prefix_k = tl.load(state_ptr + at, mask=decided, other=0)
    above_k = tl.load(state_ptr + at + 1, mask=decided, other=0)
    prefix_p = tl.load(state_ptr + at + 2, mask=decided, other=0)
    above_p = tl.load(above_ptr + before * rows + row, mask=decided, other=0.0)
    rp = tl.arange(0, PROGRAMS)
    rb = tl.arange(0, BINS)
    at_hist = ((digit * rows + row) * programs + rp[:, None]) * BINS + rb[None, :]
    present = (rp[:, None] < programs) & (digit >= 0)
    counts = tl.sum(tl.load(count_ptr + at_hist, mask=present, other=0), axis=0)
    masses = tl.sum(tl.load(mass_ptr + at_hist, mask=present, other=0.0), axis=0)
    digit_k = tl.max(tl.where(above_k + _suffix_sums(counts, BINS) >= k, rb, 0), axis=0)
    digit_p = tl.max(tl.where(above_p + _suffix_sums(masses, BINS) >= top_p, rb, 0), axis=0)
    above_k += tl.sum(tl.where(rb > digit_k, counts, 0), axis=0)
    above_p += tl.sum(tl.where(rb > digit_p, masses, 0.0), axis=0)
    return prefix_k * BINS + digit_k, above_k, prefix_p * BINS + digit_p, above_p


@triton.jit
def _targets(top_k_ptr, top_p_ptr, row, V):
    """Row ``row``'s k (its top-k, or the vocabulary when off) and mass target (its
    top-p; none to reach when off, at 1 or more; the least positive float at 0 or
    less, which the largest probability reaches alone, as the sorted row's first
    position does)."""
    top_k = tl.load(top_k_ptr + row).to(tl.int32)
    k = tl.where((top_k > 0) & (top_k <= V), top_k, V)
    top_p = tl.load(top_p_ptr + row).to(tl.float32)
    top_p = tl.where(top_p >= 1.0, float("inf"), tl.maximum(top_p, 1.1754944e-38))
    return k, top_p


@triton.jit
def _row_start(top_k_ptr, top_p_ptr, row, V, PDL: tl.constexpr):
    """A launch's start for ``row``: the wait (``PDL``), then the row's targets and
    whether it filters at all (top-k below the vocabulary, or top-p below 1). A row
    that does not (every token kept: the default request's, and a padding row's)
    reads and writes nothing; its thresholds are 0."""
    if PDL:
        await_producer()
    k, top_p = _targets(top_k_ptr, top_p_ptr, row, V)
    return k, top_p, (k < V) | (top_p < float("inf"))


@triton.jit
def _pass_kernel(
    p_ptr, top_k_ptr, top_p_ptr, count_ptr, mass_ptr, state_ptr, above_ptr, V, stride_p,
    rows, programs, digit, PROGRAMS: tl.constexpr, BINS: tl.constexpr, CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Pass ``digit`` of row ``program_id(0)``, columns ``program_id(1)``: the decisions
    of the digit before (the row's first program records them for the next pass),
    then this chunk's histograms of bits ``28 - 4 * digit`` up among the columns on
    the thresholds' way: counts on top-k's, masses on top-p's."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    k, top_p, filters = _row_start(top_k_ptr, top_p_ptr, row, V, PDL)
    if filters:
        prefix_k, above_k, prefix_p, above_p = _decide(
            count_ptr, mass_ptr, state_ptr, above_ptr, row, rows, digit - 1, programs, k,
            top_p, PROGRAMS, BINS,
        )  # fmt: skip
        if chunk == 0:
            at = ((digit - 1) * rows + row) * 3
            recorded = digit > 0
            tl.store(state_ptr + at, prefix_k, mask=recorded)
            tl.store(state_ptr + at + 1, above_k, mask=recorded)
            tl.store(state_ptr + at + 2, prefix_p, mask=recorded)
            tl.store(above_ptr + (digit - 1) * rows + row, above_p, mask=recorded)
        cols = chunk * CHUNK + tl.arange(0, CHUNK)
        inside = cols < V
        p = tl.load(p_ptr + row * stride_p + cols, mask=inside, other=0.0)
        bits = p.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        shift = 28 - 4 * digit
        high = bits >> tl.minimum(shift + 4, 31)
        values = (bits >> shift) & (BINS - 1)
        # A filter that is off histograms nothing: its zeros select digit 0 every
        # pass, so its threshold is 0 (every token kept).
        on_k = inside & (k < V) & ((digit == 0) | (high == prefix_k))
        on_p = inside & ((digit == 0) | (high == prefix_p))
        at_hist = ((digit * rows + row) * programs + chunk) * BINS
        bins = tl.arange(0, BINS)
        tl.store(count_ptr + at_hist + bins, tl.histogram(values, BINS, mask=on_k))
        if top_p < float("inf"):
            # Each bin's mass by its own masked sum: a [CHUNK, BINS] selection
            # spilled on SM90.
            for bin in tl.static_range(BINS):
                tl.store(mass_ptr + at_hist + bin, tl.sum(tl.where(on_p & (values == bin), p, 0.0)))
        else:
            tl.store(mass_ptr + at_hist + bins, tl.zeros([BINS], tl.float32))


@triton.jit
def _finish_kernel(
    top_k_ptr, top_p_ptr, count_ptr, mass_ptr, state_ptr, above_ptr, out_k_ptr, out_p_ptr, V,
    rows, programs, PASSES: tl.constexpr, PROGRAMS: tl.constexpr, BINS: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Row ``program_id(0)``'s last decisions: its thresholds, the bits as float32
    (0 for a row that filters nothing)."""
    row = tl.program_id(0)
    k, top_p, filters = _row_start(top_k_ptr, top_p_ptr, row, V, PDL)
    bits_k = tl.zeros([], tl.int32)
    bits_p = tl.zeros([], tl.int32)
    if filters:
        bits_k, _, bits_p, _ = _decide(
            count_ptr, mass_ptr, state_ptr, above_ptr, row, rows, PASSES - 1, programs, k,
            top_p, PROGRAMS, BINS,
        )  # fmt: skip
    tl.store(out_k_ptr + row, bits_k.to(tl.float32, bitcast=True))
    tl.store(out_p_ptr + row, bits_p.to(tl.float32, bitcast=True))


def triton_sampling_thresholds(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, chunk: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-k and top-p thresholds (float32 ``[rows]`` each) of ``probs``
    (float32 ``[rows, V]``, each row a distribution), for its ``top_k`` (0 or more than
    V: off) and ``top_p`` (``[rows]``). ``chunk``: the columns a program histograms
    (a power of two; ``bench/sampler_bench.py`` times others against ``CHUNK``)."""
    if probs.dim() != 2 or probs.dtype != torch.float32:
        raise ValueError(f"thresholds take 2-D float32 probabilities, not {probs.dtype}")
    rows, vocab = probs.shape
    if top_k.shape != (rows,) or top_p.shape != (rows,):
        raise ValueError(f"{rows} rows take [rows] top_k and top_p")
    probs = probs.contiguous()
    if chunk & (chunk - 1) or chunk < 16:
        raise ValueError(f"a chunk of {chunk} columns is not a power of two of at least 16")
    programs = triton.cdiv(vocab, chunk)
    device = probs.device
    counts = torch.empty(PASSES, rows, programs, BINS, dtype=torch.int32, device=device)
    masses = torch.empty(PASSES, rows, programs, BINS, dtype=torch.float32, device=device)
    # The decisions of every digit but the last, which the last launch returns.
    state = torch.empty(PASSES - 1, rows, 3, dtype=torch.int32, device=device)
    above = torch.empty(PASSES - 1, rows, dtype=torch.float32, device=device)
    top_k, top_p = top_k.contiguous(), top_p.contiguous()
    fixed = dict(PROGRAMS=triton.next_power_of_2(programs), BINS=BINS)
    for digit in range(PASSES):
        _pass_kernel[(rows, programs)](
            probs, top_k, top_p, counts, masses, state, above, vocab, probs.stride(0), rows,
            programs, digit, CHUNK=chunk, num_warps=4, **fixed, **kernel_options(device),
        )  # fmt: skip
    out_k = torch.empty(rows, dtype=torch.float32, device=device)
    out_p = torch.empty(rows, dtype=torch.float32, device=device)
    _finish_kernel[(rows,)](
        top_k, top_p, counts, masses, state, above, out_k, out_p, vocab, rows, programs,
        PASSES=PASSES, num_warps=1, **fixed, **kernel_options(device),
    )  # fmt: skip
    return out_k, out_p


def sorted_thresholds(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same thresholds read off the sorted row (the torch reference): the k-th
    largest (0 when k is the vocabulary or top-k is off: every token kept), and the
    value at the first position whose running sum reaches ``top_p`` (0, keeping every
    token, when none does or top-p is off)."""
    vocab = probs.shape[-1]
    sorted_p = torch.sort(probs, dim=-1, descending=True).values
    k = torch.where((top_k > 0) & (top_k <= vocab), top_k, vocab).to(torch.int64)
    threshold_k = sorted_p.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    threshold_k = torch.where(k >= vocab, 0.0, threshold_k)
    cumulative = torch.cumsum(sorted_p, dim=-1)
    end = (cumulative < top_p.unsqueeze(1)).sum(dim=-1)
    threshold_p = sorted_p.gather(1, end.clamp(max=vocab - 1).unsqueeze(1)).squeeze(1)
    return threshold_k, torch.where((end >= vocab) | (top_p >= 1), 0.0, threshold_p)


@torch.library.custom_op("flare::sampling_thresholds", mutates_args=())
def sampling_thresholds(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-k and top-p thresholds: the radix selection above on the GPU; on
    the CPU from a sort (``sorted_thresholds``)."""
    return sorted_thresholds(probs, top_k, top_p)


@sampling_thresholds.register_kernel("cuda")
def _sampling_thresholds_cuda(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return triton_sampling_thresholds(probs, top_k, top_p)


@sampling_thresholds.register_fake
def _sampling_thresholds_fake(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = probs.shape[0]
    return probs.new_empty(rows), probs.new_empty(rows)
