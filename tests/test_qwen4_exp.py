"""The hybrid ``qwen4_exp`` recipe on the CPU, on issue 22's tiny config: each replaced
component against its Transformers module on identical operands, QSA's selection
against Transformers' past the budget, teacher-forced logits through the prepared
operations, and exact prefix continuation (split at an endpoint, snapshot,
restore, branches)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from checkpoints import TINY_HYBRID, WIDE_HYBRID, perturb_zero_initialized, write_tiny_hybrid
from dispatched import batch_shaped, step_ops, step_reductions
from fake_server import build_flare
from torch._dynamo.testing import CompileCounter
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

from ignition.components.continuation import ContinuationRows
from ignition.components.kv_cache import AttentionStep, PagedKvCache, slot_mapping
from ignition.components.rotary import RotaryTable
from ignition.components.selector import token_mask
from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import write_core_dir
from ignition.export.manifest import tiny_fixture
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode
from ignition.replay.teacher_forcing import compare_logits, teacher_forced_logits
from recipes import qwen4_exp
from recipes.qwen4_exp import (
    PAGE_SIZE,
    SELECTORS,
    HybridGeometry,
    PreparedExperts,
    PreparedGatedDeltaNet,
    PreparedGatedResidual,
    PreparedMoe,
    PreparedPle,
    PreparedSparseAttention,
    StepContext,
)

CONFIG = Qwen4ExpTextConfig(**TINY_HYBRID)
GEOMETRY = HybridGeometry.from_config(CONFIG)
EOS = 1
CPU = torch.device("cpu")
CAPACITY = 64  # the prefill chunk of the component tests
PAGES = 8  # per request, in the component tests


@pytest.fixture(scope="module")
def reference() -> Qwen4ExpForCausalLM:
    torch.manual_seed(0)
    model = Qwen4ExpForCausalLM(CONFIG).eval()
    perturb_zero_initialized(model)
    return model


class Harness:
    """One request in slot 1 (slot 0 is the null slot) over pages 1..PAGES: the step
    contexts a replaced module reads, for prefill chunks and for decode rows."""

    def __init__(self) -> None:
        fields = GEOMETRY.row_fields(torch.float32, EOS)
        self.rows = ContinuationRows(fields, 2, CPU)
        qsa = len(GEOMETRY.sparse_layers)
        self.cache = PagedKvCache.allocate(
            qsa, PAGES + 1, PAGE_SIZE, GEOMETRY.kv_heads, GEOMETRY.head_dim, torch.float32, CPU
        )
        self.cache.extra[SELECTORS] = torch.zeros(
            qsa, PAGES + 1, PAGE_SIZE // GEOMETRY.ratio, GEOMETRY.index_dim
        )
        rotary = qwen4_exp.canonical().Qwen4ExpTextRotaryEmbedding(CONFIG)
        self.rotary = RotaryTable(rotary, 512, torch.float32, CPU, position_rows=3)
        self.table = torch.arange(1, PAGES + 1, dtype=torch.int32)

    def prefill(self, start: int, n: int, layer: int) -> StepContext:
        index = torch.arange(CAPACITY)
        valid = index < n
        positions = start + index
        rows = slot_mapping(self.table.expand(CAPACITY, -1), positions, valid, PAGE_SIZE)
        step = AttentionStep(
            rows,
            self.table,
            None,
            torch.tensor([start], dtype=torch.int32),
            torch.tensor([n], dtype=torch.int32),
            torch.tensor([1]),
        )
        return self._context(step, positions, layer)

    def decode(self, position: int, layer: int) -> StepContext:
        """Two rows: the null slot's padding, then the request's token."""
        positions = torch.tensor([0, position])
        live = torch.tensor([False, True])
        tables = torch.stack([torch.zeros_like(self.table), self.table])
        rows = slot_mapping(tables, positions, live, PAGE_SIZE)
        seq_lens = torch.where(live, positions + 1, 0).to(torch.int32)
        step = AttentionStep(rows, tables, seq_lens, None, None, torch.tensor([0, 1]))
        return self._context(step, positions, layer)

    def _context(self, step: AttentionStep, positions: torch.Tensor, layer: int) -> StepContext:
        """The context decoder layer ``layer`` reads."""
        context = StepContext.of(step, positions, self.cache, self.rows, self.rotary)
        return context.at(GEOMETRY.layer_entries(layer))


def _pad(x: torch.Tensor) -> torch.Tensor:
    """``x [1, n, d]`` padded with noise to the chunk capacity (padding must not matter)."""
    pad = torch.randn(
        1, CAPACITY - x.shape[1], x.shape[2], generator=torch.Generator().manual_seed(9)
    )
    return torch.cat([x, pad], dim=1)


def _decode_rows(x: torch.Tensor) -> torch.Tensor:
    """One token ``x [1, 1, d]`` as the second of two decode rows (the first is noise
    in the null slot)."""
    return torch.cat([torch.randn_like(x), x], dim=1)


def _positions(n: int) -> torch.Tensor:
    return torch.arange(n).view(1, 1, -1).expand(3, 1, -1)


PROMPT, STEPS = 37, 8  # past the indexer's dense span (budget + ratio = 12)


def test_gated_deltanet_matches_transformers(reference: Qwen4ExpForCausalLM) -> None:
    canonical = reference.model.layers[1].linear_attn  # a GDN layer without PLE
    projections = [canonical.in_proj_qkv, canonical.in_proj_z, canonical.in_proj_b]
    merged = torch.cat([m.weight for m in [*projections, canonical.in_proj_a]])
    ours = PreparedGatedDeltaNet(canonical, merged)
    h = Harness()
    x = torch.randn(
        1, PROMPT + STEPS, CONFIG.hidden_size, generator=torch.Generator().manual_seed(1)
    )
    cache = DynamicCache(config=CONFIG)
    with torch.no_grad():
        want = [canonical(x[:, :PROMPT], cache_params=cache)]
        got = [ours(_pad(x[:, :PROMPT]), h.prefill(0, PROMPT, 1))[:, :PROMPT]]
        for t in range(PROMPT, PROMPT + STEPS):
            want.append(canonical(x[:, t : t + 1], cache_params=cache))
            got.append(ours(_decode_rows(x[:, t : t + 1]), h.decode(t, 1))[:, 1:])
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-6)
    layer = cache.layers[1]
    index = GEOMETRY.linear_layers.index(1)
    torch.testing.assert_close(h.rows["gdn_state"][1, index], layer.recurrent_states[0][0])
    kernel = CONFIG.linear_conv_kernel_dim
    # The history holds projections, computed here in other batch shapes than
    # Transformers' (a padded chunk, two decode rows): equal to rounding.
    torch.testing.assert_close(
        h.rows["gdn_conv"][1, index], layer.conv_states[0][0, :, -(kernel - 1) :]
    )
    # The null slot's row was read and written back unchanged.
    assert not h.rows["gdn_state"][0].any() and not h.rows["gdn_conv"][0].any()


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The block lists our selection returns, in call order."""
    lists: list[torch.Tensor] = []
    select = qwen4_exp.selector.select_blocks

    def record(*args: object, **kwargs: object) -> torch.Tensor:
        blocks = select(*args, **kwargs)  # type: ignore[arg-type]
        lists.append(blocks)
        return blocks

    monkeypatch.setattr(qwen4_exp.selector, "select_blocks", record)
    return lists


def test_sparse_attention_and_its_selection_match_transformers(
    reference: Qwen4ExpForCausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    masks = _recording(monkeypatch)
    canonical = reference.model.layers[3].self_attn
    projections = [canonical.q_proj, canonical.k_proj, canonical.v_proj]
    merged = torch.cat([m.weight for m in [*projections, canonical.indexer.index_qk_proj]])
    ours = PreparedSparseAttention(canonical, GEOMETRY, merged)
    h = Harness()
    x = torch.randn(
        1, PROMPT + STEPS, CONFIG.hidden_size, generator=torch.Generator().manual_seed(2)
    )
    rotary = reference.model.rotary_emb
    cache = DynamicCache(config=CONFIG)
    want_out: list[torch.Tensor] = []
    want_masks: list[torch.Tensor] = []
    hook = canonical.indexer.register_forward_hook(
        lambda _module, _inputs, output: want_masks.append(output[0, 0])
    )
    with torch.no_grad():
        # Transformers: the prompt with a causal mask, then one token per call.
        for lo, hi in [(0, PROMPT)] + [(t, t + 1) for t in range(PROMPT, PROMPT + STEPS)]:
            embeddings = rotary(x, _positions(hi))
            causal = torch.ones(hi - lo, hi, dtype=torch.bool).tril(lo).view(1, 1, hi - lo, hi)
            out, _ = canonical(x[:, lo:hi], embeddings, causal, past_key_values=cache)
            want_out.append(out)
    hook.remove()
    with torch.no_grad():
        got_out = [ours(_pad(x[:, :PROMPT]), None, None, h.prefill(0, PROMPT, 3))[0][:, :PROMPT]]
        for t in range(PROMPT, PROMPT + STEPS):
            step = h.decode(t, 3)
            got_out.append(ours(_decode_rows(x[:, t : t + 1]), None, None, step)[0][:, 1:])
    torch.testing.assert_close(torch.cat(got_out, 1), torch.cat(want_out, 1), rtol=1e-5, atol=1e-6)
    # The selection: the prompt's queries, then each decode query (row 1).
    ratio = CONFIG.indexer_compress_ratio
    got_masks = [token_mask(masks[0][:PROMPT], torch.arange(PROMPT), PROMPT, ratio)] + [
        token_mask(m[1:], torch.tensor([PROMPT + i]), PROMPT + i + 1, ratio)[0]
        for i, m in enumerate(masks[1:])
    ]
    for got, want in zip(got_masks, want_masks, strict=True):
        assert torch.equal(got, want.view_as(got))
    prompt = got_masks[0]
    counts = prompt.sum(-1)
    dense = torch.arange(1, PROMPT + 1)
    budget = CONFIG.indexer_budget
    # Dense while p + 1 < budget + ratio; sparse after.
    assert torch.equal(counts[: budget + ratio - 1], dense[: budget + ratio - 1])
    assert (counts[budget + ratio :] < dense[budget + ratio :]).all()
    # Some query that completes a block left that block, and so itself, out.
    boundary = torch.arange(ratio - 1, PROMPT, ratio)
    assert (~prompt[boundary, boundary]).any()


def test_ple_matches_transformers(reference: Qwen4ExpForCausalLM) -> None:
    canonical = reference.model.layers[0].ple
    ours = PreparedPle(canonical)
    h = Harness()
    streams = CONFIG.hc_count * CONFIG.hidden_size
    x = torch.randn(1, PROMPT + STEPS, streams, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(3, 512, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(4))
    ids[0, [5, 6, 20, PROMPT, PROMPT + 3]] = EOS  # segment resets, in the prompt and decode
    cache = DynamicCache(config=CONFIG)
    with torch.no_grad():
        want = [canonical(x[:, :PROMPT], ids[:, :PROMPT], cache)]
        padded_ids = torch.cat(
            [ids[:, :PROMPT], torch.zeros(1, CAPACITY - PROMPT, dtype=torch.long)], 1
        )
        got = [ours(_pad(x[:, :PROMPT]), padded_ids, h.prefill(0, PROMPT, 0))[:, :PROMPT]]
        for t in range(PROMPT, PROMPT + STEPS):
            want.append(canonical(x[:, t : t + 1], ids[:, t : t + 1], cache))
            pair = torch.tensor([[7, int(ids[0, t])]])
            got.append(ours(_decode_rows(x[:, t : t + 1]), pair, h.decode(t, 0))[:, 1:])
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-6)
    last = PROMPT + STEPS
    assert h.rows["ple_tokens"][1, 0].tolist() == ids[0, last - 2 : last].tolist()
    assert (h.rows["ple_tokens"][0] == EOS).all()  # the null row's admission value


def test_grouped_experts_match_the_eager_loop(reference: Qwen4ExpForCausalLM) -> None:
    block = reference.model.layers[0].mlp
    x = torch.randn(1, 50, CONFIG.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        block.experts.config._experts_implementation = "eager"
        want = block(x)
        block.experts.config._experts_implementation = "grouped_mm"
        got = block(x)
        block.experts.config._experts_implementation = "eager"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_prepared_moe_block_matches_the_eager_loop(reference: Qwen4ExpForCausalLM) -> None:
    # The shared expert's and the router's merged projections, and the routed experts:
    # a decode step's few tokens through flare::routed_experts, a prefill chunk's
    # through grouped_mm. Each equals the canonical block with its eager expert loop.
    block = reference.model.layers[2].mlp
    canonical = block.experts
    shared = block.shared_expert
    merged = torch.cat(
        [
            shared.gate_proj.weight,
            shared.up_proj.weight,
            block.shared_expert_gate.weight,
            block.gate.weight,
        ]
    )
    gen = torch.Generator().manual_seed(6)
    inputs = {n: torch.randn(1, n, CONFIG.hidden_size, generator=gen) for n in (1, 4, 40)}
    with torch.no_grad():
        canonical.config._experts_implementation = "eager"
        want = {n: block(x) for n, x in inputs.items()}
        canonical.config._experts_implementation = "grouped_mm"
        block.experts = PreparedExperts(canonical)
        try:
            ours = PreparedMoe(block, merged)
            got = {n: ours(x) for n, x in inputs.items()}
        finally:
            block.experts = canonical
            canonical.config._experts_implementation = "eager"
    for n in inputs:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6)


def test_the_prepared_hyperconnection_matches_transformers(
    reference: Qwen4ExpForCausalLM,
) -> None:
    # Its input-mix and injection projections as one GEMM: the same three outputs.
    for canonical in (
        reference.model.layers[1].attn_hyper_connection,
        reference.model.layers[3].mlp_hyper_connection,
    ):
        merged = torch.cat(
            [canonical.input_mix_weight_down.weight, canonical.block_inject_weight.weight]
        )
        streams = CONFIG.hc_count * CONFIG.hidden_size
        x = torch.randn(1, 5, streams, generator=torch.Generator().manual_seed(8))
        with torch.no_grad():
            want = canonical(x)
            got = PreparedGatedResidual(canonical, merged)(x)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _options(dtype: torch.dtype) -> PrepareOptions:
    return PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=128,
        context_limit=512,
        snapshot_rows=3,
        compile=False,
        capture=False,
        device="cpu",
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_hybrid(tmp_path_factory.mktemp("hybrid") / "tiny")


@pytest.fixture(scope="module")
def prepared(checkpoint: Path) -> PreparedModel:
    return prepare(checkpoint, _options(torch.float32))


def _tokens(n: int, seed: int) -> list[int]:
    ids = torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed))
    ids[n // 3] = EOS
    return ids.tolist()


@pytest.mark.parametrize(
    ("dtype", "relative_l2", "kl"),
    [
        # Float32: only reduction order differs (a few ulp through four layers); the
        # KL of two fp32 log-softmaxes is itself only good to a few fp32 ulp (2^-23).
        (torch.float32, 1e-5, 2**-20),
        # Bfloat16 against Transformers in bfloat16: both round every intermediate to
        # 8 bits of mantissa (unit roundoff 2^-8), in different places.
        (torch.bfloat16, 2**-4, 2**-8),
    ],
)
def test_teacher_forced_logits_match_transformers(
    checkpoint: Path, dtype: torch.dtype, relative_l2: float, kl: float
) -> None:
    prepared = prepare(checkpoint, _options(dtype))
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    tokens = _tokens(160, 6)
    with torch.no_grad():
        want = reference(torch.tensor([tokens])).logits[0].float()
    # Prefill in chunks of 48 (three chunks, the QSA layer sparse from position 12),
    # then one decode step per token.
    got = teacher_forced_logits(prepared, tokens, 140, chunk=48)
    comparison = compare_logits(got, want[139:])
    assert comparison.relative_l2 < relative_l2, comparison
    assert comparison.kl < kl, comparison
    assert comparison.top10_overlap > (0.99 if dtype == torch.float32 else 0.9), comparison


SAMPLING = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)
# Generation runs from 190 tokens across the page boundary at 192 (64-token pages)
# and two more selector groups (of four tokens); each step is a decode through
# Triton's interpreter on the CPU, so a longer run only costs time.
ENDPOINT, SUFFIX, GENERATE = 150, 40, 10


def _admit(prepared: PreparedModel, slot: int, tokens: list[int], consumed: int = 0) -> None:
    pack_admission(
        prepared.storage.staging, slot, tokens, 1000, SAMPLING, seed=5, consumed=consumed
    )
    prepared.execute(GraphKey(GraphKind.ADMIT, 1))


def _prefill(
    prepared: PreparedModel, slot: int, tokens: list[int], start: int, end: int, last: bool
) -> None:
    staging = prepared.storage.staging
    for lo in range(start, end, 128):
        hi = min(lo + 128, end)
        pack_chunk(staging, slot, tokens[lo:hi], last and hi == end)
        prepared.execute(GraphKey(GraphKind.PREFILL, prepared.catalog.prefill_capacity(hi - lo)))


def _generate(
    prepared: PreparedModel, slots: list[int], steps: int, capacity: int = 2
) -> dict[int, list[torch.Tensor]]:
    """Decode ``steps`` tokens for every slot in one batch of ``capacity`` rows; each
    slot's logits."""
    staging, state = prepared.storage.staging, prepared.storage.state
    out: dict[int, list[torch.Tensor]] = {slot: [] for slot in slots}
    for _ in range(steps):
        pack_decode(staging, slots, capacity)
        prepared.execute(GraphKey(GraphKind.DECODE, capacity))
        for row, slot in enumerate(slots):
            out[slot].append(staging.logits[row].clone())
        assert all(int(state.done[slot]) == 0 for slot in slots)
    return out


def _snapshot(prepared: PreparedModel, slot: int, row: int) -> None:
    staging = prepared.storage.staging
    staging.maint_slot.fill_(slot)
    staging.maint_row.fill_(row)
    prepared.execute(GraphKey(GraphKind.SNAPSHOT, 1))


def _restore(
    prepared: PreparedModel, slot: int, row: int, tokens: list[int], consumed: int
) -> None:
    staging = prepared.storage.staging
    _admit(prepared, slot, tokens, consumed=consumed)
    staging.maint_slot.fill_(slot)
    staging.maint_row.fill_(row)
    staging.maint_expect.fill_(consumed)
    prepared.execute(GraphKey(GraphKind.RESTORE, 1))
    assert int(staging.maint_status[0]) == 1


def _pages(prepared: PreparedModel, slot: int, pages: list[int]) -> None:
    table = prepared.storage.state.page_table
    table[slot].zero_()
    table[slot, : len(pages)] = torch.tensor(pages, dtype=torch.int32)


def _uninterrupted(
    prepared: PreparedModel, tokens: list[int]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The whole prompt in slot 1 in 128-token chunks, then generation."""
    prepared.reset()
    _pages(prepared, 1, [1, 2, 3, 4])
    _admit(prepared, 1, tokens)
    _prefill(prepared, 1, tokens, 0, len(tokens), last=True)
    prompt_logits = prepared.storage.staging.logits[0].clone()
    return prompt_logits, _generate(prepared, [1], GENERATE)[1]


def _split(prepared: PreparedModel, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The prompt stopped at the endpoint (a 22-token tail page, an open selector
    group), snapshotted, restored into slot 2 after it served another prompt, and
    continued there over shared full pages and a private tail page."""
    prepared.reset()
    _pages(prepared, 1, [1, 2, 3])
    _admit(prepared, 1, tokens[:ENDPOINT])
    _prefill(prepared, 1, tokens, 0, ENDPOINT, last=False)
    _snapshot(prepared, 1, 2)
    other = _tokens(ENDPOINT + 7, 8)
    _pages(prepared, 2, [5, 6, 7])
    _admit(prepared, 2, other)
    _prefill(prepared, 2, other, 0, len(other), last=True)
    _pages(prepared, 2, [1, 2, 8, 9])
    _restore(prepared, 2, 2, tokens, ENDPOINT)
    _prefill(prepared, 2, tokens, ENDPOINT, len(tokens), last=True)
    prompt_logits = prepared.storage.staging.logits[0].clone()
    return prompt_logits, _generate(prepared, [2], GENERATE)[2]


def test_split_snapshot_restore_continues_like_the_uninterrupted_run(
    prepared: PreparedModel,
) -> None:
    tokens = _tokens(ENDPOINT + SUFFIX, 7)
    whole_prompt, whole = _uninterrupted(prepared, tokens)
    split_prompt, split = _split(prepared, tokens)
    # The chunk partition differs ([0,128) [128,190) against [0,128) [128,150)
    # [150,190)), so the delta rule's chunks associate differently: in float32 the
    # difference is a few ulp of the logits (measured: below 1e-6).
    torch.testing.assert_close(split_prompt, whole_prompt, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.stack(split), torch.stack(whole), rtol=0, atol=1e-5)
    again_prompt, again = _split(prepared, tokens)
    assert torch.equal(again_prompt, split_prompt)
    assert all(torch.equal(a, b) for a, b in zip(again, split, strict=True))


def test_branches_from_one_snapshot_continue_independently(prepared: PreparedModel) -> None:
    trunk = _tokens(ENDPOINT, 10)
    suffixes = {2: _tokens(SUFFIX, 11), 3: _tokens(SUFFIX + 5, 12)}
    prepared.reset()
    _pages(prepared, 1, [1, 2, 3])
    _admit(prepared, 1, trunk)
    _prefill(prepared, 1, trunk, 0, ENDPOINT, last=False)
    _snapshot(prepared, 1, 0)
    frozen = {name: t[0].clone() for name, t in prepared.storage.snapshots.tensors().items()}
    private = {2: [8, 9], 3: [10, 11]}
    for slot, suffix in suffixes.items():
        _pages(prepared, slot, [1, 2, *private[slot]])
        _restore(prepared, slot, 0, trunk + suffix, ENDPOINT)
        _prefill(prepared, slot, trunk + suffix, ENDPOINT, ENDPOINT + len(suffix), last=True)
    together = _generate(prepared, [2, 3], GENERATE)
    # Each branch alone, from the same snapshot, over its own pages: the same
    # continuation. Not bitwise: the routed experts' grouped GEMMs see other row
    # counts when the other branch shares the batch (measured: at most 2 ulp).
    for slot, suffix in suffixes.items():
        _pages(prepared, 4, [1, 2, 12, 13])
        _restore(prepared, 4, 0, trunk + suffix, ENDPOINT)
        _prefill(prepared, 4, trunk + suffix, ENDPOINT, ENDPOINT + len(suffix), last=True)
        alone = _generate(prepared, [4], GENERATE)[4]
        torch.testing.assert_close(
            torch.stack(alone), torch.stack(together[slot]), rtol=0, atol=1e-6
        )
    assert not torch.allclose(torch.stack(together[2]), torch.stack(together[3]))
    # The snapshot is immutable: restores and both branches left its row as it was.
    for name, t in prepared.storage.snapshots.tensors().items():
        assert torch.equal(t[0], frozen[name]), name


def test_the_hybrid_core_declares_its_state_and_helios_accepts_it(
    prepared: PreparedModel, tmp_path: Path
) -> None:
    # The manifest layer (no GPU): the selector pages and continuation rows are
    # request state next to the request slots, their snapshot rows sit with the other
    # snapshot rows (so Helios's checkpoint row layout carries them, uninterpreted),
    # and the contract's bytes per page stay the K/V pages buffer's.
    core, initial = tiny_fixture(prepared)
    roles = {b.name: b.role for b in core.buffers}
    rows = {f.name for f in prepared.storage.rows.fields}
    for name in [f"rows.{n}" for n in rows] + ["paged.selectors"]:
        assert roles[name] == pb.BUFFER_ROLE_REQUEST_STATE, name
    snapshot = {n for n, r in roles.items() if r == pb.BUFFER_ROLE_SNAPSHOT_ROWS}
    assert snapshot == {"snapshot.kv", "snapshot.hidden", "snapshot.consumed"} | {
        f"snapshot.rows.{n}" for n in rows
    } | {"snapshot.paged.selectors"}
    kv = prepared.storage.cache.kv
    assert core.contract.bytes_per_page == kv[:, :, 0].numel() * kv.element_size()
    # Its state at a consumed count exists only at the live end.
    assert core.contract.continuation == pb.CONTINUATION_STATE_CONTINUATION_ROWS
    assert core.identity.recipe == "qwen4_exp"
    # Admission values that are not zero travel as initial contents.
    assert "rows.qsa_tags" in initial and "rows.ple_tokens" in initial
    spans = sorted((r.offset, r.offset + r.size) for r in core.window.regions)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    write_core_dir(tmp_path / "core", core, initial, {})
    flare = build_flare()
    shown = subprocess.run(
        [str(flare), "inspect", str(tmp_path / "core")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "recipe                qwen4_exp" in shown
    assert "snapshot_rows           10 x" in shown
    assert "continuation          CONTINUATION_STATE_CONTINUATION_ROWS" in shown


def _teacher_forced_split(
    prepared: PreparedModel, tokens: list[int], endpoint: int, decode_from: int
) -> torch.Tensor:
    """Logits of positions ``decode_from - 1 ..`` with the prompt stopped at
    ``endpoint``, snapshotted and restored into a slot that last held another
    request at the same position; then prefilled to ``decode_from`` and decoded
    one reference token at a time."""
    state, staging = prepared.storage.state, prepared.storage.staging
    prepared.reset()
    _pages(prepared, 1, [1, 2, 3, 4])
    _admit(prepared, 1, tokens)
    _prefill(prepared, 1, tokens, 0, endpoint, last=False)
    _snapshot(prepared, 1, 1)
    other = _tokens(endpoint, 13)
    _pages(prepared, 3, [5, 6, 7, 8])
    _admit(prepared, 3, other)
    _prefill(prepared, 3, other, 0, endpoint, last=False)
    shared = endpoint // PAGE_SIZE
    _pages(prepared, 3, [*range(1, shared + 1), *range(9, 13 - shared)])
    _restore(prepared, 3, 1, tokens, endpoint)
    _prefill(prepared, 3, tokens, endpoint, decode_from, last=True)
    rows = [staging.logits[0].clone()]
    pack_decode(staging, [3], 1)
    for position in range(decode_from, len(tokens)):
        state.pending[3] = tokens[position]
        prepared.execute(GraphKey(GraphKind.DECODE, 1))
        rows.append(staging.logits[0].clone())
    return torch.stack(rows)


@pytest.mark.parametrize("endpoint", [1, 3, 4, 5, 63, 64, 65, 127, 128, 129])
def test_an_endpoint_at_any_group_or_page_boundary_continues_exactly(
    prepared: PreparedModel, endpoint: int
) -> None:
    # Qualification: prefix lengths before, at and after QSA's 4-token groups and the
    # 64-token pages; the raw-key ring, selector pages, GDN and PLE histories carried
    # across the endpoint, the prefill/decode handoff and the capacity change; an EOS
    # right at the endpoint (PLE's segment reset across the cut).
    tokens = _tokens(164, 14)  # four decode steps (each through the interpreter)
    tokens[endpoint - 1] = EOS
    decode_from = 160
    whole = teacher_forced_logits(prepared, tokens, decode_from)
    split = _teacher_forced_split(prepared, tokens, endpoint, decode_from)
    # Only the chunk partition differs (a few fp32 ulp through the delta rule).
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-5)


def test_a_whole_prompt_hit_resamples_from_the_saved_hidden_vector(
    prepared: PreparedModel,
) -> None:
    state, staging = prepared.storage.state, prepared.storage.staging
    tokens = _tokens(ENDPOINT, 15)
    prepared.reset()
    _pages(prepared, 1, [1, 2, 3])
    _admit(prepared, 1, tokens)
    _prefill(prepared, 1, tokens, 0, ENDPOINT, last=True)
    prompt_logits, first = staging.logits[0].clone(), int(state.pending[1])
    _snapshot(prepared, 1, 0)
    _pages(prepared, 2, [1, 2, 4])
    _restore(prepared, 2, 0, tokens, ENDPOINT)
    staging.resume_slot.fill_(2)
    prepared.execute(GraphKey(GraphKind.RESUME, 1))
    assert torch.equal(staging.logits[0], prompt_logits)
    assert int(state.pending[2]) == first  # the same seed's first draw
    # Both continue alike from there, in one batch.
    generated = _generate(prepared, [1, 2], 10)
    assert all(torch.equal(a, b) for a, b in zip(generated[1], generated[2], strict=True))


def test_padded_and_idle_rows_mutate_nothing(prepared: PreparedModel) -> None:
    rows = prepared.storage.rows
    tokens = _tokens(70, 16)
    prepared.reset()
    _pages(prepared, 1, [1, 2])
    _admit(prepared, 1, tokens)
    _prefill(prepared, 1, tokens, 0, len(tokens), last=True)
    before = {name: t.clone() for name, t in rows.tensors.items()}
    selectors = prepared.storage.cache.extra[SELECTORS].clone()
    _generate(prepared, [1], 6, capacity=4)  # three padded rows in the null slot
    for name, t in rows.tensors.items():
        assert torch.equal(t[0], before[name][0]), name  # the null row
        assert torch.equal(t[2:], before[name][2:]), name  # idle slots
        assert not torch.equal(t[1], before[name][1]), name  # the request's own row
    # Selector pages change only where the request completed blocks (its page 2).
    changed = (prepared.storage.cache.extra[SELECTORS] != selectors).flatten(2).any(-1)
    assert changed.nonzero()[:, 1].unique().tolist() == [2]


def test_one_compiled_layer_serves_every_layer_of_its_kind(checkpoint: Path) -> None:
    # --compile-scope layer: each decoder layer reads its state through its own
    # context, so layers of one kind (GDN, GDN with PLE, QSA) share one compilation
    # per shape. An index attribute specialized every layer into its own: 48
    # compilations per shape at the H200 geometry instead of 3 (8 here, before).
    prepared = prepare(checkpoint, _options(torch.float32))
    tokens = _tokens(100, 3)
    eager = teacher_forced_logits(prepared, tokens, 90, chunk=48)
    counter = CompileCounter()
    prepared.model.compile_layers(backend=counter, fullgraph=True, dynamic=False)
    compiled = teacher_forced_logits(prepared, tokens, 90, chunk=48)
    kinds = {(t, i in GEOMETRY.ple_layers) for i, t in enumerate(GEOMETRY.layer_types)}
    assert GEOMETRY.layers > len(kinds) == 3
    assert counter.frame_count == 2 * len(kinds)  # one prefill and one decode shape
    # The regions run the traced graphs eagerly: each layer read its own state.
    assert torch.equal(compiled, eager)


def test_a_random_weight_geometry_names_its_tensors_as_a_saved_checkpoint(
    checkpoint: Path, tmp_path: Path
) -> None:
    # The H200 geometry is a random-weight directory (no 60 GB checkpoint to carry);
    # its source lists the tensors under the names saving gives them (per-expert
    # projections, PLE table shards), which is what the recipe's mapping places.
    from safetensors import safe_open

    from ignition.loading.random_weights import (
        GEOMETRIES,
        RandomWeightsCheckpoint,
        write_random_checkpoint,
    )

    geometry = write_random_checkpoint(tmp_path / "geometry", Qwen4ExpTextConfig(**TINY_HYBRID))
    listed = RandomWeightsCheckpoint(geometry).tensors()
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as saved:
        shapes = {n: tuple(saved.get_slice(n).get_shape()) for n in saved.keys()}
    constants = {n for n in shapes if n.rsplit(".", 1)[-1] in qwen4_exp.NGRAM_CONSTANTS}
    assert {n: info.shape for n, info in listed.items()} == {
        n: s for n, s in shapes.items() if n not in constants
    }
    assert prepare(geometry, _options(torch.float32)).recipe == "qwen4_exp"
    h200 = GEOMETRIES["qwen4-exp-h200"]()
    assert h200.layer_types.count("linear_attention") == 36 and h200.num_experts == 128
    qwen4_exp.validate_config(h200)


def _gpu_options(scope: str | None) -> PrepareOptions:
    """Captured on the GPU; compiled in ``scope`` ("forward" or "layer"), or eager."""
    return PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=128,
        context_limit=512,
        snapshot_rows=3,
        compile=scope is not None,
        compile_scope="layer" if scope == "layer" else "forward",
        capture=True,
        device="cuda",
        dtype=torch.bfloat16,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("scope", [None, "forward", "layer"])
def test_captured_graphs_match_transformers_on_the_gpu(checkpoint: Path, scope: str | None) -> None:
    # fla's GDN kernels, the QSA kernels and grouped experts, captured (eager, or
    # compiled as whole forwards or layer by layer): teacher-forced logits against
    # Transformers in bf16 on the same GPU.
    prepared = prepare(checkpoint, _gpu_options(scope))
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    reference = reference.cuda().eval()
    tokens = _tokens(160, 6)
    with torch.no_grad():
        want = reference(torch.tensor([tokens], device="cuda")).logits[0].float().cpu()
    got = teacher_forced_logits(prepared, tokens, 140, chunk=48)
    comparison = compare_logits(got, want[139:])
    assert comparison.relative_l2 < 2**-4, comparison
    assert comparison.kl < 2**-8, comparison
    assert comparison.top10_overlap > 0.9, comparison


@pytest.mark.gpu
def test_split_snapshot_restore_through_graphs(checkpoint: Path) -> None:
    prepared = prepare(checkpoint, _gpu_options("forward"))
    tokens = _tokens(ENDPOINT + SUFFIX, 7)
    whole_prompt, _ = _uninterrupted(prepared, tokens)
    split_prompt, split = _split(prepared, tokens)
    # bf16 GDN chunks associate differently across the partition: bounded, not equal.
    assert _relative(split_prompt, whole_prompt) < 2**-5
    again_prompt, again = _split(prepared, tokens)
    assert torch.equal(again_prompt, split_prompt)
    assert all(torch.equal(a, b) for a, b in zip(again, split, strict=True))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_the_custom_operators_pass_opcheck() -> None:
    # Their fake kernels (what compilation plans buffers from) agree with the real
    # ones in shape, dtype and strides, mutations are declared: a wrong fake made
    # Inductor reject the compiled prefill.
    from ignition.components import gated_delta, selector
    from ignition.components.continuation import read_slot_rows, write_slot_rows
    from ignition.components.kv_cache import write_layer_rows

    gen = torch.Generator().manual_seed(0)
    T, H, K = 70, 4, 16
    # q, k, v as the module's views: non-contiguous slices of one projection.
    mixed = torch.randn(1, T, 3 * H * K, generator=gen)
    q, k, v = (t.view(1, T, H, K) for t in mixed.split(H * K, dim=-1))
    g, beta = -torch.rand(1, T, H, generator=gen), torch.rand(1, T, H, generator=gen)
    state = torch.randn(1, H, K, K, generator=gen)
    torch.library.opcheck(gated_delta.chunk_rule, (q, k, v, g, beta, state))
    torch.library.opcheck(
        gated_delta.recurrent_rule,
        (
            q[:, :1].expand(3, -1, -1, -1),
            k[:, :1].expand(3, -1, -1, -1),
            v[:, :1].expand(3, -1, -1, -1),
            g[:, :1].expand(3, -1, -1),
            beta[:, :1].expand(3, -1, -1),
            state.expand(3, -1, -1, -1).contiguous(),
        ),
    )
    tables = torch.tensor([[1, 2]], dtype=torch.int32)
    selectors = torch.randn(3, PER_PAGE_TEST, 16, generator=gen)
    positions = torch.arange(40, 72)
    valid = torch.ones(32, dtype=torch.bool)
    iq = torch.randn(32, 2, 32, generator=gen)[..., :16]  # non-contiguous
    torch.library.opcheck(selector.block_scores, (iq, selectors, tables, 32, positions, valid, 4))
    blocks = torch.randint(-1, 10, (32, 3), generator=gen, dtype=torch.int32)
    kv = torch.randn(2, 3, 64, 2, 16, generator=gen)
    query = (
        torch.randn(32, 8, 16, generator=gen).transpose(0, 1).contiguous().transpose(0, 1)[:, :4]
    )
    torch.library.opcheck(
        selector.selected_attention, (query, kv, tables, 32, blocks, positions, 4, 0.25)
    )
    torch.library.opcheck(
        write_layer_rows, (torch.zeros(2, 3, 4, 5), 1, torch.tensor([0, 7]), torch.ones(2, 5))
    )
    torch.library.opcheck(
        write_slot_rows, (torch.zeros(3, 2, 4), 1, torch.tensor([0, 2]), torch.ones(2, 4))
    )
    rows = torch.randn(3, 2, 4, generator=gen)
    torch.library.opcheck(read_slot_rows, (rows, 1, torch.tensor([2, 0, 2])))


PER_PAGE_TEST = PAGE_SIZE // 4


def _decode_arrangements(prepared: PreparedModel) -> list[dict[str, torch.Tensor]]:
    """Two requests, restored from their snapshots before every arrangement (batch
    sizes 1-4 with padded capacity, changing slots, reordered), take one
    teacher-forced decode step; each arrangement's logits by request, the last
    arrangement repeating the third."""
    state, staging = prepared.storage.state, prepared.storage.staging
    prompts = {"a": _tokens(100, 20), "b": _tokens(90, 21)}
    nexts = {"a": 17, "b": 33}
    prepared.reset()
    for row, (name, pages) in enumerate([("a", [1, 2]), ("b", [3, 4])]):
        _pages(prepared, 1, pages)
        _admit(prepared, 1, prompts[name])
        _prefill(prepared, 1, prompts[name], 0, len(prompts[name]), last=True)
        _snapshot(prepared, 1, row)

    def step(arrangement: list[str | None], capacity: int) -> dict[str, torch.Tensor]:
        slots: list[int] = []
        for index, name in enumerate(arrangement):
            if name is None:
                slots.append(0)
                continue
            slot = index + 1
            shared = 1 if name == "a" else 3
            _pages(prepared, slot, [shared, 5 + index])
            _restore(prepared, slot, 0 if name == "a" else 1, prompts[name], len(prompts[name]))
            state.pending[slot] = nexts[name]
            slots.append(slot)
        pack_decode(staging, slots, capacity)
        prepared.execute(GraphKey(GraphKind.DECODE, capacity))
        return {
            name: staging.logits[row].clone()
            for row, name in enumerate(arrangement)
            if name is not None
        }

    arrangements: list[tuple[list[str | None], int]] = [
        (["a"], 1),
        (["a", "b"], 2),
        (["b", "a"], 2),
        (["a", None, "b"], 4),
        ([None, "b", None, "a"], 4),
        (["b", "a"], 2),
    ]
    return [step(arrangement, capacity) for arrangement, capacity in arrangements]


def test_decode_rows_are_independent_of_batch_size_order_and_slot(
    prepared: PreparedModel,
) -> None:
    # Qualification: each request's logits agree across arrangements (on the CPU
    # within 1e-6: the interpreted kernels' dot is the host's BLAS, which may round a
    # row by its place in the tile) and are bitwise equal when an arrangement repeats.
    results = _decode_arrangements(prepared)
    for name in ("a", "b"):
        seen = [r[name] for r in results if name in r]
        for other in seen[1:]:
            torch.testing.assert_close(other, seen[0], rtol=0, atol=1e-6)
    assert all(torch.equal(results[-1][n], results[2][n]) for n in ("a", "b"))


# cuBLAS and cuDNN choose their kernels, and so a row's reduction order, by the
# problem's shape: an op of these whose row count follows the batch breaks batch
# invariance (Flare's kernels and ops of a fixed row count do not).
@pytest.fixture(scope="module")
def prepared_for_32(checkpoint: Path) -> PreparedModel:
    return prepare(checkpoint, replace(_options(torch.float32), max_concurrency=32))


def _one_prompt_to_decode(prepared: PreparedModel, prompt: list[int], capacity: int) -> None:
    """``prompt`` prefilled into slot 1 (pages 1 and 2) and a decode step of
    ``capacity`` rows for it staged."""
    prepared.reset()
    _pages(prepared, 1, [1, 2])
    _admit(prepared, 1, prompt)
    _prefill(prepared, 1, prompt, 0, len(prompt), last=True)
    pack_decode(prepared.storage.staging, [1], capacity)


@pytest.mark.parametrize("capacity", [1, 2, 4, 32])
def test_a_decode_step_has_no_op_whose_kernel_follows_the_batch(
    prepared: PreparedModel, prepared_for_32: PreparedModel, capacity: int
) -> None:
    # The served corpus on the H200 matched the harness for none of its 50 prompts at
    # concurrency 1 (bench/results/issue22/2026-12-03-h200-serve): every projection ran
    # cuBLAS at the step's row count. Each must be Flare's (flare::rows_linear, or
    # flare::rows_split_linear for narrow weights), also past one 16-row tile (a
    # 32-request step ran cuBLAS and the grouped experts), and no convolution may run.
    model = prepared_for_32 if capacity > 4 else prepared
    _one_prompt_to_decode(model, _tokens(70, 30), capacity)
    ops = step_ops(model, GraphKey(GraphKind.DECODE, capacity))
    assert not batch_shaped(ops), batch_shaped(ops)
    assert not [name for name, _ in ops if "grouped_mm" in name]
    projections = sum(name.startswith("flare.rows_") for name, _ in ops)
    # Per layer at least the merged input, the output, the shared expert's and the
    # router's projections; the head.
    assert projections >= 4 * GEOMETRY.layers + 1, ops


# A sum or mean over at most this many elements is one thread's serial loop whatever
# the batch; wider ones must be flare::row_sum's.
SERIAL_REDUCTION = 16


@pytest.mark.parametrize("capacity", [1, 4])
def test_a_decode_step_has_no_wide_reduction_whose_order_follows_the_batch(
    prepared: PreparedModel, capacity: int
) -> None:
    # The served corpus on the H200 at --no-compile matched the harness for 0, 4 and 46
    # of its 50 prompts at concurrency 1, 2 and 4 (bench/results/issue22/): the
    # canonical RMSNorms' x.pow(2).mean(-1) over 2,560 per stream took another CUDA
    # reduction strategy at 4 rows than at 16 (bench/row_divergence_probe.py on the
    # H200). Every norm's mean square and PLE's gate sum go through flare::row_sum.
    _one_prompt_to_decode(prepared, _tokens(40, 31), capacity)
    reductions = step_reductions(prepared, GraphKey(GraphKind.DECODE, capacity))
    assert reductions, "the step's router renormalizes its top-k weights with a sum"
    wide = [(name, extent) for name, extent in reductions if extent > SERIAL_REDUCTION]
    assert not wide, wide


@pytest.mark.gpu
@pytest.mark.parametrize("scope", [None, "layer"])
def test_decode_rows_are_bitwise_independent_of_their_batch_on_the_gpu(
    tmp_path: Path, scope: str | None
) -> None:
    # A hybrid wide enough that cuBLAS would take other kernels at 1, 2 and 4 rows,
    # captured eagerly and compiled as the serving core is (Inductor's reductions too):
    # each request's logits are the same bits in every arrangement.
    wide = write_tiny_hybrid(tmp_path / "wide", **WIDE_HYBRID)
    prepared = prepare(wide, _gpu_options(scope))
    results = _decode_arrangements(prepared)
    for name in ("a", "b"):
        seen = [r[name] for r in results if name in r]
        assert all(torch.equal(other, seen[0]) for other in seen[1:]), name


def test_the_hybrid_qualification_replays_identically(checkpoint: Path) -> None:
    # The exporter's qualification workload (prefill, decode, snapshot, restore into
    # another slot, resume) over the hybrid: every graph used, a second replay
    # identical digest for digest; the continuation rows and selector pages, as large
    # as pages at real geometries, are digested with the pages (every full step and
    # at the last), not after every launch.
    from ignition.export.manifest import named_buffers
    from ignition.export.qualification import (
        QualificationRecorder,
        replay_qualification,
        run_workload,
    )

    # The workload's prefix prompt is one chunk of 2.5 pages.
    prepared = prepare(checkpoint, replace(_options(torch.float32), prefill_chunk_size=256))
    keys = prepared.catalog.keys()
    buffers = {name: tensor for name, _, tensor in named_buffers(prepared)}
    prepared.reset()
    recorder = QualificationRecorder(prepared, buffers, {k: i for i, k in enumerate(keys)})
    run_workload(prepared, recorder.execute)
    qualification = recorder.finish()
    assert {keys[step.graph] for step in qualification.steps} == set(keys)
    assert replay_qualification(prepared, qualification, buffers, keys) == []
    steps = qualification.steps
    with_rows = [any(d.buffer == "rows.gdn_state" for d in s.digests) for s in steps]
    with_pages = [any(d.buffer == "kv.pages" for d in s.digests) for s in steps]
    assert with_rows == with_pages and with_rows[-1] and not all(with_rows)


def test_registering_recipes_imports_no_canonical_hybrid_modeling() -> None:
    # Transformers' qwen4_exp modeling module imports fla-core where it is installed,
    # and fla initializes CUDA on import: an export, which must start recording kernel
    # images before CUDA starts, failed before its first step ("CUDA is already
    # initialized") because the CLI imported it through the recipe registry.
    code = (
        "import sys, ignition.cli, ignition.export.exporter, recipes.registry\n"
        "print(sorted(m for m in sys.modules if m.endswith('modeling_qwen4_exp') "
        "or m == 'fla' or m.startswith('fla.')))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert run.stdout.strip() == "[]", run.stdout
