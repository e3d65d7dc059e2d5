"""Exact endpoint transfers for a prefix checkpoint.

A model's continuation state at consumed count S is its full pages (shared,
immutable, never copied), the partial tail page holding tokens [64 * (S // 64), S)
of the K/V pages and of every further paged tensor, the continuation rows its recipe
declares (recurrent and convolution state, token histories; none for a dense
model), and the saved final hidden vector for resume sampling. A snapshot row owns
a copy of each whole tail page and of the continuation row; restore copies the tail
pages into the destination slot's private tail page and the row into the slot. At
an aligned endpoint there is no tail page and maintenance writes no page. All
indices come from device staging buffers, so one captured graph serves every slot,
row and page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ignition.components.continuation import ContinuationRows, RowField
from ignition.components.kv_cache import NULL_PAGE, PagedKvCache
from ignition.components.token_state import RequestState, StagingInputs
from ignition.components.triton_state_transfer import launches, triton_restore, triton_snapshot


@dataclass
class SnapshotRows:
    """Immutable checkpoint rows: tail page of every layer, hidden vector, consumed
    count; the tail page of every further paged tensor and the continuation row."""

    kv: torch.Tensor  # [rows, layers, 2, page_size, kv_heads, head_dim]
    hidden: torch.Tensor  # [rows, hidden]
    consumed: torch.Tensor  # int32 [rows]
    # Tail page of each further paged tensor: [rows, layers, *page_shape].
    pages: dict[str, torch.Tensor] = field(default_factory=dict)
    continuation: ContinuationRows = field(
        default_factory=lambda: ContinuationRows((), 0, torch.device("cpu"))
    )

    @staticmethod
    def allocate(
        rows: int,
        cache: PagedKvCache,
        hidden: int,
        device: torch.device,
        fields: tuple[RowField, ...] = (),
    ) -> SnapshotRows:
        layers, _, _, page_size, kv_heads, head_dim = cache.kv.shape
        pages = {
            name: torch.zeros(rows, t.shape[0], *t.shape[2:], dtype=t.dtype, device=device)
            for name, t in cache.extra.items()
        }
        return SnapshotRows(
            kv=torch.zeros(
                rows, layers, 2, page_size, kv_heads, head_dim, dtype=cache.kv.dtype, device=device
            ),
            hidden=torch.zeros(rows, hidden, dtype=cache.kv.dtype, device=device),
            consumed=torch.zeros(rows, dtype=torch.int32, device=device),
            pages=pages,
            continuation=ContinuationRows(fields, rows, device),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """By manifest name (``snapshot.<name>``); a dense model's are kv, hidden and
        consumed alone."""
        named = {"kv": self.kv, "hidden": self.hidden, "consumed": self.consumed}
        named.update({f"paged.{n}": t for n, t in self.pages.items()})
        named.update({f"rows.{n}": t for n, t in self.continuation.tensors.items()})
        return named

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def _tail_page(state: RequestState, slot: torch.Tensor, consumed: torch.Tensor, page_size: int):
    """Physical tail page of a slot at ``consumed``, or the null page when aligned."""
    logical = (consumed // page_size).to(torch.int64).unsqueeze(1)
    page = state.page_table.index_select(0, slot).gather(1, logical).squeeze(1).to(torch.int64)
    return torch.where(consumed % page_size != 0, page, NULL_PAGE)


def snapshot(
    state: RequestState,
    cache: PagedKvCache,
    rows: SnapshotRows,
    staging: StagingInputs,
    live: ContinuationRows | None = None,
) -> None:
    """Freeze the slot's exact consumed state into snapshot row ``maint_row``
    (``live``: the slots' continuation rows, when the model has any). On the GPU the
    pages, hidden vector and count take one launch (``triton_state_transfer``)."""
    if launches(state, cache, rows):
        triton_snapshot(state, cache, rows, staging)
    else:
        snapshot_reference(state, cache, rows, staging)
    slot, row = staging.maint_slot, staging.maint_row
    if cache.extra:
        page = _tail_page(state, slot, state.consumed.index_select(0, slot), cache.page_size)
        for name, paged in cache.extra.items():
            rows.pages[name].index_copy_(0, row, paged.index_select(1, page).transpose(0, 1))
    if live is not None and live.fields:
        rows.continuation.copy_from(live, slot, row)


def snapshot_reference(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """``snapshot``'s K/V tail page, hidden vector, count and status in eager torch."""
    slot, row = staging.maint_slot, staging.maint_row
    consumed = state.consumed.index_select(0, slot)
    page = _tail_page(state, slot, consumed, cache.page_size)
    rows.kv.index_copy_(0, row, cache.kv.index_select(2, page).permute(2, 0, 1, 3, 4, 5))
    rows.hidden.index_copy_(0, row, state.hidden.index_select(0, slot))
    rows.consumed.index_copy_(0, row, consumed)
    staging.maint_status.fill_(1)


def restore(
    state: RequestState,
    cache: PagedKvCache,
    rows: SnapshotRows,
    staging: StagingInputs,
    live: ContinuationRows | None = None,
) -> None:
    """Install snapshot row ``maint_row`` into the slot, whose page table the host has
    pointed at the shared full pages and a private tail page. Applies only when the
    row holds the consumed count the scheduler expects (``maint_status`` says). On
    the GPU the pages, hidden vector and count take one launch."""
    if launches(state, cache, rows):
        triton_restore(state, cache, rows, staging)
    else:
        restore_reference(state, cache, rows, staging)
    if not cache.extra and (live is None or not live.fields):
        return
    slot, row = staging.maint_slot, staging.maint_row
    consumed = rows.consumed.index_select(0, row)
    ok = consumed == staging.maint_expect
    page = torch.where(ok, _tail_page(state, slot, consumed, cache.page_size), NULL_PAGE)
    for name, paged in cache.extra.items():
        current = paged.index_select(1, page)
        saved = rows.pages[name].index_select(0, row).transpose(0, 1)
        paged.index_copy_(1, page, torch.where(ok, saved, current))
    if live is not None:
        live.copy_from(rows.continuation, row, slot, apply=ok)


def restore_reference(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """``restore``'s K/V tail page, hidden vector, count and status in eager torch."""
    slot, row = staging.maint_slot, staging.maint_row
    consumed = rows.consumed.index_select(0, row)
    ok = consumed == staging.maint_expect
    page = torch.where(ok, _tail_page(state, slot, consumed, cache.page_size), NULL_PAGE)
    current = cache.kv.index_select(2, page)
    saved = rows.kv.index_select(0, row).permute(1, 2, 0, 3, 4, 5)
    cache.kv.index_copy_(2, page, torch.where(ok, saved, current))
    hidden = state.hidden.index_select(0, slot)
    state.hidden.index_copy_(0, slot, torch.where(ok, rows.hidden.index_select(0, row), hidden))
    state.consumed.index_copy_(
        0, slot, torch.where(ok, consumed, state.consumed.index_select(0, slot))
    )
    staging.maint_status.copy_(ok.to(torch.int32))
