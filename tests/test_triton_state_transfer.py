"""A checkpoint's snapshot and restore in one launch each (``triton_state_transfer``)
write what the eager reference writes, bit for bit: under Triton's interpreter here,
on the GPU in the GPU run (through ``state_transfer``'s dispatch)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import fields

import pytest
import torch

from ignition.components import state_transfer
from ignition.components.kv_cache import PagedKvCache
from ignition.components.state_transfer import SnapshotRows
from ignition.components.token_state import RequestState, StagingInputs
from ignition.components.triton_state_transfer import BLOCK, triton_restore, triton_snapshot

Parts = tuple[RequestState, PagedKvCache, SnapshotRows, StagingInputs]
Transfer = Callable[[RequestState, PagedKvCache, SnapshotRows, StagingInputs], None]


def _parts(device: str, page: int, heads: int, dim: int, hidden: int) -> Parts:
    """Every tensor filled with distinct values (pages, rows, hidden vectors); slot 1
    holds 2.5 pages (tail page 5), slot 2 a branch owning private tail page 9."""
    gen = torch.Generator().manual_seed(page * heads + hidden)
    where = torch.device(device)
    state = RequestState.allocate(4, 32, 8, hidden, torch.float32, where)
    cache = PagedKvCache.allocate(3, 12, page, heads, dim, torch.float32, where)
    rows = SnapshotRows.allocate(3, cache, hidden, where)
    staging = StagingInputs.allocate(4, 16, 64, 32, where)
    for tensor in (cache.kv, rows.kv, state.hidden, rows.hidden):
        tensor.copy_(torch.randn(tensor.shape, generator=gen))
    state.page_table[1, :3] = torch.tensor([3, 7, 5], dtype=torch.int32)
    state.page_table[2, :3] = torch.tensor([3, 7, 9], dtype=torch.int32)
    state.consumed[1] = 2 * page + page // 2
    rows.consumed.copy_(torch.tensor([2 * page + page // 2, 2 * page, 11], dtype=torch.int32))
    staging.maint_status.fill_(7)
    return state, cache, rows, staging


def _all(parts: Parts) -> dict[str, torch.Tensor]:
    state, cache, rows, staging = parts
    named = {f"state.{f.name}": getattr(state, f.name) for f in fields(state)}
    named |= {f"rows.{name}": t for name, t in rows.tensors().items()}
    return named | {"kv": cache.kv, "status": staging.maint_status}


def _compare(parts: Parts, reference: Transfer, launched: Transfer) -> None:
    expected = copy.deepcopy(parts)
    reference(*expected)
    launched(*parts)
    for name, tensor in _all(expected).items():
        assert torch.equal(_all(parts)[name], tensor), name


# (slot, row, expected count) for a snapshot or a restore.
CASES = {
    "mid-page": (1, 0, None),
    "aligned": (1, 1, None),
    "wrong count": (2, 0, 18),
    "restores mid-page": (2, 0, None),
    "restores aligned": (2, 1, None),
}


def _stage(parts: Parts, case: str) -> None:
    state, _, rows, staging = parts
    slot, row, expect = CASES[case]
    staging.maint_slot.fill_(slot)
    staging.maint_row.fill_(row)
    staging.maint_expect.fill_(int(rows.consumed[row]) if expect is None else expect)
    if case == "aligned":
        state.consumed[slot] = int(rows.consumed[row])


def _check(device: str, case: str, page: int, heads: int, dim: int, hidden: int, fused) -> None:
    parts = _parts(device, page, heads, dim, hidden)
    _stage(parts, case)
    if case in ("mid-page", "aligned"):
        _compare(parts, state_transfer.snapshot_reference, fused[0])
    else:
        _compare(parts, state_transfer.restore_reference, fused[1])


GEOMETRIES = [(8, 2, 4, 6), (64, 4, 32, BLOCK + 100)]  # one part; two parts and hidden loops


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("page", "heads", "dim", "hidden"), GEOMETRIES)
def test_one_launch_writes_what_the_eager_transfer_writes_interpreted(
    case: str, page: int, heads: int, dim: int, hidden: int
) -> None:
    _check("cpu", case, page, heads, dim, hidden, (triton_snapshot, triton_restore))


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("page", "heads", "dim", "hidden"), GEOMETRIES)
def test_one_launch_writes_what_the_eager_transfer_writes_on_the_gpu(
    case: str, page: int, heads: int, dim: int, hidden: int
) -> None:
    dispatched = (state_transfer.snapshot, state_transfer.restore)
    _check("cuda", case, page, heads, dim, hidden, dispatched)
