"""A step's reads and writes of request state around its forward (``StepIo``),
compiled as whole graphs, read and write what the eager code does, bit for bit, and
each is one graph (the eager code is a dozen small kernels a step). CPU Inductor."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest
import torch
from torch._dynamo.utils import counters

from ignition.components.token_state import NULL_SLOT, RequestState, StagingInputs
from ignition.preparation.steps import StepIo

VOCAB, HIDDEN = 40, 6


def _storage(device: str) -> tuple[RequestState, StagingInputs]:
    """Request state and staging with distinct values everywhere, some slots done."""
    gen = torch.Generator().manual_seed(5)
    where = torch.device(device)
    state = RequestState.allocate(6, VOCAB, 8, HIDDEN, torch.float32, where)
    staging = StagingInputs.allocate(4, 16, 64, VOCAB, where)
    for tensors in (state, staging):
        for field in fields(tensors):
            t = getattr(tensors, field.name)
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=gen))
            elif t.dtype != torch.bool:
                t.copy_(torch.randint(0, 6, t.shape, generator=gen))
    state.done.copy_(torch.tensor([0, 0, 1, 0, 2, 0], dtype=torch.int32, device=device))
    staging.decode_slots[:4] = torch.tensor([3, 2, NULL_SLOT, 5], device=device)
    staging.chunk_slot.fill_(4)
    staging.chunk_len.fill_(9)
    staging.chunk_sample.fill_(1)
    return state, staging


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    for field in fields(a):  # type: ignore[arg-type]
        assert torch.equal(getattr(a, field.name), getattr(b, field.name)), field.name


def _check(device: str) -> None:
    eager, compiled = StepIo(), StepIo.compiled()
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    state, staging = _storage(device)
    slots = staging.decode_slots[:4]
    for got, want in zip(
        compiled.decode_reads(state, slots), eager.decode_reads(state, slots), strict=True
    ):
        assert got.dtype == want.dtype and torch.equal(got, want)
    for got, want in zip(
        compiled.chunk_reads(state, staging), eager.chunk_reads(state, staging), strict=True
    ):
        assert got.dtype == want.dtype and torch.equal(got, want)
    active = eager.decode_reads(state, slots)[0]
    assert active.tolist() == [True, False, False, True]
    hidden = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(1)).to(device)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2)).to(device)
    consumed = state.consumed.index_select(0, slots)
    expected = copy.deepcopy((state, staging))
    eager.writes(*expected, slots, active, hidden, consumed, active, logits)
    compiled.writes(state, staging, slots, active, hidden, consumed, active, logits)
    _same(state, expected[0])
    _same(staging, expected[1])
    # Only live rows moved: slot 2 is done and the null slot pads.
    assert torch.equal(state.hidden[3], hidden[0]) and torch.equal(state.hidden[5], hidden[3])
    # Each ran as one compiled graph (``fullgraph``: a break would have raised).
    assert counters["stats"]["unique_graphs"] - graphs_before == 3


def test_compiled_step_io_reads_and_writes_what_the_eager_one_does() -> None:
    _check("cpu")


@pytest.mark.gpu
def test_compiled_step_io_reads_and_writes_what_the_eager_one_does_on_the_gpu() -> None:
    _check("cuda")
