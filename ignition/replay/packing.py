"""Host packing of the staging inputs: the one place that knows their layout.

Each function writes the semantic values of one operation into the fixed staging
buffers; the caller then executes the operation's graph. Helios packs the same
layout natively (the manifest's semantic bindings).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ignition.components.token_state import MASK_BITS, NULL_SLOT, StagingInputs, mask_words
from ignition.export import flare_core_pb2 as pb


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


def _write(target: torch.Tensor, values: list[int] | list[float]) -> None:
    target[: len(values)].copy_(torch.tensor(values, dtype=target.dtype))


def pack_admission(
    staging: StagingInputs,
    slot: int,
    prompt: list[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    seed: int,
    consumed: int = 0,
) -> None:
    """Inputs of the admit operation (``consumed`` > 0 after a prefix restore)."""
    s = sampling
    _write(staging.admit_slot, [slot])
    _write(staging.admit_tokens, prompt)
    _write(staging.admit_len, [len(prompt)])
    _write(staging.admit_consumed, [consumed])
    ints = {pb.ADMIT_INT_TOP_K: s.top_k, pb.ADMIT_INT_MAX_NEW_TOKENS: max_new_tokens}
    _write(staging.admit_int, [ints[i] for i in sorted(ints)])
    floats = {
        pb.ADMIT_FLOAT_TEMPERATURE: s.temperature,
        pb.ADMIT_FLOAT_TOP_P: s.top_p,
        pb.ADMIT_FLOAT_MIN_P: s.min_p,
        pb.ADMIT_FLOAT_REPETITION_PENALTY: s.repetition_penalty,
        pb.ADMIT_FLOAT_PRESENCE_PENALTY: s.presence_penalty,
        pb.ADMIT_FLOAT_FREQUENCY_PENALTY: s.frequency_penalty,
    }
    _write(staging.admit_float, [floats[i] for i in sorted(floats)])
    _write(staging.admit_seed, [seed])


Mask = torch.Tensor
"""One row's packed token mask: int32 [mask_words(vocab)] (``token_mask``)."""


def token_mask(allowed: Iterable[int], vocab: int) -> Mask:
    """The packed mask allowing exactly the tokens ``allowed`` of ``vocab``."""
    words = np.zeros(mask_words(vocab), dtype=np.uint32)
    for token in allowed:
        if not 0 <= token < vocab:
            raise ValueError(f"token {token} is outside the vocabulary of {vocab}")
        words[token // MASK_BITS] |= np.uint32(1 << (token % MASK_BITS))
    return torch.from_numpy(words.view(np.int32).copy())


def pack_masks(staging: StagingInputs, masks: Sequence[Mask | None], rows: int) -> None:
    """The token masks of a sampling launch's first ``rows`` rows: every row's flag
    (1 where ``masks`` has a mask) and the words of the masked rows; as Helios
    packs them, the other rows' words are left as they were."""
    if len(masks) > rows:
        raise ValueError(f"{len(masks)} masks for {rows} rows")
    flags = [int(mask is not None) for mask in masks] + [0] * (rows - len(masks))
    _write(staging.sample_masked, flags)
    for row, mask in enumerate(masks):
        if mask is not None:
            staging.sample_mask[row].copy_(mask)


def pack_chunk(
    staging: StagingInputs,
    slot: int,
    tokens: list[int],
    ends_prompt: bool,
    mask: Mask | None = None,
) -> None:
    """Inputs of one prefill chunk; the chunk samples when it ends the prompt,
    under ``mask`` when given."""
    _write(staging.chunk_slot, [slot])
    _write(staging.chunk_tokens, tokens)
    _write(staging.chunk_len, [len(tokens)])
    _write(staging.chunk_sample, [int(ends_prompt)])
    pack_masks(staging, [mask], 1)


def pack_resume(staging: StagingInputs, slot: int, mask: Mask | None = None) -> None:
    """Inputs of a resume: the slot, sampled under ``mask`` when given."""
    _write(staging.resume_slot, [slot])
    pack_masks(staging, [mask], 1)


def pack_decode(
    staging: StagingInputs,
    slots: list[int],
    capacity: int,
    masks: Sequence[Mask | None] = (),
) -> None:
    """Inputs of a decode step at ``capacity``: the slots, padded with the null slot,
    and the rows' masks (``masks[i]`` for ``slots[i]``; unmasked when absent)."""
    _write(staging.decode_slots, slots + [NULL_SLOT] * (capacity - len(slots)))
    pack_masks(staging, masks, capacity)
