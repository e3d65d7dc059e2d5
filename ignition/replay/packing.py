"""Host packing of the staging inputs: the one place that knows their layout.

Each function writes the semantic values of one operation into the fixed staging
buffers; the caller then executes the operation's graph. Helios packs the same
layout natively (the manifest's semantic bindings).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignition.components.token_state import NULL_SLOT, StagingInputs


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
    _write(staging.admit_int, [s.top_k, max_new_tokens])
    floats = [s.temperature, s.top_p, s.min_p]
    floats += [s.repetition_penalty, s.presence_penalty, s.frequency_penalty]
    _write(staging.admit_float, floats)
    _write(staging.admit_seed, [seed])


def pack_chunk(staging: StagingInputs, slot: int, tokens: list[int], ends_prompt: bool) -> None:
    """Inputs of one prefill chunk; the chunk samples when it ends the prompt."""
    _write(staging.chunk_slot, [slot])
    _write(staging.chunk_tokens, tokens)
    _write(staging.chunk_len, [len(tokens)])
    _write(staging.chunk_sample, [int(ends_prompt)])


def pack_decode(staging: StagingInputs, slots: list[int], capacity: int) -> None:
    """Inputs of a decode step at ``capacity``: the slots, padded with the null slot."""
    _write(staging.decode_slots, slots + [NULL_SLOT] * (capacity - len(slots)))
