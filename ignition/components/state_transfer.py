"""Exact endpoint transfers for a dense prefix checkpoint.

A dense model's continuation state at consumed count S is its full KV pages (shared,
immutable, never copied), the partial tail page holding tokens [64 * (S // 64), S),
and the saved final hidden vector for resume sampling. A snapshot row owns a copy
of the whole tail page; restore copies it into the destination slot's private tail
page. At an aligned endpoint there is no tail page and maintenance writes no page.
All indices come from device staging buffers, so one captured graph serves every
slot, row and page.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignition.components.kv_cache import NULL_PAGE, PagedKvCache
from ignition.components.token_state import RequestState, StagingInputs


@dataclass
class SnapshotRows:
    """Immutable checkpoint rows: tail page of every layer, hidden vector, consumed count."""

    kv: torch.Tensor  # [rows, layers, 2, page_size, kv_heads, head_dim]
    hidden: torch.Tensor  # [rows, hidden]
    consumed: torch.Tensor  # int32 [rows]

    @staticmethod
    def allocate(rows: int, cache: PagedKvCache, hidden: int, device: torch.device) -> SnapshotRows:
        layers, _, _, page_size, kv_heads, head_dim = cache.kv.shape
        return SnapshotRows(
            kv=torch.zeros(
                rows, layers, 2, page_size, kv_heads, head_dim, dtype=cache.kv.dtype, device=device
            ),
            hidden=torch.zeros(rows, hidden, dtype=cache.kv.dtype, device=device),
            consumed=torch.zeros(rows, dtype=torch.int32, device=device),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"kv": self.kv, "hidden": self.hidden, "consumed": self.consumed}

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


def _tail_page(state: RequestState, slot: torch.Tensor, consumed: torch.Tensor, page_size: int):
    """Physical tail page of a slot at ``consumed``, or the null page when aligned."""
    logical = (consumed // page_size).to(torch.int64).unsqueeze(1)
    page = state.page_table.index_select(0, slot).gather(1, logical).squeeze(1).to(torch.int64)
    return torch.where(consumed % page_size != 0, page, NULL_PAGE)


def snapshot(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """Freeze the slot's exact consumed state into snapshot row ``maint_row``."""
    slot, row = staging.maint_slot, staging.maint_row
    consumed = state.consumed.index_select(0, slot)
    page = _tail_page(state, slot, consumed, cache.page_size)
    rows.kv.index_copy_(0, row, cache.kv.index_select(2, page).permute(2, 0, 1, 3, 4, 5))
    rows.hidden.index_copy_(0, row, state.hidden.index_select(0, slot))
    rows.consumed.index_copy_(0, row, consumed)
    staging.maint_status.fill_(1)


def restore(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """Install snapshot row ``maint_row`` into the slot, whose page table the host has
    pointed at the shared full pages and a private tail page. Applies only when the
    row holds the consumed count the scheduler expects (``maint_status`` says)."""
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
