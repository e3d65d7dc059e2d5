"""Programmatic dependent launch of a decode layer's Flare kernels (SM90 and later).

A decode step is a chain of kernels, each waiting for the one before it to end: the
last programs of a projection finish one by one while the SMs they leave idle wait,
then the next kernel launches. Launched programmatically
(``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, which stream capture
records as a programmatic edge; the graph walk and Helios's rebuild keep an edge's
type), a kernel may launch while the one before it ends. Its programs first wait for
the kernel before (``griddepcontrol.wait``: that kernel has ended and its writes are
visible), then let the kernel after launch (``griddepcontrol.launch_dependents``).
Where the kernel before lets it launch early (another of these kernels), its launch
latency hides under that kernel's tail.

Every read and every write comes after the wait, so the kernel computes what a plain
launch computes, bit for bit. Waiting before any write also orders the kernel after
every kernel before it: the kernel before waited for its own predecessor before it
could end.

Nothing is read before the wait. An L2 prefetch of the weight rows' first bytes there
was measured on the H200 (``bench/results/issue23/2026-12-04e-h200-programmatic-
launch``): at 2 and 8 MiB a kernel it cost the 8B's decode step what reading those
bytes again costs, streamed ``evict_first`` or not, so it went.

Preparation turns it on (``PrepareOptions.programmatic_launch``, the default) for the
warm-up and capture; the kernels then take it from ``kernel_options``. Off, or off the
GPU, or before SM90, they launch as before; so they do under Triton's interpreter,
which runs no PTX (``launches_programmatically``). The kernels are the
batch-invariant row projections (at most ``INVARIANT_ROWS`` rows: every decode
projection, and a prefill or admit graph's logits projection of its last rows), the
rotary/KV write that follows a layer's qkv projection, and decode attention's split
and merge (the selector's merge too): with those, every kernel of a decode layer but
the Inductor ones between them may launch under its predecessor's tail (on the H200
each such gap was about 0.4 us, and a layer had three).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# The first compute capability with grid dependency control.
MIN_CAPABILITY = (9, 0)

_enabled = False


@contextmanager
def programmatic_launch(enabled: bool = True) -> Iterator[None]:
    """Within the block, the weight-streaming kernels launch programmatically on
    devices that can (``launch_kwargs``)."""
    global _enabled
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


def launches_programmatically(device: torch.device) -> bool:
    """Whether a kernel launched now on ``device`` launches programmatically: never
    under Triton's interpreter, which runs no PTX."""
    return (
        _enabled
        and not triton.knobs.runtime.interpret
        and device.type == "cuda"
        and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY
    )


def launch_kwargs(device: torch.device) -> dict[str, bool]:
    """The launch options of a weight-streaming kernel on ``device``: Triton's
    ``launch_pdl`` when it launches programmatically, else none (a plain launch)."""
    return {"launch_pdl": True} if launches_programmatically(device) else {}


def kernel_options(device: torch.device) -> dict[str, bool]:
    """A kernel's launch options and its ``PDL`` constexpr on ``device``: Triton's
    ``launch_pdl`` and ``PDL`` (the kernel calls ``await_producer`` first) when it
    launches programmatically, else none (a plain launch, ``PDL`` at its default,
    off)."""
    options = launch_kwargs(device)
    return {**options, "PDL": True} if options else {}


@triton.jit
def await_producer():
    """A programmatically launched kernel's wait for the kernel before it (ended, its
    writes visible after), then the signal that the kernel after may launch. Before
    it, a kernel reads and writes nothing."""
    gdc_wait()
    gdc_launch_dependents()
