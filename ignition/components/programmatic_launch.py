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

By default nothing is read before the wait. An L2 prefetch of the weight rows' first
bytes there was measured on the H200 (``bench/results/issue23/2026-12-04e-h200-
programmatic-launch``): at 2 and 8 MiB a kernel it cost the 8B's decode step what
reading those bytes again costs, streamed ``evict_first`` or not, so it went.

With early weights (``PrepareOptions.early_weights``), a row projection loads the weight
tiles of its last K steps before the wait, into registers (as many as 64 registers a
thread hold, at most four steps: ``linear.early_steps``), and holds them through the
K loop over the others (``linear._rows_dot``): no kernel of a step writes a weight, so
a tile is the same whenever it is read. Their bytes stream while the kernel before
ends, are read once, and the wait lets the loop's own pipeline start at once; a small
model's projection of a few steps has most of its weights in flight before the wait.
The steps are the same and in K order, so are the bits. (Loading the first step's tile
early instead would serialize: Triton issues the loop's pipeline only after that step's
dot, which waits for x, in SM90's SASS; ``tests/test_kernel_compile.py`` checks the
PTX order of this one.) Past one row tile (c > 16) no step is loaded early: the
accumulators take the registers.

Preparation turns it on (``PrepareOptions.programmatic_launch``, the default) for the
warm-up and capture; the kernels then take it from ``kernel_options``. Off, or off the
GPU, or before SM90, they launch as before; so they do under Triton's interpreter,
which runs no PTX (``launches_programmatically``). The kernels are the
batch-invariant row projections (at most ``INVARIANT_ROWS`` rows: every decode
projection, and a prefill or admit graph's logits projection of its last rows), the
rotary/KV write that follows a prefill chunk's qkv projection (and a decode row's,
for layers with q/k norms), and decode attention's split (which does decode's rotary
write itself for layers without them) and merge (the selector's merge too): with
those, every kernel of a decode layer but the Inductor ones between them may launch
under its predecessor's tail (on the H200 each such gap was about 0.4 us, and a layer
had three before the norms could fuse and decode's rotary write moved into
attention). The sampler's threshold passes (``sampling_thresholds``) launch so too:
nine in a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime.interpreter import InterpretedFunction

# The first compute capability with grid dependency control.
MIN_CAPABILITY = (9, 0)

_enabled = False
_early_weights = False


@contextmanager
def programmatic_launch(enabled: bool = True, early_weights: bool = False) -> Iterator[None]:
    """Within the block, the weight-streaming kernels launch programmatically on
    devices that can (``launch_kwargs``), the row projections with ``early_weights``
    loading their last weight tile before the wait (``kernel_options``)."""
    global _enabled, _early_weights
    before = _enabled, _early_weights
    _enabled, _early_weights = enabled, early_weights
    try:
        yield
    finally:
        _enabled, _early_weights = before


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


def kernel_options(device: torch.device, early_steps: int = 0) -> dict[str, bool | int]:
    """A kernel's launch options and its ``PDL`` constexpr on ``device``: Triton's
    ``launch_pdl`` and ``PDL`` (the kernel calls ``await_producer`` first) when it
    launches programmatically, else none (a plain launch, ``PDL`` at its default,
    off). A row projection passes the K steps it would load early
    (``linear.early_steps``); when the block asked for early weights it also gets
    them as ``EARLY_WEIGHTS``, those steps' weight tiles loaded before the wait."""
    options: dict[str, bool | int] = {**launch_kwargs(device)}
    if not options:
        return {}
    early = {"EARLY_WEIGHTS": early_steps} if early_steps and _early_weights else {}
    return {**options, "PDL": True, **early}


@triton.jit
def _await_producer():
    """A programmatically launched kernel's wait for the kernel before it (ended, its
    writes visible after), then the signal that the kernel after may launch. Before
    it, a kernel reads nothing but weights and writes nothing."""
    gdc_wait()
    gdc_launch_dependents()


@triton.jit
def _ran_before():
    """Under Triton's interpreter, which runs each kernel after the one before it has
    ended (and cannot run the PTX of a wait): nothing to wait for. (The interpreter
    runs a function only where it sees ``triton.language``.)"""
    tl.static_assert(True)


# The wait a kernel launched programmatically calls (``_await_producer``); under the
# interpreter, none, so that the tests run the kernels' early-weights order there.
await_producer = (
    _ran_before if isinstance(_await_producer, InterpretedFunction) else _await_producer
)
