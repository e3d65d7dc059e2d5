"""Timing a GPU operation for the micro-benchmarks: CUDA events around each launch."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def median_event_ms(fn: Callable[[], object], launches: int = 50, warmup: int = 5) -> float:
    """The median of ``launches`` CUDA-event timings of ``fn`` (after ``warmup`` calls,
    which also compile it), each launch synchronized before the next."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(launches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
