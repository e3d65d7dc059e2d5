"""Catalog validation, memory-plan arithmetic, and exact snapshot/restore transfers."""

from __future__ import annotations

import pytest
import torch

from ignition.components import state_transfer
from ignition.components.kv_cache import PagedKvCache
from ignition.components.linear import INVARIANT_ROWS
from ignition.components.state_transfer import SnapshotRows
from ignition.components.token_state import RequestState, StagingInputs
from ignition.preparation.catalog import Catalog, CatalogError, GraphKind
from ignition.preparation.memory import GIB, MIB, MemoryPlanError, plan_kv_pages
from ignition.preparation.prepared import PrepareOptions, compiles_sampling, snapshot_rows


def test_catalog_capacities() -> None:
    catalog = Catalog.plan(4, 4096, 8192, 64)
    assert catalog.decode == (1, 2, 4)
    assert catalog.prefill == (128, 256, 512, 1024, 2048, 4096)
    assert Catalog.plan(6, 192, 8192, 64).prefill == (128, 192)
    assert Catalog.plan(6, 192, 8192, 64).decode == (1, 2, 4, 6)
    assert Catalog.plan(1, 64, 64, 64).prefill == (64,)
    assert catalog.decode_capacity(3) == 4
    assert catalog.prefill_capacity(129) == 256
    assert catalog.prefill_capacity(5000) == 4096
    keys = catalog.keys()
    assert next(k.capacity for k in keys if k.kind is GraphKind.PREFILL) == 4096
    assert len(keys) == len(set(keys)) == 3 + 6 + 4


@pytest.mark.parametrize(
    ("concurrency", "chunk", "context"),
    [(0, 4096, 8192), (4, 100, 8192), (4, 32, 8192), (4, 8192 + 64, 8192), (4, 128, 1000)],
)
def test_catalog_rejects_unsupported_values(concurrency: int, chunk: int, context: int) -> None:
    with pytest.raises(CatalogError):
        Catalog.plan(concurrency, chunk, context, 64)


def test_concurrency_options_up_to_the_batch_invariant_rows() -> None:
    # 8, 16, 32 and 64 concurrent requests decode through the batch-invariant kernels;
    # more would run cuBLAS, whose kernel follows the row count, and are refused.
    for concurrency in (8, 16, 32, INVARIANT_ROWS):
        assert Catalog.plan(concurrency, 128, 1024, 64).decode[-1] == concurrency
    assert Catalog.plan(32, 128, 1024, 64).decode == (1, 2, 4, 8, 16, 32)
    with pytest.raises(CatalogError, match="independent of their batch"):
        Catalog.plan(INVARIANT_ROWS + 1, 128, 1024, 64)


def test_catalog_rejects_more_rows_than_the_largest_capacity() -> None:
    with pytest.raises(CatalogError):
        Catalog.plan(4, 128, 1024, 64).decode_capacity(5)


def test_snapshot_rows_default_to_32_per_concurrent_request() -> None:
    assert snapshot_rows(PrepareOptions()) == 128
    assert snapshot_rows(PrepareOptions(max_concurrency=8)) == 256
    assert snapshot_rows(PrepareOptions(snapshot_rows=2)) == 2
    assert snapshot_rows(PrepareOptions(snapshot_rows=0)) == 0
    # Rows of large continuation state are capped by the checkpoint-state budget.
    assert snapshot_rows(PrepareOptions(), row_bytes=9 << 20) == 128
    assert snapshot_rows(PrepareOptions(), row_bytes=113 << 20) == 36
    assert snapshot_rows(PrepareOptions(), row_bytes=8 << 30) == 1
    assert snapshot_rows(PrepareOptions(snapshot_rows=3), row_bytes=8 << 30) == 3


def test_the_sampler_compiles_with_the_forwards_unless_told() -> None:
    assert compiles_sampling(PrepareOptions())
    assert not compiles_sampling(PrepareOptions(compile=False))
    assert compiles_sampling(PrepareOptions(compile=False, compile_sampling=True))
    assert not compiles_sampling(PrepareOptions(compile_sampling=False))


def test_kv_page_plan_arithmetic() -> None:
    per_page = 3 * MIB
    pages = plan_kv_pages(10 * GIB, 2 * GIB, 1 * GIB, per_page, 10_000, 10)
    assert pages == (7 * GIB) // per_page
    assert plan_kv_pages(100 * GIB, 0, 0, per_page, 513, 129) == 513
    with pytest.raises(MemoryPlanError, match="at least 129"):
        plan_kv_pages(3 * GIB, 2 * GIB, 1 * GIB, per_page, 513, 129)


PAGE = 8


def _setup() -> tuple[RequestState, PagedKvCache, SnapshotRows, StagingInputs]:
    cpu = torch.device("cpu")
    state = RequestState.allocate(4, 32, 8, 6, torch.float32, cpu)
    cache = PagedKvCache.allocate(2, 12, PAGE, 2, 4, torch.float32, cpu)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=torch.Generator().manual_seed(0)))
    rows = SnapshotRows.allocate(3, cache, 6, cpu)
    staging = StagingInputs.allocate(4, 16, 64, 32, cpu)
    return state, cache, rows, staging


def test_snapshot_then_restore_is_bitwise_and_touches_only_the_private_tail() -> None:
    state, cache, rows, staging = _setup()
    state.page_table[1, :3] = torch.tensor([3, 7, 5], dtype=torch.int32)  # 19 tokens: tail page 5
    state.consumed[1] = 19
    state.hidden[1] = torch.randn(6)
    staging.maint_slot.fill_(1)
    staging.maint_row.fill_(2)
    state_transfer.snapshot(state, cache, rows, staging)
    assert torch.equal(rows.kv[2], cache.kv[:, :, 5])
    assert int(rows.consumed[2]) == 19
    # The branch shares full pages 3 and 7 and owns private tail page 9.
    state.page_table[2, :3] = torch.tensor([3, 7, 9], dtype=torch.int32)
    before = cache.kv.clone()
    staging.maint_slot.fill_(2)
    staging.maint_expect.fill_(19)
    state_transfer.restore(state, cache, rows, staging)
    assert int(staging.maint_status) == 1
    assert torch.equal(cache.kv[:, :, 9], before[:, :, 5])
    changed = (cache.kv != before).flatten(3).any(-1).any(0).any(0)
    assert changed.nonzero().flatten().tolist() in ([9], [])
    assert torch.equal(state.hidden[2], state.hidden[1])
    assert int(state.consumed[2]) == 19


def test_restore_with_a_wrong_expected_count_changes_nothing() -> None:
    state, cache, rows, staging = _setup()
    rows.consumed[0] = 19
    state.page_table[2, :3] = torch.tensor([3, 7, 9], dtype=torch.int32)
    before_kv, before_hidden = cache.kv.clone(), state.hidden.clone()
    staging.maint_slot.fill_(2)
    staging.maint_row.fill_(0)
    staging.maint_expect.fill_(18)
    state_transfer.restore(state, cache, rows, staging)
    assert int(staging.maint_status) == 0
    assert torch.equal(cache.kv[:, :, 1:], before_kv[:, :, 1:])
    assert torch.equal(state.hidden, before_hidden)
    assert int(state.consumed[2]) == 0


def test_aligned_endpoint_writes_no_page() -> None:
    state, cache, rows, staging = _setup()
    rows.consumed[1] = 16
    state.page_table[2, :3] = torch.tensor([3, 7, 9], dtype=torch.int32)
    before = cache.kv.clone()
    staging.maint_slot.fill_(2)
    staging.maint_row.fill_(1)
    staging.maint_expect.fill_(16)
    state_transfer.restore(state, cache, rows, staging)
    assert int(staging.maint_status) == 1
    assert torch.equal(cache.kv[:, :, 1:], before[:, :, 1:])  # page 0 is the null page
    assert int(state.consumed[2]) == 16


def test_the_cli_compiles_sampling_with_the_forwards_or_when_asked() -> None:
    from ignition.cli import _options, build_parser

    def options(*flags: str) -> PrepareOptions:
        return _options(build_parser().parse_args(["prepare", "m", *flags]), capture=True)

    assert compiles_sampling(options())
    assert not compiles_sampling(options("--no-compile"))
    both = options("--no-compile", "--compile-sampling")
    assert compiles_sampling(both) and not both.compile
    forwards_only = options("--no-compile-sampling")
    assert forwards_only.compile and not compiles_sampling(forwards_only)
