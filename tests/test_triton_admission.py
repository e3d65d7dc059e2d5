"""Admission in two launches (``triton_admission``) writes what the eager reference
writes, bit for bit: under Triton's interpreter here, on the GPU in the GPU run."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from ignition.components import sampling
from ignition.components.token_state import RequestState, StagingInputs
from ignition.components.triton_admission import BLOCK, CHUNK, triton_admit


def _filled(device: str, vocab: int, context: int, seed: int):
    """State and staging of 4 slots with every field holding stale, distinct values
    (an earlier request's), and a staged prompt with repeats, the vocabulary's last
    token and stale tokens past its length."""
    gen = torch.Generator().manual_seed(seed)
    state = RequestState.allocate(4, vocab, 4, 8, torch.float32, torch.device(device))
    staging = StagingInputs.allocate(4, 64, context, vocab, torch.device(device))
    for tensors in (state, staging):
        for field in fields(tensors):
            t = getattr(tensors, field.name)
            if t.dtype.is_floating_point:
                t.copy_(torch.rand(t.shape, generator=gen) * 3)
            else:
                t.copy_(torch.randint(0, 50, t.shape, generator=gen))
    length = context - 3
    prompt = torch.randint(0, vocab, (context,), generator=gen)
    prompt[:5] = torch.tensor([vocab - 1, 0, 7, 7, vocab - 1])
    staging.admit_tokens.copy_(prompt)
    staging.admit_len.fill_(length)
    staging.admit_slot.fill_(2)
    staging.admit_seed.fill_(2**40 + 17)
    staging.admit_consumed.fill_(48)
    return state, staging


def _check(device: str, vocab: int, context: int, admit=triton_admit) -> None:
    expected, staging = _filled(device, vocab, context, seed=vocab + context)
    sampling.admit_reference(expected, staging)
    state, staging = _filled(device, vocab, context, seed=vocab + context)
    admit(state, staging)
    for field in fields(state):
        assert torch.equal(getattr(state, field.name), getattr(expected, field.name)), field.name
    # The stale tokens past the length counted nothing; every other slot kept its row.
    row = state.histogram[2].cpu()
    assert int(row.sum()) == context - 3 and int(row[vocab - 1]) >= 2


@pytest.mark.parametrize(
    ("vocab", "context"),
    [
        (2 * CHUNK + 5, 2 * BLOCK + 100),  # partial last chunk and block
        (300, 40),  # one of each
    ],
)
def test_two_launches_write_what_eager_admission_writes_interpreted(
    vocab: int, context: int
) -> None:
    _check("cpu", vocab, context)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("vocab", "context"), [(151_936, 8192), (49_152, 8192), (2 * CHUNK + 5, 2 * BLOCK + 100)]
)
def test_two_launches_write_what_eager_admission_writes_on_the_gpu(
    vocab: int, context: int
) -> None:
    # Through ``admit``, which takes the two launches where the state is on a GPU.
    _check("cuda", vocab, context, sampling.admit)


def test_a_token_outside_the_vocabulary_counts_in_no_other_slots_row_interpreted() -> None:
    state, staging = _filled("cpu", 300, 40, seed=3)
    others = state.histogram[[0, 1, 3]].clone()
    staging.admit_tokens[4] = 300 + 7  # past the row's end: slot 3's column 7
    triton_admit(state, staging)
    assert torch.equal(state.histogram[[0, 1, 3]], others)
    assert int(state.histogram[2].sum()) == 40 - 3 - 1
