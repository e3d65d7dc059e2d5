"""Timing GPU operations for the micro-benchmarks as Flare runs them: inside a CUDA
graph, back to back, with operands that do not stay in L2.

Timing each eager launch between CUDA events measures the host's launch latency
(tens of microseconds for a Triton launch from Python) whenever the kernel is
shorter; a graph of calls replays them without the host. Serving reads each layer's
weights once per step with every other layer's in between, so the calls rotate
over copies of their operands, together larger than the L2 cache.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# Distinct operand bytes a graph's calls read before one repeats: more than twice
# the H200's 50 MiB L2 cache.
COLD_BYTES = 128 << 20
MAX_COPIES = 256
MIN_CALLS = 8


def cold_copies(operand_bytes: int) -> int:
    """How many copies of an operand of ``operand_bytes`` the calls rotate over."""
    return max(1, min(MAX_COPIES, math.ceil(COLD_BYTES / max(operand_bytes, 1))))


def median_graph_ms(
    calls: Sequence[Callable[[], object]], launches: int = 20, warmup: int = 2
) -> float:
    """Per-call milliseconds: the median over ``launches`` replays of one CUDA graph
    holding ``calls`` (repeated to at least 8), divided by the calls it holds. The
    warm-up runs each call eagerly first (compiling it) on a side stream."""
    import torch

    sequence = list(calls) * math.ceil(MIN_CALLS / len(calls))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            for call in sequence:
                call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in sequence:
            call()
    return statistics.median(replay_ms(graph, launches)) / len(sequence)


def replay_ms(graph: object, replays: int) -> list[float]:
    """Milliseconds of each of ``replays`` replays of a captured CUDA ``graph``, each
    timed between events and waited for before the next."""
    import torch

    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()  # type: ignore[attr-defined]
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def capture(fn: Callable[[], object]) -> object:
    """``fn``'s launches captured as a CUDA graph, after one eager run (compiling
    them)."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def blocks_us(graphs: dict[str, object], replays: int, blocks: int) -> dict[str, dict[str, float]]:
    """Each graph's median and p99 microseconds a replay, the graphs replayed in turn
    in ``blocks`` blocks of ``replays`` each, so a slow phase of the machine falls on
    all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(blocks):
        for name, graph in graphs.items():
            times[name] += [ms * 1000.0 for ms in replay_ms(graph, replays)]
    out = {}
    for name, values in times.items():
        ordered = sorted(values)
        out[name] = {
            "median_us": statistics.median(ordered),
            "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        }
    return out


def run_measurement(
    parser: argparse.ArgumentParser,
    measure: Callable[[argparse.Namespace], dict],
    argv: Sequence[str] | None = None,
    replays: int = 20,
    blocks: int = 3,
) -> int:
    """A GPU micro-benchmark's main: ``parser`` gains ``--replays`` and ``--blocks``
    (the graphs' timing, ``blocks_us``; these defaults) and ``--out`` (the results
    JSON that ``measure(args)`` returns); without a CUDA device it says so and returns
    2."""
    import torch

    parser.add_argument("--replays", type=int, default=replays)
    parser.add_argument("--blocks", type=int, default=blocks)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{parser.prog} needs a CUDA device", file=sys.stderr)
        return 2
    results = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0
