"""Recording and replaying a qualification sequence (the Python side of
``flare replay --check``), on the CPU with a tiny random Llama."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpoints import CPU_OPTIONS, write_tiny

from ignition.export import flare_core_pb2 as pb
from ignition.export.manifest import contract_message, named_buffers
from ignition.export.qualification import (
    QualificationRecorder,
    changed_span,
    digest,
    digests,
    full_digest_period,
    replay_qualification,
    run_workload,
)
from ignition.preparation.catalog import GraphKind
from ignition.preparation.prepared import PreparedModel, prepare

OPTIONS = replace(CPU_OPTIONS, max_concurrency=4, prefill_chunk_size=256, context_limit=512)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_tiny(tmp_path_factory.mktemp("llama"), "llama"))


@pytest.fixture(scope="module")
def prepared(tiny: Path) -> PreparedModel:
    return prepare(tiny, OPTIONS)


Recorded = tuple[pb.Qualification, dict[str, torch.Tensor], list]


def _record(prepared: PreparedModel) -> Recorded:
    keys = prepared.catalog.keys()
    buffers = {name: tensor for name, _, tensor in named_buffers(prepared)}
    prepared.reset()
    recorder = QualificationRecorder(prepared, buffers, {k: i for i, k in enumerate(keys)})
    run_workload(prepared, recorder.execute)
    return recorder.finish(), buffers, keys


@pytest.fixture(scope="module")
def recorded(prepared: PreparedModel) -> Recorded:
    """The workload recorded once on ``prepared`` (each recording runs it through
    Triton's interpreter); a test that edits the record edits a copy."""
    return _record(prepared)


def test_changed_span() -> None:
    a = np.zeros(10, dtype=np.uint8)
    b = a.copy()
    assert changed_span(a, b) is None
    b[3] = 1
    b[7] = 2
    assert changed_span(a, b) == (3, 8)


def test_recorded_sequence_covers_every_graph_and_replays_identically(
    prepared: PreparedModel, recorded: Recorded
) -> None:
    qualification, buffers, keys = recorded
    used = {keys[step.graph] for step in qualification.steps}
    assert used == set(keys), set(keys) - used
    kinds = [keys[step.graph].kind for step in qualification.steps]
    assert kinds.count(GraphKind.DECODE) > 10
    # The host wrote inputs before most launches, and only state and staging.
    written = {w.buffer for step in qualification.steps for w in step.writes}
    assert "staging.decode_slots" in written and "state.page_table" in written
    assert all(name.startswith(("state.", "staging.")) for name in written)
    last = {d.buffer for d in qualification.steps[-1].digests}
    assert last == set(buffers)
    assert replay_qualification(prepared, qualification, buffers, keys) == []


def test_a_changed_input_is_caught(prepared: PreparedModel, recorded: Recorded) -> None:
    qualification, buffers, keys = pb.Qualification(), recorded[1], recorded[2]
    qualification.CopyFrom(recorded[0])
    step = next(
        s for s in qualification.steps if any(w.buffer == "staging.chunk_tokens" for w in s.writes)
    )
    write = next(w for w in step.writes if w.buffer == "staging.chunk_tokens")
    data = bytearray(write.data)
    data[0] ^= 1  # another token id
    write.data = bytes(data)
    mismatches = replay_qualification(prepared, qualification, buffers, keys)
    assert mismatches and "state.hidden" in " ".join(mismatches)


def test_a_streamed_digest_is_the_digest_of_the_bytes() -> None:
    tensor = torch.arange(1000, dtype=torch.int32)
    whole = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
    assert digest(tensor, chunk=96) == whole  # chunks that split elements
    assert digest(tensor) == whole
    others = [torch.arange(n, dtype=torch.int64) for n in (0, 1, 5000)]
    assert digests([tensor, *others]) == [whole, *(digest(t) for t in others)]
    with pytest.raises(ValueError, match="contiguous"):
        digest(tensor.view(10, 100).t())


def test_the_full_digest_period_grows_with_the_written_pools() -> None:
    def sized(kv_bytes: int) -> dict[str, torch.Tensor]:
        return {
            "weight.w": torch.empty(1, dtype=torch.uint8).expand(3 << 32),  # never counted
            "kv.pages": torch.empty(1, dtype=torch.uint8).expand(kv_bytes),
            "snapshot.kv": torch.empty(1, dtype=torch.uint8).expand(1 << 20),
            "state.counter": torch.empty(1, dtype=torch.uint8).expand(1 << 40),
        }

    assert full_digest_period(sized(700 << 20)) == 8  # SmolLM2's pool: as before
    assert full_digest_period(sized((2 << 30) - (1 << 20))) == 8
    assert full_digest_period(sized(2 << 30)) == 16
    assert full_digest_period(sized(10368 << 20)) == 48  # the 8B's 1,152 pages


def test_a_core_without_token_masks_binds_none_and_qualifies_without_them(
    tiny: Path, prepared: PreparedModel, recorded: Recorded
) -> None:
    mask_semantics = {pb.SEMANTIC_SAMPLE_MASK, pb.SEMANTIC_SAMPLE_MASKED}
    bound = {b.semantic for b in contract_message(prepared).bindings}
    assert mask_semantics <= bound
    plain = prepare(tiny, replace(OPTIONS, token_masks=False))
    assert not plain.token_masks
    assert not mask_semantics & {b.semantic for b in contract_message(plain).bindings}
    # The same workload, less the four masked decodes, replays identically.
    masked_steps = len(recorded[0].steps)
    qualification, buffers, keys = _record(plain)
    assert len(qualification.steps) == masked_steps - 4
    assert replay_qualification(plain, qualification, buffers, keys) == []


def test_the_workload_fits_a_prefill_chunk_smaller_than_its_prefix_prompt(tiny: Path) -> None:
    # The prefix operations' prompt is 2.5 pages (160 tokens at 64-token pages); with
    # 128-token chunks the workload packed it into one chunk and failed before it
    # recorded anything (an export of such a preparation stopped there).
    small = prepare(tiny, replace(OPTIONS, prefill_chunk_size=128, max_concurrency=2))
    assert 2 * small.catalog.page_size + small.catalog.page_size // 2 > 128
    qualification, buffers, keys = _record(small)
    assert {keys[step.graph] for step in qualification.steps} == set(keys)
    assert replay_qualification(small, qualification, buffers, keys) == []


def test_the_workload_runs_every_decode_capacity_of_a_wide_preparation(tiny: Path) -> None:
    # At --max-concurrency 32 the serving-like requests (one per prefill capacity and
    # four more) never decoded more than ten rows together, and the export refused
    # the core: "the qualification workload never ran decode[32], decode[16]" (an
    # H100, 2026-12-06r). Here 16 rows against seven requests.
    wide = prepare(tiny, replace(OPTIONS, max_concurrency=16))
    assert 16 > len(wide.catalog.prefill) + 4
    qualification, buffers, keys = _record(wide)
    used = {keys[step.graph] for step in qualification.steps}
    assert used == set(keys), set(keys) - used
    assert replay_qualification(wide, qualification, buffers, keys) == []
