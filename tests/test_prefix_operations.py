"""The dense prefix-checkpoint operations composed through the prepared catalog:
prefill a prompt in slot 1, snapshot it, restore it into slot 2 (which has just
served another prompt of the same length) over shared full pages and a private tail
page, resume-sample there, and continue decoding. The
restored request must see exactly the state of the original (bitwise: same graphs,
same inputs), on the CPU through the eager operations and on the GPU through the
captured graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import write_tiny

from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode

PROMPT = 150  # two full pages and a 22-token tail


def _prepare(path: Path, device: str) -> PreparedModel:
    options = PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=128,
        context_limit=512,
        snapshot_rows=2,
        compile=False,
        capture=device == "cuda",
        device=device,
        dtype=torch.float32 if device == "cpu" else torch.bfloat16,
    )
    return prepare(path, options)


SAMPLING = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)


def _admit(prepared: PreparedModel, slot: int, tokens: list[int], consumed: int = 0) -> None:
    staging = prepared.storage.staging
    pack_admission(staging, slot, tokens, 100, SAMPLING, seed=77, consumed=consumed)
    prepared.execute(GraphKey(GraphKind.ADMIT, 1))


def _decode(prepared: PreparedModel, slot: int) -> tuple[torch.Tensor, int]:
    staging = prepared.storage.staging
    pack_decode(staging, [slot], 1)
    prepared.execute(GraphKey(GraphKind.DECODE, 1))
    return staging.logits[0].clone(), int(prepared.storage.state.pending[slot])


def _prefill(prepared: PreparedModel, slot: int, *, seed: int, pages: list[int]) -> list[int]:
    """Admits a random PROMPT-token prompt into ``slot`` over ``pages`` and prefills it
    in 128-token chunks; returns the prompt."""
    state, staging = prepared.storage.state, prepared.storage.staging
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 512, (PROMPT,), generator=gen).tolist()
    state.page_table[slot, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    _admit(prepared, slot, tokens)
    for start in range(0, PROMPT, 128):
        n = min(128, PROMPT - start)
        pack_chunk(staging, slot, tokens[start : start + n], start + n == PROMPT)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
    return tokens


def check_restore_then_resume(prepared: PreparedModel) -> None:
    state, staging = prepared.storage.state, prepared.storage.staging
    prepared.reset()
    tokens = _prefill(prepared, 1, seed=3, pages=[4, 5, 6])
    prompt_logits = staging.logits[0].clone()
    first = int(state.pending[1])

    staging.maint_slot.fill_(1)
    staging.maint_row.fill_(1)
    prepared.execute(GraphKey(GraphKind.SNAPSHOT, 1))
    # Slot 2 first serves another prompt of the same length on its own pages, so the
    # restore lands in a slot whose state stands at the same position (stale pending
    # token, hidden vector, histogram and counters that must all be replaced).
    _prefill(prepared, 2, seed=4, pages=[10, 11, 12])
    assert int(state.consumed[2]) == PROMPT
    # The branch shares full pages 4 and 5 and owns private tail page 9.
    state.page_table[2, :3] = torch.tensor([4, 5, 9], dtype=torch.int32)
    _admit(prepared, 2, tokens, consumed=PROMPT)
    staging.maint_slot.fill_(2)
    staging.maint_expect.fill_(PROMPT)
    prepared.execute(GraphKey(GraphKind.RESTORE, 1))
    assert int(staging.maint_status[0]) == 1
    assert int(state.consumed[2]) == PROMPT
    kv = prepared.storage.cache.kv
    assert torch.equal(kv[:, :, 9, : PROMPT - 128], kv[:, :, 6, : PROMPT - 128])

    staging.resume_slot.fill_(2)
    prepared.execute(GraphKey(GraphKind.RESUME, 1))
    assert torch.equal(staging.logits[0], prompt_logits)  # same hidden vector, same head
    assert int(state.pending[2]) == first  # same seed, counter 0: the same first draw
    for _ in range(50):  # crosses into the fourth page of each request (position 192)
        logits_1, token_1 = _decode(prepared, 1)
        state.page_table[1, 3] = 7
        state.page_table[2, 3] = 8
        logits_2, token_2 = _decode(prepared, 2)
        assert torch.equal(logits_1, logits_2)
        assert token_1 == token_2


def test_restore_then_resume_on_cpu(tmp_path: Path) -> None:
    check_restore_then_resume(_prepare(write_tiny(tmp_path / "llama", "llama"), "cpu"))


@pytest.mark.gpu
def test_restore_then_resume_through_graphs(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "qwen3", "qwen3", hidden=256, head_dim=64)
    check_restore_then_resume(_prepare(path, "cuda"))


def test_an_interior_endpoint_checkpoints_through_the_existing_graphs(tmp_path: Path) -> None:
    # Issue 23's message checkpoints without extra chunks, on a core whose
    # continuation is K/V pages alone: a chunk runs past endpoint E; admitting the
    # slot at E, snapshotting and admitting it back at the chunk's end checkpoints E
    # with the graphs the contract has. The prompt goes on exactly as if nothing had
    # happened (the chunk was not the last: nothing was sampled yet), and a request
    # extending E from that checkpoint continues as one that stopped at E does.
    prepared = _prepare(write_tiny(tmp_path / "llama", "llama"), "cpu")
    state, staging = prepared.storage.state, prepared.storage.staging
    endpoint, chunk = 100, 128
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(3, 512, (PROMPT,), generator=gen).tolist()
    suffix = torch.randint(3, 512, (40,), generator=gen).tolist()

    def prompt_end(slot: int, folded: bool) -> tuple[torch.Tensor, int]:
        state.page_table[slot, :3] = torch.tensor([4, 5, 6], dtype=torch.int32)
        _admit(prepared, slot, tokens)
        pack_chunk(staging, slot, tokens[:chunk], False)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
        if folded:
            _admit(prepared, slot, tokens, consumed=endpoint)
            staging.maint_slot.fill_(slot)
            staging.maint_row.fill_(0)
            prepared.execute(GraphKey(GraphKind.SNAPSHOT, 1))
            _admit(prepared, slot, tokens, consumed=chunk)
        pack_chunk(staging, slot, tokens[chunk:], True)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
        return staging.logits[0].clone(), int(state.pending[slot])

    prepared.reset()
    plain = prompt_end(1, folded=False)
    prepared.reset()
    folded = prompt_end(1, folded=True)
    assert torch.equal(folded[0], plain[0]) and folded[1] == plain[1]
    snapshots = prepared.storage.snapshots
    assert int(snapshots.consumed[0]) == endpoint
    # The row holds E's tail page: positions 64 .. E of page 5, copied exactly.
    kv = prepared.storage.cache.kv
    assert torch.equal(snapshots.kv[0, :, :, : endpoint - 64], kv[:, :, 5, : endpoint - 64])

    extended = tokens[:endpoint] + suffix

    def extend_from_checkpoint() -> torch.Tensor:
        # Slot 2 shares full page 4, owns private tail page 9 and a page for what
        # the suffix adds past position 128.
        state.page_table[2, :3] = torch.tensor([4, 9, 13], dtype=torch.int32)
        _admit(prepared, 2, extended, consumed=endpoint)
        staging.maint_slot.fill_(2)
        staging.maint_row.fill_(0)
        staging.maint_expect.fill_(endpoint)
        prepared.execute(GraphKey(GraphKind.RESTORE, 1))
        assert int(staging.maint_status[0]) == 1
        pack_chunk(staging, 2, suffix, True)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
        return staging.logits[0].clone()

    def stop_at_the_endpoint() -> torch.Tensor:
        state.page_table[3, :3] = torch.tensor([10, 11, 12], dtype=torch.int32)
        _admit(prepared, 3, extended)
        pack_chunk(staging, 3, extended[:endpoint], False)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
        pack_chunk(staging, 3, suffix, True)
        prepared.execute(GraphKey(GraphKind.PREFILL, 128))
        return staging.logits[0].clone()

    from_checkpoint, stopped = extend_from_checkpoint(), stop_at_the_endpoint()
    # The checkpoint's K/V came from a 128-token chunk, the stop's from a 100-token
    # one: fp32 rounding apart, not bitwise.
    torch.testing.assert_close(from_checkpoint, stopped, rtol=0, atol=1e-5)
    assert from_checkpoint.argmax() == stopped.argmax()
