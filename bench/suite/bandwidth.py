"""The device's read bandwidth, the roofline's denominator: the fastest of three probes
over ``gib`` GiB, each the median of ``repeats`` timed reads.

- ``torch.sum``: reads every byte of a float32 buffer once and writes one value.
- ``stream_read``: a Triton kernel whose programs stride over the buffer in blocks
  of vector loads, each keeping one partial sum.
- ``rows_linear``: Flare's own decode projection (``linear.triton_rows_linear``) of
  one row through a bfloat16 weight of ``gib`` GiB, 4096 columns wide: what the
  step's kernels reach.

A roofline slower than what a kernel reaches would flatter every ratio against it.
On the H200 the ``torch.sum`` probe read 4.23 to 4.40 TB/s in earlier runs, while
Flare's own vocabulary projection streamed its weight at 4.41 to 4.45 TB/s
(``bench/results/issue5/``), so the faster probe counts. Measured once
(``2026-11-30g-two-gpus/attention-long-2/``), the streaming probe read 4.29 TB/s
against ``torch.sum``'s 4.33. In one session of the 2026-12-05 run
(``bench/results/issue23/2026-12-05-h200-changes/``) the two probes gave 4.13 to 4.41
TB/s from one process to the next, while the 8B's vocabulary projection streamed its
1.245 GB at 4.55 TB/s in the process that probed 4.13: the projection is now a probe
too. All are kept in the suite's results. In the 2026-12-05e run
(``bench/results/issue23/2026-12-05e-h200-waves/``) the three still read 4.16 to 4.51
TB/s from one process to the next, the projection's synthetic 4 GiB weight the
slowest, while the 8B's vocabulary head streamed at 4.51 to 4.55 in every process:
``bench/kernel_timeline.py`` also times one row through the served vocabulary head
(``projection_probe`` of its weight) and counts it with the others.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import median

import torch
import triton
import triton.language as tl

# Elements per block load and programs per SM of the streaming probe.
STREAM_BLOCK = 4096
STREAM_PROGRAMS_PER_SM = 8


@triton.jit
def _stream_read_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    """Program p sums blocks p, p + P, p + 2P, ... of ``x`` (P programs) into
    ``partial[p]``."""
    pid = tl.program_id(0)
    stride = tl.num_programs(0) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    for first in range(pid * BLOCK, n, stride):
        offs = first + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


def stream_read(x: torch.Tensor, programs: int, block: int = STREAM_BLOCK) -> torch.Tensor:
    """Per-program partial sums of a contiguous float32 ``x`` (they add up to its sum)."""
    if x.dtype != torch.float32 or not x.is_contiguous() or x.dim() != 1:
        raise ValueError(f"stream_read reads a contiguous 1-d float32 tensor, got {x.dtype}")
    partial = torch.empty(programs, dtype=torch.float32, device=x.device)
    _stream_read_kernel[(programs,)](x, partial, x.numel(), BLOCK=block, num_warps=8)
    return partial


def _median_s(read: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        read()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return median(times[2:])


def read_bandwidth_probes(gib: float = 4.0, repeats: int = 20) -> dict[str, float]:
    """Each probe's read bandwidth in bytes/s. Needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("measuring the read bandwidth needs a CUDA device")
    values = int(gib * (1 << 30)) // 4
    probes = _probe(torch.ones(values, dtype=torch.float32, device="cuda"), repeats)
    torch.cuda.empty_cache()
    probes["rows_linear"] = _projection_probe(gib, repeats)
    torch.cuda.empty_cache()
    return probes


# The projection probe's weight width (the 8B's hidden size; its rows fill ``gib``).
PROJECTION_COLUMNS = 4096


def _projection_probe(gib: float, repeats: int) -> float:
    """Bytes/s of one row's projection through a ``gib`` GiB bfloat16 weight."""
    # The kernel's offsets are int32: at most 2^31 elements (4 GiB of bfloat16).
    rows = min(int(gib * (1 << 30)) // (PROJECTION_COLUMNS * 2), (1 << 31) // PROJECTION_COLUMNS)
    weight = torch.full((rows, PROJECTION_COLUMNS), 2**-12, dtype=torch.bfloat16, device="cuda")
    return projection_probe(weight, repeats)


def projection_probe(weight: torch.Tensor, repeats: int = 20) -> float:
    """Bytes/s of one row's projection through ``weight`` (a CUDA matrix) by Flare's
    decode projection (``linear.triton_rows_linear``), the median of ``repeats``."""
    from ignition.components.linear import triton_rows_linear

    x = torch.ones(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    size = weight.numel() * weight.element_size()
    return size / _median_s(lambda: triton_rows_linear(x, weight, None), repeats)


def _probe(data: torch.Tensor, repeats: int) -> dict[str, float]:
    programs = torch.cuda.get_device_properties(data.device).multi_processor_count
    programs *= STREAM_PROGRAMS_PER_SM
    size = data.numel() * data.element_size()
    return {
        "torch_sum": size / _median_s(lambda: torch.sum(data), repeats),
        "stream_read": size / _median_s(lambda: stream_read(data, programs), repeats),
    }


def measure_read_bandwidth(gib: float = 4.0, repeats: int = 20) -> float:
    """Device read bandwidth in bytes/s: the fastest probe's (``read_bandwidth_probes``)."""
    return max(read_bandwidth_probes(gib, repeats).values())
