"""Collectives that survive export: a two-rank all-reduce and all-gather whose
every operand lives at a fixed address, so a captured graph replays them in a
process that maps both ranks' windows (Helios's serving process, with peer access
between the two devices).

NCCL's captured kernels point into communicator memory that a second process cannot
recreate. These kernels read and write only ``CollectiveStorage``: per rank, two
buffers (alternating between calls, by the call's epoch) and an int64 word array in
that rank's window. A call on rank ``r``, in each program:

1. reads the epoch counter (``words[COUNTER]``, written by the previous call's last
   program; calls on one stream are ordered) and takes ``epoch = counter + 1``;
2. writes its slice of ``x`` into its own buffer of parity ``epoch % 2``;
3. signals the peer: ``peer.words[program] = epoch`` (release, system scope, after
   the program's stores);
4. waits until its own ``words[program] >= epoch`` (acquire, system scope): the
   peer's program of the same index has written its slice. A wait longer than
   ``words[LIMIT]`` nanoseconds (by the device's global timer; 0, what zeroed storage
   holds, waits forever) traps: the launch fails with a device error instead of
   hanging, so a rank whose peer faulted or never launched fails its step. Preparation
   leaves it at 0 (a rank waits in a collective while its peer compiles); the serving
   process sets it at load (the rank layout names the word's offset, ``LIMIT_OFFSET``).
   Under Triton's interpreter the wait is unbounded;
5. reads the peer's slice and writes the result: the sum (reduce), both slices
   side by side in rank order (gather), or rank 0's slice (broadcast);
6. counts itself done; the last program stores ``epoch`` into the counter and
   zeroes the count, for the next call.

The epochs only grow, so nothing is reset between calls and a replayed graph needs no
host input. A rank can be at most one call ahead of its peer (its next call waits for
the peer's signal), so ``>=`` in the wait lets a peer's next signal overwrite this
one's, and the two parities keep a rank from writing the buffer its peer still reads.
Every program of a call must be resident at once on its device (a waiting program
holds its slot): the grid is bounded by ``MAX_PROGRAMS``. Both ranks must make the same
calls in the same order with the same element counts (a program waits for the peer's
program of its index). The signal is an atomic on the peer's memory: across devices it
needs native peer atomics (NVLink; not every PCIe topology has them).

With two ranks, each element's sum is one rounding of ``a + b``, which is the same on
both ranks (addition commutes exactly): the ranks' replicated state stays bitwise
equal. Gather and broadcast only move bits, so they take any dtype whose elements are
whole storage elements (float32 logits and int64 tokens over bfloat16 storage): the
tensor's bytes travel as storage elements and come back as its own dtype.

This is the one-shot form (each rank reads the peer's whole partial); a two-shot form
for long prefill rows is not built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ignition.components.triton_kv_write import _rounded

# Words of a rank's int64 array: one arrival flag per program, then the epoch
# counter, the count of programs done with the current call, and the longest wait in
# nanoseconds before a trap (0: forever).
MAX_PROGRAMS = 64
COUNTER = MAX_PROGRAMS
DONE = MAX_PROGRAMS + 1
LIMIT = MAX_PROGRAMS + 2
WORDS = MAX_PROGRAMS + 3
# Where the wait limit lies from the storage's (the collectives region's) start.
LIMIT_OFFSET = LIMIT * 8
# The words' bytes, rounded up so that the buffers after them start aligned.
WORDS_BYTES = (WORDS * 8 + 255) // 256 * 256
BLOCK = 1024
# What a call's result is (the kernel's MODE).
REDUCE, GATHER, BROADCAST = 0, 1, 2


@dataclass(frozen=True)
class CollectiveStorage:
    """One rank's share of the collectives' memory: ``buffers [2, capacity]`` in the
    collective's dtype, and ``words [WORDS]`` int64 (zero before the first call)."""

    buffers: torch.Tensor
    words: torch.Tensor

    @classmethod
    def allocate(
        cls, capacity: int, dtype: torch.dtype, device: torch.device | str
    ) -> CollectiveStorage:
        return cls(
            torch.empty(2, capacity, dtype=dtype, device=device),
            torch.zeros(WORDS, dtype=torch.int64, device=device),
        )

    @property
    def capacity(self) -> int:
        return self.buffers.shape[1]

    def set_wait_limit(self, nanoseconds: int) -> None:
        """The longest a call on this rank waits for its peer before it traps (0:
        forever). What Helios writes at ``LIMIT_OFFSET`` when it loads a core."""
        if not 0 <= nanoseconds < 2**63:
            raise ValueError(f"a wait limit is 0 (forever) or positive nanoseconds: {nanoseconds}")
        self.words[LIMIT] = nanoseconds

    @staticmethod
    def span_bytes(capacity: int, dtype: torch.dtype) -> int:
        """Bytes of one rank's storage laid out at an address (``over``): the words,
        then the two buffers from the next 256-byte boundary."""
        return WORDS_BYTES + 2 * capacity * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def over(
        cls, address: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> CollectiveStorage:
        """The storage at ``address`` (device memory this process has mapped, at least
        ``span_bytes``, on or reachable from ``device``): the words first, then the
        buffers, as views of that memory (they do not keep it mapped). Zeroed memory
        starts at epoch 0."""
        if device.type != "cuda" or device.index is None:
            raise ValueError(f"storage over mapped memory names its CUDA device: {device}")
        size = cls.span_bytes(capacity, dtype)
        raw = torch.as_tensor(_DeviceMemory(address, size), device=device)
        if raw.data_ptr() != address:  # a copy would never see the peer's writes
            raise RuntimeError(f"torch copied the memory at {address:#x} instead of viewing it")
        words = raw[: WORDS * 8].view(torch.int64)
        buffers = raw[WORDS_BYTES:].view(dtype).view(2, capacity)
        return cls(buffers, words)


class _DeviceMemory:
    """``size`` bytes of device memory at ``address``, as torch wraps it (no copy)."""

    def __init__(self, address: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


@triton.jit
def _global_time(anchor):
    """The device's global timer in nanoseconds (``anchor``, any scalar, gives the
    inline assembly an operand)."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,l", [anchor], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _trap(anchor):
    """Ends the launch with a device error (``anchor`` as in ``_global_time``)."""
    tl.inline_asm_elementwise("trap;", "=r,l", [anchor], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _exchange_kernel(
    x_ptr,
    out_ptr,
    own_buffers_ptr,
    peer_buffers_ptr,
    own_words_ptr,
    peer_words_ptr,
    n,
    width,
    capacity,
    programs,
    RANK: tl.constexpr,
    MODE: tl.constexpr,
    BF16: tl.constexpr,
    BLOCK: tl.constexpr,
    COUNTER: tl.constexpr,
    DONE: tl.constexpr,
    LIMIT: tl.constexpr,
    TIMED: tl.constexpr,
):
    pid = tl.program_id(0)
    epoch = tl.load(own_words_ptr + COUNTER) + 1
    parity = epoch % 2
    own = own_buffers_ptr + parity * capacity
    peer = peer_buffers_ptr + parity * capacity
    blocks = tl.cdiv(n, BLOCK)
    # While loops: the interpreter cannot take a runtime bound in a for loop's range.
    block = pid
    while block < blocks:
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(own + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)
        block += programs
    tl.debug_barrier()  # the program's stores are done before its signal
    tl.atomic_xchg(peer_words_ptr + pid, epoch, sem="release", scope="sys")
    seen = tl.atomic_add(own_words_ptr + pid, 0, sem="acquire", scope="sys")
    if TIMED:
        limit = tl.load(own_words_ptr + LIMIT)
        started = _global_time(epoch)
        while seen < epoch:
            seen = tl.atomic_add(own_words_ptr + pid, 0, sem="acquire", scope="sys")
            if limit > 0 and seen < epoch:  # an arrival on the last poll counts
                if _global_time(seen) - started > limit:
                    _trap(seen)
    else:
        while seen < epoch:
            seen = tl.atomic_add(own_words_ptr + pid, 0, sem="acquire", scope="sys")
    tl.debug_barrier()
    block = pid
    while block < blocks:
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        mine = tl.load(x_ptr + offsets, mask=mask)
        # Plain loads: thread 0's acquire, then the CTA barrier, order them after the
        # peer's stores (its release covers its whole program's, by the barrier before).
        theirs = tl.load(peer + offsets, mask=mask)
        if MODE == 1:  # GATHER
            row = offsets // width
            column = offsets % width
            tl.store(out_ptr + row * 2 * width + RANK * width + column, mine, mask=mask)
            tl.store(out_ptr + row * 2 * width + (1 - RANK) * width + column, theirs, mask=mask)
        elif MODE == 2:  # BROADCAST: rank 0's bits
            if RANK == 0:
                tl.store(out_ptr + offsets, mine, mask=mask)
            else:
                tl.store(out_ptr + offsets, theirs, mask=mask)
        else:
            total = mine.to(tl.float32) + theirs.to(tl.float32)
            if BF16:  # to nearest by its bits (the interpreter's cast truncates)
                total = _rounded(total, tl.bfloat16)
            tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=mask)
        block += programs
    tl.debug_barrier()
    done = tl.atomic_add(own_words_ptr + DONE, 1, sem="acq_rel", scope="gpu")
    if done == programs - 1:
        tl.atomic_xchg(own_words_ptr + DONE, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(own_words_ptr + COUNTER, epoch, sem="release", scope="gpu")


# The bounded wait reads the device's timer, which Triton's interpreter cannot.
TIMED = not isinstance(_exchange_kernel, InterpretedFunction)


class WindowCollectives:
    """Rank ``rank`` of two (the ``Collectives`` of ``ignition.parallel``) over its
    own storage and its peer's, both addressable from this rank's device."""

    # Every operand at a fixed address: a rank may compile and capture over them.
    capturable = True

    def __init__(self, rank: int, own: CollectiveStorage, peer: CollectiveStorage) -> None:
        if rank not in (0, 1):
            raise ValueError(f"window collectives join two ranks; rank {rank} is neither")
        if own.buffers.shape != peer.buffers.shape or own.buffers.dtype != peer.buffers.dtype:
            raise ValueError("both ranks' collective storage must have one shape and dtype")
        self.rank = rank
        self.own = own
        self.peer = peer

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of both ranks' ``x``, the same bits on both."""
        if x.dtype != self.own.buffers.dtype:
            raise ValueError(
                f"the collective storage holds {self.own.buffers.dtype}, not {x.dtype}: "
                "a sum is taken in the storage's dtype"
            )
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        return self._exchange(x, out, REDUCE)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Both ranks' ``x`` side by side along the last dimension, rank 0's first."""
        if x.dim() == 0:
            raise ValueError("a gather along the last dimension needs one")
        bits = self._bits(x)
        out = bits.new_empty(*bits.shape[:-1], 2 * bits.shape[-1])
        return self._exchange(bits, out, GATHER).view(x.dtype)

    def broadcast_from_zero(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` on both ranks, bit for bit (both ranks call it)."""
        bits = self._bits(x.reshape(-1))
        out = torch.empty_like(bits)
        return self._exchange(bits, out, BROADCAST).view(x.dtype).view(x.shape)

    def _bits(self, x: torch.Tensor) -> torch.Tensor:
        """``x``'s bytes as storage elements (the last dimension widened; contiguous
        unless ``x`` already is in the storage's dtype, which ``_exchange`` makes
        contiguous)."""
        storage = self.own.buffers.dtype
        if x.dtype == storage:
            return x
        size, unit = x.element_size(), self.own.buffers.element_size()
        if x.dtype.is_complex or size % unit:
            raise ValueError(
                f"{x.dtype} does not travel as whole {storage} elements of the storage"
            )
        return x.contiguous().view(storage)

    # Never traced by torch.compile: Inductor reinplaces one mutated argument per
    # storage, and storage laid out at an address (``CollectiveStorage.over``) keeps the
    # words and buffers in one, so a compiled call would spin on a clone of the words
    # while the peer signals the real ones (a hang). Run as is, the kernel still lands
    # in the captured graph between the compiled regions.
    @torch.compiler.disable
    def _exchange(self, x: torch.Tensor, out: torch.Tensor, mode: int) -> torch.Tensor:
        if x.numel() > self.own.capacity:
            raise ValueError(
                f"{x.numel()} elements exceed the collective storage's {self.own.capacity}: "
                "prepare it for the largest row count times width"
            )
        x = x.contiguous()
        n = x.numel()
        programs = max(1, min(MAX_PROGRAMS, triton.cdiv(n, BLOCK)))
        _exchange_kernel[(programs,)](
            x, out, self.own.buffers, self.peer.buffers, self.own.words, self.peer.words,
            n, x.shape[-1], self.own.capacity, programs,
            RANK=self.rank, MODE=mode, BF16=x.dtype == torch.bfloat16, BLOCK=BLOCK,
            COUNTER=COUNTER, DONE=DONE, LIMIT=LIMIT, TIMED=TIMED,
        )  # fmt: skip
        return out
