"""The sampler's top-k and top-p thresholds without a sort: radix selection over the
probabilities' bits.

A filter keeps every token whose probability is at least its threshold
(``ignition.components.sampling``). Top-k's threshold is the k-th largest
probability; top-p's is the largest probability ``v`` whose tokens at or above it
hold at least ``top_p`` of the mass (the nucleus, with every token tied at its edge).
Both are found without ordering the row: probabilities are never negative and at
most 1, so their float32 bits order as they do and the top two bits are 0. Each
threshold is built ``DIGIT`` bits at a time from the top of ``BITS`` (thirty rounded
up to whole digits: 32 for four-bit digits). In pass ``j`` every program histograms
the ``BINS`` values of the ``j``-th digit of its chunk's columns, among the columns
whose higher bits are the threshold's so far: counts for top-k, masses for top-p.
The next pass's programs each sum those histograms over the row's programs (one
fixed tree) and take the highest digit at which what lies at or above it still
reaches k (or ``top_p``), and the first of them records the decision for the pass
after. Eight passes of four bits and a last decision: nine launches of small
programs over every SM, where the sort took four radix passes of the whole row plus
its fills (about 80 us of a Qwen3-8B decode step with its gaps, 75 of SmolLM2's, on
the H200). A value of 2 or more (none in a distribution; a NaN's bits) saturates to
the largest 30-bit pattern, so the order stays that of the values.

What a pass costs is its reductions across the program's threads, not its reads: a
pass summed each bin's mass by its own masked sum (sixteen reductions, each with its
barriers), and the nine launches took 51 us at SmolLM2's vocabulary on an H100. A pass
now accumulates the masses ``SUB`` columns at a time in a ``[BINS, SUB]`` tile and
reduces it once: 41 us at the same chunk of 2,048 columns. Five-bit digits (six
passes of 32 bins) lost to four: each column meets twice the bins. The chunk a program
histograms follows the vocabulary (``chunk_columns``): at most 128 programs a row,
each of at least 1,024 columns; 33 us at SmolLM2's vocabulary (48 programs of 1,024),
43 at Qwen3's (75 of 2,048) (``bench/results/issue23/2026-12-07e-h100-sampler-tiles``).
The decisions then took most of a pass's remaining barriers (11 of 19 in its SM90
PTX): they now reduce top-k's and top-p's histograms side by side, four reductions
where there were eight (13 barriers a pass; not yet timed on a GPU).

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

# Bits decided a pass; the histogram's bins, the bits a threshold is built of (a
# probability's top two are 0: thirty, rounded up to whole digits) and the passes over
# them follow (``radix_digits``). A program histograms at least ``MIN_CHUNK`` columns,
# and a row has at most ``MAX_PROGRAMS`` programs (``chunk_columns``).
DIGIT = 4
MIN_CHUNK = 1024
MAX_PROGRAMS = 128
# The largest pattern of 30 bits: a value of 2 or more (or a NaN) reads as it.
SATURATED = tl.constexpr((1 << 30) - 1)


def radix_digits(digit: int) -> tuple[int, int, int]:
    """For digits of ``digit`` bits: the histogram's bins, the bits a threshold is
    built of (30 rounded up to whole digits), and the passes over them."""
    if not 3 <= digit <= 6:
        raise ValueError(f"digits of {digit} bits: 3 to 6 bits")
    bits = -(-30 // digit) * digit
    return 1 << digit, bits, bits // digit


BINS, BITS, PASSES = radix_digits(DIGIT)


def chunk_columns(vocab: int) -> int:
    """The columns a program histograms for a row of ``vocab``: the smallest power of
    two of at least ``MIN_CHUNK`` that needs at most ``MAX_PROGRAMS`` programs."""
    chunk = MIN_CHUNK
    while triton.cdiv(vocab, chunk) > MAX_PROGRAMS:
        chunk *= 2
    return chunk


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
    digit (``digit`` -1, the first pass), nothing: zeros.

    Top-k's and top-p's columns side by side (``[BINS, 2]``: counts as float32, exact
    below 2**24, and masses), so that each step is one reduction across the program's
    threads for both: the sum over programs, the suffix sums, the select, the sum
    above it. Every program of a pass runs the same reductions on the same
    histograms, so all take the same decision."""
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
    counts = tl.load(count_ptr + at_hist, mask=present, other=0).to(tl.float32)
    masses = tl.load(mass_ptr + at_hist, mask=present, other=0.0)
    hist = tl.sum(tl.join(counts, masses), axis=0)
    at_or_above = (rb[None, :] >= rb[:, None])[:, :, None]
    suffix = tl.sum(tl.where(at_or_above, hist[None, :, :], 0.0), axis=1)
    is_k = tl.arange(0, 2)[None, :] == 0
    above = tl.where(is_k, above_k.to(tl.float32), above_p)
    target = tl.where(is_k, k.to(tl.float32), top_p)
    digits = tl.max(tl.where(above + suffix >= target, rb[:, None], 0), axis=0)
    more = tl.sum(tl.where(rb[:, None] > digits[None, :], hist, 0.0), axis=0)
    digit_k, digit_p = tl.split(digits)
    more_k, more_p = tl.split(more)
    above_k += more_k.to(tl.int32)
    above_p += more_p
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
def _digits(p, shift, DIGIT: tl.constexpr, BINS: tl.constexpr):
    """The bits above the digit at ``shift`` and the digit, of each value's bits (a
    value of 2 or more saturated)."""
    bits = tl.minimum(p.to(tl.int32, bitcast=True) & 0x7FFFFFFF, SATURATED)
    return bits >> tl.minimum(shift + DIGIT, 31), (bits >> shift) & (BINS - 1)


@triton.jit
def _pass_kernel(
    p_ptr, top_k_ptr, top_p_ptr, count_ptr, mass_ptr, state_ptr, above_ptr, V, stride_p,
    rows, programs, digit, PROGRAMS: tl.constexpr, BINS: tl.constexpr, CHUNK: tl.constexpr,
    DIGIT: tl.constexpr, BITS: tl.constexpr, SUB: tl.constexpr = 128,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Pass ``digit`` of row ``program_id(0)``, columns ``program_id(1)``: the decisions
    of the digit before, then this chunk's histograms of the ``DIGIT`` bits below the
    ``digit * DIGIT`` decided ones (of ``BITS``) among the columns on the thresholds'
    way: counts on top-k's, masses on top-p's. The row's first program records the
    decisions for the next pass last, so that no write stands between the reads.

    The masses: each bin's sum over ``SUB`` columns at a time, accumulated in a
    ``[BINS, SUB]`` tile and reduced once at the end (a bin's own masked sum over
    the chunk is a reduction across the program's threads each: sixteen of them took
    most of a pass)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    k, top_p, filters = _row_start(top_k_ptr, top_p_ptr, row, V, PDL)
    if filters:
        prefix_k, above_k, prefix_p, above_p = _decide(
            count_ptr, mass_ptr, state_ptr, above_ptr, row, rows, digit - 1, programs, k,
            top_p, PROGRAMS, BINS,
        )  # fmt: skip
        shift = BITS - DIGIT * (digit + 1)
        bins = tl.arange(0, BINS)
        # Counts: one histogram of the chunk. A filter that is off histograms nothing:
        # its zeros select digit 0 every pass, so its threshold is 0 (every token kept).
        cols = chunk * CHUNK + tl.arange(0, CHUNK)
        p = tl.load(p_ptr + row * stride_p + cols, mask=cols < V, other=0.0)
        high, values = _digits(p, shift, DIGIT, BINS)
        on_k = (cols < V) & (k < V) & ((digit == 0) | (high == prefix_k))
        counts = tl.histogram(values, BINS, mask=on_k)
        # Masses: SUB columns at a time into a [BINS, SUB] tile, reduced once (none
        # for a row whose top-p is off: zeros).
        masses = tl.zeros([BINS], tl.float32)
        if top_p < float("inf"):
            tile = tl.zeros([BINS, SUB], tl.float32)
            for part in tl.static_range(CHUNK // SUB):
                # (Names of their own: an ``if`` may not give one two shapes.)
                part_cols = chunk * CHUNK + part * SUB + tl.arange(0, SUB)
                part_p = tl.load(p_ptr + row * stride_p + part_cols, mask=part_cols < V, other=0.0)
                part_high, part_values = _digits(part_p, shift, DIGIT, BINS)
                on_p = (part_cols < V) & ((digit == 0) | (part_high == prefix_p))
                hit = (part_values[None, :] == bins[:, None]) & on_p[None, :]
                tile += tl.where(hit, part_p[None, :], 0.0)
            masses = tl.sum(tile, axis=1)
        at_hist = ((digit * rows + row) * programs + chunk) * BINS
        tl.store(count_ptr + at_hist + bins, counts)
        tl.store(mass_ptr + at_hist + bins, masses)
        if chunk == 0:
            at = ((digit - 1) * rows + row) * 3
            recorded = digit > 0
            tl.store(state_ptr + at, prefix_k, mask=recorded)
            tl.store(state_ptr + at + 1, above_k, mask=recorded)
            tl.store(state_ptr + at + 2, prefix_p, mask=recorded)
            tl.store(above_ptr + (digit - 1) * rows + row, above_p, mask=recorded)


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
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    chunk: int | None = None,
    digit: int = DIGIT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's top-k and top-p thresholds (float32 ``[rows]`` each) of ``probs``
    (float32 ``[rows, V]``, each row a distribution), for its ``top_k`` (0 or more than
    V: off) and ``top_p`` (``[rows]``). ``chunk``: the columns a program histograms (a
    power of two; by default ``chunk_columns``); ``digit``: the bits a pass decides
    (``bench/sampler_bench.py`` times others against the defaults)."""
    if probs.dim() != 2 or probs.dtype != torch.float32:
        raise ValueError(f"thresholds take 2-D float32 probabilities, not {probs.dtype}")
    rows, vocab = probs.shape
    if top_k.shape != (rows,) or top_p.shape != (rows,):
        raise ValueError(f"{rows} rows take [rows] top_k and top_p")
    probs = probs.contiguous()
    chunk = chunk_columns(vocab) if chunk is None else chunk
    if chunk & (chunk - 1) or chunk < 16:
        raise ValueError(f"a chunk of {chunk} columns is not a power of two of at least 16")
    bins, bits, passes = radix_digits(digit)
    programs = triton.cdiv(vocab, chunk)
    device = probs.device
    counts = torch.empty(passes, rows, programs, bins, dtype=torch.int32, device=device)
    masses = torch.empty(passes, rows, programs, bins, dtype=torch.float32, device=device)
    # The decisions of every digit but the last, which the last launch returns.
    state = torch.empty(passes - 1, rows, 3, dtype=torch.int32, device=device)
    above = torch.empty(passes - 1, rows, dtype=torch.float32, device=device)
    top_k, top_p = top_k.contiguous(), top_p.contiguous()
    fixed = dict(PROGRAMS=triton.next_power_of_2(programs), BINS=bins)
    radix = dict(CHUNK=chunk, SUB=min(chunk, 128), DIGIT=digit, BITS=bits)
    for at in range(passes):
        _pass_kernel[(rows, programs)](
            probs, top_k, top_p, counts, masses, state, above, vocab, probs.stride(0), rows,
            programs, at, num_warps=4, **fixed, **radix, **kernel_options(device),
        )  # fmt: skip
    out_k = torch.empty(rows, dtype=torch.float32, device=device)
    out_p = torch.empty(rows, dtype=torch.float32, device=device)
    _finish_kernel[(rows,)](
        top_k, top_p, counts, masses, state, above, out_k, out_p, vocab, rows, programs,
        PASSES=passes, num_warps=1, **fixed, **kernel_options(device),
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
