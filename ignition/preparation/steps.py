"""The serving operations of a dense text model, one callable per catalog entry.

Each callable reads only fixed storage (request state, pages, staging inputs) and
writes only fixed storage, so it can be captured once and replayed with new inputs.
Padded and inactive rows are masked: they read the null slot or null page and
write back what they read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ignition.components import sampling, state_transfer
from ignition.components.continuation import ContinuationRows
from ignition.components.kv_cache import AttentionStep, PagedKvCache, computed_once, slot_mapping
from ignition.components.state_transfer import SnapshotRows
from ignition.components.token_state import NULL_SLOT, RUNNING, RequestState, StagingInputs
from ignition.preparation.catalog import Catalog, GraphKey, GraphKind


class TextModel(Protocol):
    def forward_tokens(
        self, tokens: torch.Tensor, positions: torch.Tensor, step: AttentionStep
    ) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def compile_layers(self, **options: object) -> None: ...


@dataclass
class Storage:
    """Everything the graphs read and write, owned for the prepared model's lifetime."""

    state: RequestState
    cache: PagedKvCache
    snapshots: SnapshotRows
    staging: StagingInputs
    # The recipe's continuation rows by request slot (none for a dense model).
    rows: ContinuationRows = field(
        default_factory=lambda: ContinuationRows((), 0, torch.device("cpu"))
    )


ForwardFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
CommitFn = Callable[[RequestState, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class SamplingOps:
    """The sampling half of every graph that samples: the fixed-row arithmetic
    (``sampling.sample_padded``) and the commit. Preparation compiles both when it
    compiles the forwards; run eagerly they are a few hundred small kernels per step
    (the Philox rounds alone are about 150)."""

    sample: sampling.SamplePadded = sampling.sample_padded
    commit: CommitFn = sampling.commit_samples

    @staticmethod
    def compiled() -> SamplingOps:
        """Both compiled as whole graphs: the sample at one shape (the sampler's fixed
        row count) whatever the step's rows, so every graph runs the same kernels and
        a request's draw stays independent of its batch; the commit is integer
        arithmetic, exact however it is fused."""
        return SamplingOps(
            sample=torch.compile(sampling.sample_padded, fullgraph=True, dynamic=False),
            commit=torch.compile(sampling.commit_samples, fullgraph=True, dynamic=False),
        )


def _save_hidden(state: RequestState, slots: torch.Tensor, live: torch.Tensor, h: torch.Tensor):
    old = state.hidden.index_select(0, slots)
    state.hidden.index_copy_(0, slots, torch.where(live.unsqueeze(1), h, old))


def decode_reads(
    state: RequestState, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a decode step reads of its rows' request state before its forward: which
    rows are live, their consumed counts, positions, pending tokens and page tables."""
    active = (slots != NULL_SLOT) & (state.done.index_select(0, slots) == RUNNING)
    consumed = state.consumed.index_select(0, slots)
    positions = torch.where(active, consumed, 0).to(torch.int64)
    tokens = state.pending.index_select(0, slots)
    return active, consumed, positions, tokens, state.page_table.index_select(0, slots)


def chunk_reads(
    state: RequestState, staging: StagingInputs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a prefill chunk reads before its forward: whether its slot is live, its
    real tokens, the slot's consumed count and page table, and whether it samples
    (it ends the prompt)."""
    slot = staging.chunk_slot
    live = slot != NULL_SLOT
    n_valid = torch.where(live, staging.chunk_len, 0)
    start = state.consumed.index_select(0, slot)
    ends_prompt = live & (staging.chunk_sample != 0) & (n_valid > 0)
    return live, n_valid, start, state.page_table.index_select(0, slot), ends_prompt


def step_writes(
    state: RequestState,
    staging: StagingInputs,
    slots: torch.Tensor,
    live: torch.Tensor,
    hidden: torch.Tensor,
    consumed: torch.Tensor,
    added: torch.Tensor,
    logits: torch.Tensor,
) -> None:
    """What a step writes after its forward, before sampling: each live row's hidden
    vector, its consumed count (``consumed`` before the step, ``added`` by it), and the
    rows' logits into the staging buffer the sampler reads."""
    _save_hidden(state, slots, live, hidden)
    state.consumed.index_copy_(0, slots, consumed + added.to(torch.int32))
    staging.logits[: logits.shape[0]].copy_(logits)


@dataclass(frozen=True)
class StepIo:
    """The reads of request state around a step's forward and its writes after it
    (``decode_reads``, ``chunk_reads``, ``step_writes``). Eager they are a dozen small
    kernels a step, each a graph node of a few microseconds; preparation compiles
    them as whole graphs when it compiles the sampler. Gathers, selections and copies:
    exact however they are fused."""

    decode_reads: Callable[..., tuple[torch.Tensor, ...]] = decode_reads
    chunk_reads: Callable[..., tuple[torch.Tensor, ...]] = chunk_reads
    writes: Callable[..., None] = step_writes

    @staticmethod
    def compiled() -> StepIo:
        def compile(fn: Callable[..., object]) -> Callable[..., object]:
            return torch.compile(fn, fullgraph=True, dynamic=False)

        return StepIo(compile(decode_reads), compile(chunk_reads), compile(step_writes))


def decode_forward(model: TextModel, page_size: int) -> ForwardFn:
    """Forward for ``rows`` pending tokens, one per request: (hidden, logits)."""

    def forward(
        tokens: torch.Tensor,
        positions: torch.Tensor,
        active: torch.Tensor,
        page_tables: torch.Tensor,
        slots: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = slot_mapping(page_tables, positions, active, page_size)
        seq_lens = computed_once(torch.where(active, positions + 1, 0).to(torch.int32))
        step = AttentionStep(rows, page_tables, seq_lens, None, None, slots)
        hidden = model.forward_tokens(tokens, positions, step)
        return hidden, model.logits(hidden)

    return forward


def prefill_forward(model: TextModel, page_size: int) -> ForwardFn:
    """Forward for one request's chunk: (hidden of the last real token, its logits)."""

    def forward(
        tokens: torch.Tensor,
        start: torch.Tensor,
        n_valid: torch.Tensor,
        page_table: torch.Tensor,
        slot: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.arange(tokens.shape[0], device=tokens.device)
        valid = index < n_valid
        positions = start.to(torch.int64) + index
        rows = slot_mapping(page_table.expand(tokens.shape[0], -1), positions, valid, page_size)
        step = AttentionStep(rows, page_table[0], None, start, n_valid, slot)
        hidden = model.forward_tokens(tokens, positions, step)
        last = hidden.index_select(0, (n_valid.to(torch.int64) - 1).clamp(min=0))
        return last, model.logits(last)

    return forward


def build_steps(
    catalog: Catalog,
    storage: Storage,
    decode: ForwardFn,
    prefill: ForwardFn,
    logits: Callable[[torch.Tensor], torch.Tensor],
    ops: SamplingOps | None = None,
    io: StepIo | None = None,
    token_masks: bool = True,
    broadcast: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[GraphKey, Callable[[], None]]:
    """One zero-argument callable per catalog entry, over the fixed storage; sampling
    reads the staged token masks unless ``token_masks`` is False. A tensor-parallel
    rank passes its group's ``broadcast`` (rank 0's tensor on every rank): each step's
    state update and records then follow rank 0's sampled tokens on every rank, so the
    ranks' replicated state cannot part, whatever their samplers did."""
    state, staging, cache = storage.state, storage.staging, storage.cache
    sampler_rows = max(catalog.decode)
    ops = ops or SamplingOps()
    io = io or StepIo()

    def sample(slots: torch.Tensor) -> torch.Tensor:
        # The step's logits are in staging.logits (one row per slot, then stale rows,
        # which the sampler's independent rows ignore): no padded copy.
        # Each sampled row's token mask, applied where its flag is set (the host
        # writes every row's flag each launch).
        masks = (staging.sample_mask, staging.sample_masked) if token_masks else None
        tokens = sampling.sample_rows(staging.logits, state, slots, sampler_rows, ops.sample, masks)
        return tokens if broadcast is None else broadcast(tokens)

    def decode_step(capacity: int) -> Callable[[], None]:
        def run() -> None:
            slots = staging.decode_slots[:capacity]
            active, consumed, positions, pending, page_tables = io.decode_reads(state, slots)
            hidden, row_logits = decode(pending, positions, active, page_tables, slots)
            io.writes(state, staging, slots, active, hidden, consumed, active, row_logits)
            tokens = sample(slots)
            ops.commit(state, slots, tokens, active, staging.completions)

        return run

    def prefill_step(capacity: int) -> Callable[[], None]:
        def run() -> None:
            slot = staging.chunk_slot
            live, n_valid, start, page_table, ends_prompt = io.chunk_reads(state, staging)
            chunk = staging.chunk_tokens[:capacity]
            hidden, row_logits = prefill(chunk, start, n_valid, page_table, slot)
            io.writes(state, staging, slot, live, hidden, start, n_valid, row_logits)
            tokens = sample(slot)
            ops.commit(state, slot, tokens, ends_prompt, staging.completions)

        return run

    def resume_step() -> None:
        slot = staging.resume_slot
        live = (slot != NULL_SLOT) & (state.done.index_select(0, slot) == RUNNING)
        row_logits = logits(state.hidden.index_select(0, slot))
        staging.logits[:1].copy_(row_logits)
        tokens = sample(slot)
        ops.commit(state, slot, tokens, live, staging.completions)

    def admit_step() -> None:
        sampling.admit(state, staging)
        # A fresh request starts from the rows' admission values; one admitted onto a
        # restored prefix keeps the restored rows.
        storage.rows.reset(staging.admit_slot, staging.admit_consumed == 0)

    def snapshot_step() -> None:
        state_transfer.snapshot(state, cache, storage.snapshots, staging, storage.rows)

    def restore_step() -> None:
        state_transfer.restore(state, cache, storage.snapshots, staging, storage.rows)

    steps: dict[GraphKey, Callable[[], None]] = {}
    for capacity in catalog.decode:
        steps[GraphKey(GraphKind.DECODE, capacity)] = decode_step(capacity)
    for capacity in catalog.prefill:
        steps[GraphKey(GraphKind.PREFILL, capacity)] = prefill_step(capacity)
    steps[GraphKey(GraphKind.RESUME, 1)] = resume_step
    steps[GraphKey(GraphKind.ADMIT, 1)] = admit_step
    steps[GraphKey(GraphKind.SNAPSHOT, 1)] = snapshot_step
    steps[GraphKey(GraphKind.RESTORE, 1)] = restore_step
    return steps
