"""A prefix checkpoint's snapshot and restore in one launch each: the tail page of
every layer's keys and values, the hidden vector, the consumed count and the status
(``state_transfer``'s eager code is the reference).

Eager, a snapshot was about 16 kernels (the tail page's lookup, a gather of the page
into a temporary and its copy into the row, the hidden vector's and the count's
copies, the status) and a restore about 26; each is a graph node of a few
microseconds whatever its bytes, and a tool request on a positional-KV core
snapshots every message endpoint before its first token. Here one program per
``BLOCK`` elements of one layer's keys or values (a slab) of the page copies them
once, and the first program also copies the hidden vector and the count and writes
the status. Every program finds the page itself, from the slot's page table and the
consumed count (the slot's for a snapshot, the row's for a restore), which no program
writes.

What is written is what the eager code writes, bit for bit: copies alone, the null
page's at an aligned endpoint included. A restore whose row does not hold the count
the scheduler expects writes nothing but the status (0), as the eager code writes
back what it read.

Further paged tensors and continuation rows (a hybrid model's) are left to the eager
code, which runs after the launch and reads nothing it writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from ignition.components.kv_cache import NULL_PAGE, PAGE_AXIS

if TYPE_CHECKING:
    from ignition.components.kv_cache import PagedKvCache
    from ignition.components.state_transfer import SnapshotRows
    from ignition.components.token_state import RequestState, StagingInputs

# Elements of one slab of the page a program copies.
BLOCK = 4096


@triton.jit
def _tail_page(page_table_ptr, stride_t, slot, consumed, PAGE_SIZE: tl.constexpr, NULL_PAGE):
    """The slot's physical page holding position ``consumed``, or the null page when
    ``consumed`` is a multiple of the page size (no tail; the table is not read, as
    at a full context its entry would lie past the slot's row)."""
    tail = consumed % PAGE_SIZE != 0
    at = page_table_ptr + slot * stride_t + consumed // PAGE_SIZE
    return tl.load(at, mask=tail, other=NULL_PAGE).to(tl.int64)


@triton.jit
def _copy_hidden(src_ptr, dst_ptr, hidden, BLOCK: tl.constexpr):
    for start in range(0, hidden, BLOCK):
        at = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + at, tl.load(src_ptr + at, mask=at < hidden), mask=at < hidden)


@triton.jit
def _snapshot_kernel(
    slot_ptr, row_ptr, status_ptr, consumed_ptr, page_table_ptr, stride_t, kv_ptr, pages,
    rows_kv_ptr, slabs, hidden_ptr, rows_hidden_ptr, hidden, rows_consumed_ptr, NULL_PAGE,
    PAGE_ELEMENTS: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    slab = tl.program_id(0)
    part = tl.program_id(1)
    slot = tl.load(slot_ptr)
    row = tl.load(row_ptr)
    consumed = tl.load(consumed_ptr + slot)
    page = _tail_page(page_table_ptr, stride_t, slot, consumed, PAGE_SIZE, NULL_PAGE)
    at = part * BLOCK + tl.arange(0, BLOCK)
    inside = at < PAGE_ELEMENTS
    values = tl.load(kv_ptr + (slab * pages + page) * PAGE_ELEMENTS + at, mask=inside)
    tl.store(rows_kv_ptr + (row * slabs + slab) * PAGE_ELEMENTS + at, values, mask=inside)
    if (slab == 0) & (part == 0):
        _copy_hidden(hidden_ptr + slot * hidden, rows_hidden_ptr + row * hidden, hidden, BLOCK)
        tl.store(rows_consumed_ptr + row, consumed)
        tl.store(status_ptr, tl.full([], 1, tl.int32))


@triton.jit
def _restore_kernel(
    slot_ptr, row_ptr, expect_ptr, status_ptr, consumed_ptr, page_table_ptr, stride_t, kv_ptr,
    pages, rows_kv_ptr, slabs, hidden_ptr, rows_hidden_ptr, hidden, rows_consumed_ptr,
    NULL_PAGE, PAGE_ELEMENTS: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    slab = tl.program_id(0)
    part = tl.program_id(1)
    slot = tl.load(slot_ptr)
    row = tl.load(row_ptr)
    consumed = tl.load(rows_consumed_ptr + row)
    ok = consumed == tl.load(expect_ptr)
    if ok:
        page = _tail_page(page_table_ptr, stride_t, slot, consumed, PAGE_SIZE, NULL_PAGE)
        at = part * BLOCK + tl.arange(0, BLOCK)
        inside = at < PAGE_ELEMENTS
        values = tl.load(rows_kv_ptr + (row * slabs + slab) * PAGE_ELEMENTS + at, mask=inside)
        tl.store(kv_ptr + (slab * pages + page) * PAGE_ELEMENTS + at, values, mask=inside)
    if (slab == 0) & (part == 0):
        if ok:
            _copy_hidden(rows_hidden_ptr + row * hidden, hidden_ptr + slot * hidden, hidden, BLOCK)
            tl.store(consumed_ptr + slot, consumed)
        tl.store(status_ptr, ok.to(tl.int32))


def launches(state: RequestState, cache: PagedKvCache, rows: SnapshotRows) -> bool:
    """Whether the launch serves these tensors: on a GPU, with pages to copy, all
    contiguous (every prepared model's are; anything else keeps the eager code)."""
    tensors = (cache.kv, rows.kv, state.hidden, rows.hidden, state.page_table)
    return cache.kv.is_cuda and cache.kv.numel() > 0 and all(t.is_contiguous() for t in tensors)


def _launch(
    kernel: JITFunction, state: RequestState, cache: PagedKvCache, rows: SnapshotRows,
    *head: torch.Tensor,
) -> None:  # fmt: skip
    """``kernel`` over one program per ``BLOCK`` elements of each slab's page."""
    kv = cache.kv
    slabs, pages = kv.shape[:PAGE_AXIS].numel(), kv.shape[PAGE_AXIS]
    page_size, elements = kv.shape[PAGE_AXIS + 1], kv[(0,) * (PAGE_AXIS + 1)].numel()
    kernel[(slabs, triton.cdiv(elements, BLOCK))](
        *head, state.consumed, state.page_table, state.page_table.stride(0), kv, pages,
        rows.kv, slabs, state.hidden, rows.hidden, state.hidden.shape[1], rows.consumed,
        NULL_PAGE, PAGE_ELEMENTS=elements, PAGE_SIZE=page_size, BLOCK=BLOCK, num_warps=4,
    )  # fmt: skip


def triton_snapshot(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """``state_transfer.snapshot``'s pages, hidden vector, count and status in one
    launch (not its continuation rows or further pages)."""
    _launch(
        _snapshot_kernel, state, cache, rows, staging.maint_slot, staging.maint_row,
        staging.maint_status,
    )  # fmt: skip


def triton_restore(
    state: RequestState, cache: PagedKvCache, rows: SnapshotRows, staging: StagingInputs
) -> None:
    """``state_transfer.restore``'s pages, hidden vector, count and status in one
    launch (not its continuation rows or further pages)."""
    _launch(
        _restore_kernel, state, cache, rows, staging.maint_slot, staging.maint_row,
        staging.maint_expect, staging.maint_status,
    )  # fmt: skip
