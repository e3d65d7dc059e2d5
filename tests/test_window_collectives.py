"""The export-safe collectives (``ignition.parallel.window_collectives``): two ranks'
all-reduce and all-gather over each other's storage.

On the CPU the kernels run interpreted, each rank in a process of its own over shared
memory (the interpreter is not thread-safe), waiting on each other's flags as the two
devices do (their SM90 synchronization instructions: ``test_kernel_compile.py``). On
the GPU both ranks run on the one device, on two streams at once, eager and replayed
from CUDA graphs."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ignition.parallel.launch import spawn_ranks
from ignition.parallel.shard import TensorParallel
from ignition.parallel.shared_collectives import RANK_ADDRESSES, share_collectives, span_size
from ignition.parallel.window_collectives import (
    COUNTER,
    DONE,
    MAX_PROGRAMS,
    CollectiveStorage,
    WindowCollectives,
)

ROOT = Path(__file__).resolve().parent.parent
# Rows and widths of the calls: one program with a tail, three, and more blocks than
# programs (each program strides over several).
SHAPES = [(1, 700), (3, 1000), (2, 34000)]
CAPACITY = 70000


def _storage(device: str = "cpu", capacity: int = CAPACITY) -> CollectiveStorage:
    return CollectiveStorage.allocate(capacity, torch.bfloat16, device)


def _inputs(rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(*shape, generator=generator).bfloat16() for shape in SHAPES]


def _shared_storages() -> list[CollectiveStorage]:
    """Two ranks' storage in shared memory, for forked rank processes."""
    storages = [_storage() for _ in range(2)]
    for storage in storages:
        storage.buffers.share_memory_()
        storage.words.share_memory_()
    return storages


def _both_ranks(target: Callable[..., None], args: list[tuple[object, ...]]) -> None:
    """``target(*args[rank])`` for both ranks at once, each in a forked process; a
    rank still waiting after 240 s fails the test rather than hang it."""
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=target, args=rank_args) for rank_args in args]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(240)
    stuck = [rank for rank, process in enumerate(ranks) if process.exitcode is None]
    for process in ranks:
        process.kill()
    assert not stuck, f"ranks {stuck} still waiting after 240 s"
    assert [process.exitcode for process in ranks] == [0, 0]


def _rank(
    rank: int,
    storages: list[CollectiveStorage],
    sums: list[torch.Tensor],
    gathers: list[torch.Tensor],
) -> None:
    # A forked child's OpenMP pool hangs in a parallel copy: one thread.
    torch.set_num_threads(1)
    collectives = WindowCollectives(rank, storages[rank], storages[1 - rank])
    for x, total, gathered in zip(_inputs(rank), sums, gathers, strict=True):
        total.copy_(collectives.all_reduce(x))
        gathered.copy_(collectives.all_gather_last(x))


def test_two_ranks_reduce_and_gather_through_each_others_storage() -> None:
    storages = _shared_storages()
    sums = [[torch.empty(shape, dtype=torch.bfloat16).share_memory_() for shape in SHAPES]
            for _ in range(2)]  # fmt: skip
    gathers = [[torch.empty(rows, 2 * width, dtype=torch.bfloat16).share_memory_()
                for rows, width in SHAPES] for _ in range(2)]  # fmt: skip
    _both_ranks(_rank, [(rank, storages, sums[rank], gathers[rank]) for rank in range(2)])
    for call, (x0, x1) in enumerate(zip(_inputs(0), _inputs(1), strict=True)):
        # One rounding of the fp32 sum to bfloat16, the same bits on both ranks.
        expected = (x0.float() + x1.float()).bfloat16()
        assert torch.equal(sums[0][call], expected) and torch.equal(sums[1][call], expected)
        both = torch.cat([x0, x1], dim=-1)
        assert torch.equal(gathers[0][call], both) and torch.equal(gathers[1][call], both)
    # Six calls: each rank's counter at the last epoch, its count of programs zeroed,
    # and the peer's flags at the epoch of the last call each program took part in.
    calls = 2 * len(SHAPES)
    for rank, storage in enumerate(storages):
        words = storage.words.tolist()
        assert words[COUNTER] == calls and words[DONE] == 0, (rank, words)
        assert words[:MAX_PROGRAMS] == [calls] * MAX_PROGRAMS, (rank, words)


def _bit_inputs(rank: int) -> tuple[torch.Tensor, ...]:
    """Float32 logits with the values a copy through arithmetic would change (NaN with
    a payload, infinities, -0.0, a subnormal), int64 and int32 tokens, a 0-dim int64,
    a 2-D int64, a transposed float32 and a float16."""
    generator = torch.Generator().manual_seed(20 + rank)
    logits = torch.randn(2, 300, generator=generator)
    specials = torch.tensor([float("inf"), float("-inf"), -0.0, 1e-42])
    logits[0, :4] = specials
    logits.view(torch.int32)[1, :2] = torch.tensor([0x7FC00123, -0x003FFFFF - 1], dtype=torch.int32)
    tokens = torch.randint(0, 1 << 40, (5,), generator=generator)
    small = torch.randint(-(1 << 30), 1 << 30, (3,), generator=generator, dtype=torch.int32)
    scalar = torch.randint(0, 1 << 50, (), generator=generator)
    grid = torch.randint(0, 1 << 50, (2, 3), generator=generator)
    transposed = torch.randn(5, 2, generator=generator).t()
    half = torch.randn(3, 7, generator=generator).half()
    return logits, tokens, small, scalar, grid, transposed, half


def _bit_rank(rank: int, storages: list[CollectiveStorage], results: list[torch.Tensor]) -> None:
    torch.set_num_threads(1)
    collectives = WindowCollectives(rank, storages[rank], storages[1 - rank])
    logits, tokens, small, scalar, grid, transposed, half = _bit_inputs(rank)
    results[0].copy_(collectives.all_gather_last(logits))
    results[1].copy_(collectives.broadcast_from_zero(tokens))
    results[2].copy_(collectives.broadcast_from_zero(small))
    results[3].copy_(collectives.all_reduce(torch.ones(4, dtype=torch.bfloat16)))
    results[4].copy_(collectives.broadcast_from_zero(scalar))
    results[5].copy_(collectives.broadcast_from_zero(grid))
    results[6].copy_(collectives.all_gather_last(transposed))
    results[7].copy_(collectives.all_gather_last(half))


def test_gathers_and_broadcasts_move_any_whole_element_dtype_bit_for_bit() -> None:
    """Float32 logits gathered and int64 / int32 tokens broadcast over bfloat16
    storage, each rank in its own process: every bit as sent (NaN payloads included),
    and the calls keep the ranks' epochs in step for a reduce after them."""
    storages = _shared_storages()
    shapes = [((2, 600), torch.float32), ((5,), torch.int64), ((3,), torch.int32),
              ((4,), torch.bfloat16), ((), torch.int64), ((2, 3), torch.int64),
              ((2, 10), torch.float32), ((3, 14), torch.float16)]  # fmt: skip
    results = [[torch.empty(shape, dtype=dtype).share_memory_() for shape, dtype in shapes]
                for _ in range(2)]  # fmt: skip
    _both_ranks(_bit_rank, [(rank, storages, results[rank]) for rank in range(2)])
    zero, one = _bit_inputs(0), _bit_inputs(1)
    both = torch.cat([zero[0], one[0]], dim=-1).view(torch.int32)
    for rank in range(2):
        gathered, tokens, small, total, scalar, grid, transposed, half = results[rank]
        assert torch.equal(gathered.view(torch.int32), both), rank
        assert torch.equal(tokens, zero[1]) and torch.equal(small, zero[2]), rank
        assert torch.equal(total, torch.full((4,), 2.0, dtype=torch.bfloat16)), rank
        assert torch.equal(scalar, zero[3]) and torch.equal(grid, zero[4]), rank
        assert torch.equal(transposed, torch.cat([zero[5], one[5]], dim=-1)), rank
        assert torch.equal(half, torch.cat([zero[6], one[6]], dim=-1)), rank
    for storage in storages:
        assert storage.words[COUNTER].item() == 8


def test_the_exchange_is_never_traced_by_torch_compile() -> None:
    # Compiled, storage laid out at an address (words and buffers in one storage) would
    # have Inductor hand the kernel a clone of the words: it would wait on the clone
    # while its peer signals the real words. The call runs as is, between compiled
    # regions (the two-process GPU test compiles a call over such storage).
    assert getattr(WindowCollectives._exchange, "_torchdynamo_disable", False)


def test_what_does_not_travel_as_storage_elements_is_refused() -> None:
    own, peer = _storage(), _storage()
    collectives = WindowCollectives(0, own, peer)
    with pytest.raises(ValueError, match=r"whole torch\.bfloat16 elements"):
        collectives.broadcast_from_zero(torch.zeros(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"whole torch\.bfloat16 elements"):
        collectives.all_gather_last(torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(ValueError, match="a sum is taken in the storage's dtype"):
        collectives.all_reduce(torch.zeros(4))
    with pytest.raises(ValueError, match="needs one"):
        collectives.all_gather_last(torch.zeros((), dtype=torch.bfloat16))
    assert own.words.count_nonzero().item() == 0  # nothing ran


def _forked(target: Callable[..., None], args: tuple[object, ...], seconds: float) -> int | None:
    """``target(*args)`` in a forked process, its exit code (None: still running after
    ``seconds``, then killed): a wait that never ends fails the test, not hangs it."""
    process = multiprocessing.get_context("fork").Process(target=target, args=args)
    process.start()
    process.join(seconds)
    code = process.exitcode
    process.kill()
    return code


def _reduce_once(own: CollectiveStorage, peer: CollectiveStorage, x: torch.Tensor,
                 total: torch.Tensor) -> None:  # fmt: skip
    torch.set_num_threads(1)
    total.copy_(WindowCollectives(0, own, peer).all_reduce(x))


def test_a_peer_one_call_ahead_does_not_stall_the_rank() -> None:
    """A peer may finish a call and signal its next one before this rank reads its
    flag: the wait is for the epoch or a later one. Here the peer's slice of the
    first call (parity 1) is in place and its flags already say 2."""
    own, peer = _storage(), _storage()
    for tensor in (own.buffers, own.words, peer.buffers, peer.words):
        tensor.share_memory_()
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)).bfloat16()
    theirs = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2)).bfloat16()
    peer.buffers[1, : x.numel()] = theirs.flatten()
    own.words[:MAX_PROGRAMS] = 2
    total = torch.empty_like(x).share_memory_()
    assert _forked(_reduce_once, (own, peer, x, total), 60) == 0, "the rank waited on"
    assert torch.equal(total, (x.float() + theirs.float()).bfloat16())
    # Rank 0's slice went to its own buffer of parity 1, its signals to the peer.
    assert torch.equal(own.buffers[1, : x.numel()], x.flatten())
    assert peer.words[:3].tolist() == [1, 1, 1] and own.words[COUNTER].item() == 1


def test_a_strided_input_is_summed_in_its_logical_order() -> None:
    """A transposed ``x`` (dense, not contiguous): the sum comes back in ``x``'s shape
    and order, contiguous (the kernel writes the contiguous copy's order)."""
    own, peer = _storage(), _storage()
    for tensor in (own.buffers, own.words, peer.buffers, peer.words):
        tensor.share_memory_()
    x = torch.randn(1000, 3, generator=torch.Generator().manual_seed(1)).bfloat16().t()
    theirs = torch.randn(3, 1000, generator=torch.Generator().manual_seed(2)).bfloat16()
    peer.buffers[1, : x.numel()] = theirs.flatten()
    own.words[:MAX_PROGRAMS] = 1
    total = torch.empty(3, 1000, dtype=torch.bfloat16).share_memory_()
    assert _forked(_reduce_once, (own, peer, x, total), 60) == 0, "the rank waited on"
    assert torch.equal(total, (x.float() + theirs.float()).bfloat16())


def test_a_wait_limit_is_zero_or_positive_nanoseconds() -> None:
    storage = _storage(capacity=16)
    storage.set_wait_limit(5 * 10**9)
    assert int(storage.words[-1]) == 5 * 10**9  # the last word, after the counters
    storage.set_wait_limit(0)
    for bad in (-1, 2**63):
        with pytest.raises(ValueError, match="0 \\(forever\\) or positive"):
            storage.set_wait_limit(bad)


def test_bad_calls_are_refused() -> None:
    own, peer = _storage(), _storage()
    with pytest.raises(ValueError, match="rank 2"):
        WindowCollectives(2, own, peer)
    with pytest.raises(ValueError, match="one shape and dtype"):
        WindowCollectives(0, own, CollectiveStorage.allocate(CAPACITY, torch.float16, "cpu"))
    collectives = WindowCollectives(0, own, peer)
    with pytest.raises(ValueError, match="exceed"):
        collectives.all_reduce(torch.zeros(CAPACITY + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"holds torch\.bfloat16"):
        collectives.all_reduce(torch.zeros(8))
    assert own.words.count_nonzero().item() == 0  # nothing ran


def _tokens_of(x: torch.Tensor) -> torch.Tensor:
    """Six int64 "tokens" made of ``x``'s first values' bits (a rank's own)."""
    return x.flatten()[:6].float().view(torch.int32).to(torch.int64)


@pytest.mark.gpu
def test_two_ranks_on_one_gpu_concurrently_and_replayed() -> None:
    """Both ranks' kernels on two streams of the one device, waiting on each other:
    eager calls, then each rank's calls captured in a graph of its own and the two
    graphs replayed together over fresh inputs, every result bitwise: the bf16 sums and
    gathers, float32 gathers (logits) and int64 broadcasts (tokens)."""
    shapes = [*SHAPES, (4, 4096), (4096, 1024)]  # decode rows and a prefill chunk's
    capacity = 2 * 4096 * 1024  # the float32 gather of the largest
    storages = [_storage("cuda", capacity) for _ in range(2)]
    for storage in storages:  # bounded waits, as Helios loads them: none runs out
        storage.set_wait_limit(10 * 10**9)
    ranks = [WindowCollectives(rank, storages[rank], storages[1 - rank]) for rank in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [[torch.randn(*s, device="cuda", generator=generator).bfloat16() for s in shapes]
              for _ in range(2)]  # fmt: skip

    def calls(rank: int, over: list[WindowCollectives] = ranks) -> list[torch.Tensor]:
        results = []
        for x in inputs[rank]:
            collectives = over[rank]
            results += [collectives.all_reduce(x), collectives.all_gather_last(x),
                        collectives.all_gather_last(x.float()),
                        collectives.broadcast_from_zero(_tokens_of(x))]  # fmt: skip
        return results

    def both() -> list[list[torch.Tensor]]:
        torch.cuda.synchronize()
        results = []
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                results.append(calls(rank))
        torch.cuda.synchronize()
        return results

    def check(results: list[list[torch.Tensor]]) -> None:
        for call, (x0, x1) in enumerate(zip(*inputs, strict=True)):
            expected = (x0.float() + x1.float()).bfloat16()
            both_sides = torch.cat([x0, x1], dim=-1)
            wide = torch.cat([x0.float(), x1.float()], dim=-1)
            for rank in range(2):
                reduced, gathered, logits, tokens = results[rank][4 * call : 4 * call + 4]
                assert torch.equal(reduced, expected), (rank, call)
                assert torch.equal(gathered, both_sides), (rank, call)
                assert torch.equal(logits, wide), (rank, call)
                assert torch.equal(tokens, _tokens_of(x0)), (rank, call)

    # First, every kernel variant compiled and loaded, and each stream's allocator pool
    # filled, while nothing waits: loading a module can wait for the device's work to
    # drain, which a rank spinning on its peer never does. Over scratch storage whose
    # flags say every peer has long arrived: rank 0 passes each wait at once, and its
    # signals let rank 1 pass after it.
    scratch = [_storage("cuda", capacity) for _ in range(2)]
    scratch[0].words[:MAX_PROGRAMS] = 1 << 40
    alone = [WindowCollectives(rank, scratch[rank], scratch[1 - rank]) for rank in range(2)]
    for rank in range(2):
        with torch.cuda.stream(streams[rank]):
            calls(rank, alone)
        torch.cuda.synchronize()
    for _ in range(3):
        check(both())
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    captured = []
    for rank in range(2):
        with torch.cuda.graph(graphs[rank], stream=streams[rank]):
            captured.append(calls(rank))
    for _ in range(20):
        for rank in range(2):
            for x in inputs[rank]:
                x.copy_(torch.randn(x.shape, device="cuda", generator=generator).bfloat16())
        torch.cuda.synchronize()
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                graphs[rank].replay()
        torch.cuda.synchronize()
        check(captured)
    epochs = 4 * len(shapes) * (3 + 20)
    for storage in storages:
        assert storage.words[COUNTER].item() == epochs and storage.words[DONE].item() == 0


# Two fixed addresses, one per rank.
SHARED_ADDRESSES = RANK_ADDRESSES


def test_shared_storage_is_whole_granules_and_two_ranks_only() -> None:
    assert span_size(1, torch.bfloat16) == 2 << 20
    assert span_size(4096 * 1024, torch.bfloat16) == 18 << 20  # 16 MiB of buffers, the words
    with pytest.raises(ValueError, match="two ranks"):
        share_collectives(2, SHARED_ADDRESSES, 1024, torch.bfloat16, 0)
    with pytest.raises(ValueError, match="two ranks"):
        share_collectives(0, SHARED_ADDRESSES[:1], 1024, torch.bfloat16, 0)
    close = (SHARED_ADDRESSES[0], SHARED_ADDRESSES[0] + (16 << 20))
    with pytest.raises(ValueError, match="overlap"):
        share_collectives(0, close, 4096 * 1024, torch.bfloat16, 0)


def _shared_rank(parallel: TensorParallel, out: Path) -> None:
    collectives, spans = share_collectives(
        parallel.rank, SHARED_ADDRESSES, 4096 * 1024, torch.bfloat16, 0
    )
    try:
        # As a compiled model calls it, over storage laid out at an address.
        compiled = torch.compile(lambda x: collectives.all_reduce(x * 1), dynamic=False)
        for call, shape in enumerate([*SHAPES, (4, 4096), (4096, 1024)]):
            xs = [torch.randn(*shape, generator=torch.Generator().manual_seed(100 * call + r))
                  .bfloat16().cuda() for r in range(2)]  # fmt: skip
            reduce = compiled if call == 0 else collectives.all_reduce
            total = reduce(xs[parallel.rank])
            gathered = collectives.all_gather_last(xs[parallel.rank])
            assert torch.equal(total, (xs[0].float() + xs[1].float()).bfloat16()), call
            assert torch.equal(gathered, torch.cat(xs, dim=-1)), call
        torch.cuda.synchronize()
        (out / f"rank-{parallel.rank}").write_text(str(collectives.own.words[COUNTER].item()))
    finally:
        for span in spans:
            span.close()


@pytest.mark.gpu
def test_two_rank_processes_share_their_storage_on_one_gpu(tmp_path: Path) -> None:
    """Two rank processes on the one device: each exports its storage at its address,
    maps its peer's at the peer's (descriptors passed over the process group), and
    their collectives run against each other, every result bitwise."""
    spawn_ranks(2, _shared_rank, tmp_path)
    calls = 2 * (len(SHAPES) + 2)
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == {
        "rank-0": str(calls),
        "rank-1": str(calls),
    }


def test_storage_over_mapped_memory_names_its_device() -> None:
    for device in (torch.device("cuda"), torch.device("cpu")):
        with pytest.raises(ValueError, match="names its CUDA device"):
            CollectiveStorage.over(SHARED_ADDRESSES[0], 1024, torch.bfloat16, device)


def test_a_shared_span_refuses_what_it_cannot_map() -> None:
    """A negative descriptor is refused before any driver call; without a driver (the
    CI machines) an export is Helios's typed error, not a crash."""
    hp = pytest.importorskip("flare_heliopause")
    with pytest.raises(hp.WindowError, match="not a file descriptor"):
        hp.SharedSpan.import_(SHARED_ADDRESSES[0], 2 << 20, -1, 0)
    if not torch.cuda.is_available():
        with pytest.raises(hp.WindowError, match="CUDA driver cannot be loaded"):
            hp.SharedSpan.export(SHARED_ADDRESSES[0], 2 << 20, 0)


LONE_RANK = """
import sys, time, torch
from ignition.parallel.window_collectives import CollectiveStorage, WindowCollectives
own, peer = (CollectiveStorage.allocate(4096, torch.bfloat16, "cuda") for _ in range(2))
own.set_wait_limit(int(sys.argv[1]))
collectives = WindowCollectives(0, own, peer)
x = torch.ones(4, 1024, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
started = time.perf_counter()
try:
    collectives.all_reduce(x)
    torch.cuda.synchronize()
except RuntimeError as error:
    print(f"trapped after {time.perf_counter() - started:.3f} s: {error}")
    sys.exit(0)
print("returned without its peer")
sys.exit(1)
"""


@pytest.mark.gpu
def test_a_rank_whose_peer_never_arrives_traps_after_its_wait_limit() -> None:
    """A rank alone (its peer faulted, or never launched): its wait runs out after the
    limit in its storage and the launch fails with a device error instead of hanging
    (in a process of its own: the error ends that process's CUDA context)."""
    done = subprocess.run(
        [sys.executable, "-c", LONE_RANK, str(200 * 10**6)],  # 200 ms
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    waited = float(done.stdout.split("trapped after ")[1].split(" s")[0])
    assert 0.2 <= waited < 30, done.stdout
