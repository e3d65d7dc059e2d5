"""Per-slot request state on the device, and the staging inputs the host packs.

Slot 0 is the null slot: padded rows of every graph point at it, and commits mask
it out, so padding never writes another request's state. Live requests occupy
slots 1..max_concurrency. Progress follows one model: ``consumed`` tokens are in
every model state (the KV pages), ``pending`` is the sampled token not yet
consumed, and the next decode consumes it at position ``consumed``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

NULL_SLOT = 0
MAX_STOP_TOKENS = 8

# Finish reasons recorded in ``done`` (0 while running).
RUNNING = 0
FINISHED_STOP = 1
FINISHED_LENGTH = 2

COMPLETION_FIELDS = ("slot", "token", "generated", "consumed", "done", "valid")

# Token masks: 32 tokens per int32 word, bit (t % 32) of word (t // 32) set when
# token t may be sampled (the manifest's SEMANTIC_SAMPLE_MASK).
MASK_BITS = 32


def mask_words(vocab: int) -> int:
    """Words of one row's token mask over a ``vocab``-wide logits row."""
    return -(-vocab // MASK_BITS)


# Neutral values of the sampling parameters; every other field resets to zero.
_RESET_VALUES = {"temperature": 1.0, "top_p": 1.0, "repetition": 1.0}


@dataclass
class RequestState:
    """Device storage indexed by request slot (``slots`` = max_concurrency + 1 rows)."""

    pending: torch.Tensor  # int64 [slots]: sampled, not yet consumed
    consumed: torch.Tensor  # int32 [slots]: tokens incorporated into the KV pages
    generated: torch.Tensor  # int32 [slots]: output tokens sampled so far
    max_new: torch.Tensor  # int32 [slots]: output limit
    done: torch.Tensor  # int32 [slots]: finish reason, 0 while running
    temperature: torch.Tensor  # float32 [slots]
    top_k: torch.Tensor  # int32 [slots], 0 disables
    top_p: torch.Tensor  # float32 [slots], 1 disables
    min_p: torch.Tensor  # float32 [slots], 0 disables
    repetition: torch.Tensor  # float32 [slots], 1 is neutral
    presence: torch.Tensor  # float32 [slots], 0 is neutral
    frequency: torch.Tensor  # float32 [slots], 0 is neutral
    seed: torch.Tensor  # int64 [slots]: the request's Philox key
    counter: torch.Tensor  # int64 [slots]: successful samples so far (Philox counter)
    histogram: torch.Tensor  # int32 [slots, vocab]: prompt + output token counts
    page_table: torch.Tensor  # int32 [slots, max_pages]: logical page -> physical page
    hidden: torch.Tensor  # [slots, hidden]: final normalized hidden of the last consumed token
    stop_tokens: torch.Tensor  # int64 [MAX_STOP_TOKENS], -1 padded: EOS ids

    @staticmethod
    def allocate(
        slots: int,
        vocab: int,
        max_pages: int,
        hidden: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> RequestState:
        def z(*shape: int, dt: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dt, device=device)

        f32, i32, i64 = torch.float32, torch.int32, torch.int64
        return RequestState(
            pending=z(slots, dt=i64),
            consumed=z(slots, dt=i32),
            generated=z(slots, dt=i32),
            max_new=z(slots, dt=i32),
            done=z(slots, dt=i32),
            temperature=torch.ones(slots, dtype=f32, device=device),
            top_k=z(slots, dt=i32),
            top_p=torch.ones(slots, dtype=f32, device=device),
            min_p=z(slots, dt=f32),
            repetition=torch.ones(slots, dtype=f32, device=device),
            presence=z(slots, dt=f32),
            frequency=z(slots, dt=f32),
            seed=z(slots, dt=i64),
            counter=z(slots, dt=i64),
            histogram=z(slots, vocab, dt=i32),
            page_table=z(slots, max_pages, dt=i32),
            hidden=z(slots, hidden, dt=dtype),
            stop_tokens=torch.full((MAX_STOP_TOKENS,), -1, dtype=i64, device=device),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        """Back to the admission value in place (no allocation), keeping addresses."""
        for name, tensor in self.tensors().items():
            if name != "stop_tokens":
                tensor.fill_(_RESET_VALUES.get(name, 0))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


@dataclass
class StagingInputs:
    """Host-packed inputs, one fixed buffer per semantic value; graphs read views of them.

    Graphs of every capacity read prefixes of the same buffers, so the host packs
    one layout whatever capacity it replays.
    """

    decode_slots: torch.Tensor  # int64 [max_decode]: slot per row, NULL_SLOT pads
    chunk_slot: torch.Tensor  # int64 [1]
    chunk_tokens: torch.Tensor  # int64 [max_chunk]: prompt tokens of one chunk, 0 pads
    chunk_len: torch.Tensor  # int32 [1]: real tokens in the chunk
    chunk_sample: torch.Tensor  # int32 [1]: 1 when the chunk ends the prompt
    admit_slot: torch.Tensor  # int64 [1]
    admit_tokens: torch.Tensor  # int64 [context_limit]: the whole prompt, for the histogram
    admit_len: torch.Tensor  # int32 [1]
    admit_consumed: torch.Tensor  # int32 [1]: tokens already in the slot (prefix restore)
    admit_int: torch.Tensor  # int32 [2]: positions of the manifest's AdmitIntField
    admit_float: torch.Tensor  # float32 [6]: positions of the manifest's AdmitFloatField
    admit_seed: torch.Tensor  # int64 [1]
    resume_slot: torch.Tensor  # int64 [1]
    maint_slot: torch.Tensor  # int64 [1]
    maint_row: torch.Tensor  # int64 [1]: snapshot row
    maint_expect: torch.Tensor  # int32 [1]: consumed count the restore expects
    completions: torch.Tensor  # int32 [max_rows, len(COMPLETION_FIELDS)]: output records
    sample_mask: torch.Tensor  # int32 [max_rows, mask_words(vocab)]: allowed tokens per row
    sample_masked: torch.Tensor  # int32 [max_rows]: 1 where the row's mask applies
    logits: torch.Tensor  # float32 [max_rows, vocab]: diagnostic copy of sampled rows' logits
    maint_status: torch.Tensor  # int32 [1]: 1 when the last maintenance applied

    @staticmethod
    def allocate(
        max_decode: int, max_chunk: int, context_limit: int, vocab: int, device: torch.device
    ) -> StagingInputs:
        def z(*shape: int, dt: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dt, device=device)

        i32, i64 = torch.int32, torch.int64
        rows = max(max_decode, 1)
        return StagingInputs(
            decode_slots=z(max_decode, dt=i64),
            chunk_slot=z(1, dt=i64),
            chunk_tokens=z(max_chunk, dt=i64),
            chunk_len=z(1, dt=i32),
            chunk_sample=z(1, dt=i32),
            admit_slot=z(1, dt=i64),
            admit_tokens=z(context_limit, dt=i64),
            admit_len=z(1, dt=i32),
            admit_consumed=z(1, dt=i32),
            admit_int=z(2, dt=i32),
            admit_float=z(6, dt=torch.float32),
            admit_seed=z(1, dt=i64),
            resume_slot=z(1, dt=i64),
            maint_slot=z(1, dt=i64),
            maint_row=z(1, dt=i64),
            maint_expect=z(1, dt=i32),
            completions=z(rows, len(COMPLETION_FIELDS), dt=i32),
            sample_mask=z(rows, mask_words(vocab), dt=i32),
            sample_masked=z(rows, dt=i32),
            logits=z(rows, vocab, dt=torch.float32),
            maint_status=z(1, dt=i32),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())
