"""Programmatic dependent launch of the kernels that stream weights (SM90 and later).

A decode step is a chain of kernels, each waiting for the one before it to end: the
last programs of a projection finish one by one while the SMs they leave idle wait,
then the next kernel launches and starts reading its weight. Launched
programmatically (``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, which
stream capture records as a programmatic edge; the graph walk and Helios's rebuild
keep an edge's type), a kernel may start while the one before it ends. Its programs
first prefetch the leading bytes of their weight rows into L2, then wait for the
kernel before (``griddepcontrol.wait``: that kernel has ended and its writes are
visible), then let the kernel after launch (``griddepcontrol.launch_dependents``).

Weights are never written during serving, so their prefetch needs no order. Every
read of an activation and every write comes after the wait, so the kernel computes
what a plain launch computes, bit for bit. Waiting before any write also orders the
kernel after every kernel before it: the kernel before waited for its own
predecessor before it could end.

Preparation turns it on (``PrepareOptions.programmatic_launch``) for the warm-up and
capture; the kernels then take it from ``launch_kwargs`` and ``prefetch_bytes``. Off,
or off the GPU, or before SM90, they launch as before; so they do under Triton's
interpreter, which runs no PTX (``launches_programmatically``). The kernels are the
batch-invariant row projections (at most ``INVARIANT_ROWS`` rows: every decode
projection, and a prefill or admit graph's logits projection of its last rows).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# L2 bytes one kernel's programs prefetch before their wait, together: the leading
# bytes of every weight row, the same count for each. About two microseconds of the
# H200's weight stream, a sixth of its 50 MB L2.
PREFETCH_BYTES = 8 << 20
# cp.async.bulk moves whole 16-byte units from 16-byte aligned addresses.
BULK_UNIT = 16
# The first compute capability with grid dependency control.
MIN_CAPABILITY = (9, 0)

_enabled = False
_budget = PREFETCH_BYTES


@contextmanager
def programmatic_launch(enabled: bool = True, prefetch: int = PREFETCH_BYTES) -> Iterator[None]:
    """Within the block, the weight-streaming kernels launch programmatically on
    devices that can (``launch_kwargs``), each prefetching ``prefetch`` bytes of its
    weight rows in all (``prefetch_bytes``; 0: none, the launch alone)."""
    global _enabled, _budget
    before = _enabled, _budget
    _enabled, _budget = enabled, prefetch
    try:
        yield
    finally:
        _enabled, _budget = before


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


def prefetch_bytes(w: torch.Tensor, rows: int, row_bytes: int) -> int:
    """The bytes to prefetch from the start of each of ``rows`` weight rows of
    ``row_bytes`` (``w``'s rows, or ranges of them) so that together they come to the
    block's prefetch budget (``PREFETCH_BYTES`` unless ``programmatic_launch`` says
    otherwise): whole bulk units, at most the row; 0 where the budget is 0 or the rows
    do not start and end on units (nothing is prefetched then; the launch is still
    programmatic), so no prefetch reads past a row."""
    itemsize = w.element_size()
    whole_units = (w.stride(0) * itemsize) % BULK_UNIT == 0 and (
        w.shape[-1] * itemsize
    ) % BULK_UNIT == 0
    if not _budget or w.data_ptr() % BULK_UNIT or not whole_units or w.stride(-1) != 1:
        return 0
    share = min(row_bytes, max(BULK_UNIT, _budget // max(rows, 1)))
    return share // BULK_UNIT * BULK_UNIT


@triton.jit
def prefetch_rows(starts, nbytes):
    """Prefetch ``nbytes`` (int32, whole 16-byte units) into L2 from each of the
    16-byte aligned addresses ``starts``: a bulk prefetch per element per thread that
    holds it (where the layout gives an element to several threads, each issues it;
    the bytes are the same)."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2; // $0",
        "=r,l,r",
        [starts, nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def await_producer():
    """A programmatically launched kernel's wait for the kernel before it (ended, its
    writes visible after), then the signal that the kernel after may launch. Before
    it, a kernel reads nothing but weights and writes nothing."""
    gdc_wait()
    gdc_launch_dependents()
