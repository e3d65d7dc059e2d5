"""The llama recipe on tiny random checkpoints: construction, mapping, and the prepared
operations against Transformers on the same weights (CPU, float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import write_tiny
from dispatched import batch_shaped, step_ops
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from ignition.components.kv_cache import PagedKvCache
from ignition.loading.mapping import check_coverage
from ignition.loading.safetensors_source import SafetensorsCheckpoint
from ignition.loading.source import CheckpointError
from ignition.parallel.shard import ONE_RANK, TensorParallel
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.compile_flags import DecodeFusion
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode
from ignition.replay.teacher_forcing import compare_logits, teacher_forced_logits
from recipes import llama

FAMILIES = ("llama", "qwen3")


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny(tmp_path_factory.mktemp(request.param), request.param)


def _prepare(
    path: Path, chunk: int = 128, decode_fusion: DecodeFusion = "none", concurrency: int = 4
) -> PreparedModel:
    options = PrepareOptions(
        max_concurrency=concurrency,
        prefill_chunk_size=chunk,
        context_limit=512,
        compile=False,
        decode_fusion=decode_fusion,
        capture=False,
        device="cpu",
        dtype=torch.float32,
    )
    return prepare(path, options)


def test_construction_on_meta_covers_every_tensor(checkpoint: Path) -> None:
    source = SafetensorsCheckpoint(checkpoint)
    meta = torch.device("meta")
    model = llama.LlamaModel(source.config(), PagedKvCache(torch.empty(0)), torch.bfloat16, meta)
    check_coverage(source, model.mapping)
    assert all(t.is_meta for t in model.mapping.placements.values())
    assert set(model.mapping.placements) == set(source.tensors())
    for layer in model.model.model.layers:  # canonical by default
        assert not isinstance(layer, llama.DecodeFusedLayer)
    for fusion in ("residuals", "norms"):
        fused = llama.LlamaModel(
            source.config(), PagedKvCache(torch.empty(0)), torch.bfloat16, meta,
            decode_fusion=fusion,
        )  # fmt: skip
        assert set(fused.mapping.placements) == set(model.mapping.placements)
        for layer in fused.model.model.layers:  # the fused path ahead of the canonical one
            mro = type(layer).__mro__
            assert mro[1] is llama.DecodeFusedLayer and mro[2].__name__.endswith("DecoderLayer")
            assert layer.fuse_norms == (fusion == "norms")


def test_unmapped_and_missing_tensors_fail_with_their_names(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "ckpt", "llama")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_extra"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match="rotary_extra"):
        _prepare(path)
    del tensors["model.layers.0.self_attn.rotary_extra"]
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        _prepare(path)


def test_tied_embeddings_share_the_vocabulary_weight(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "tied", "llama", tie=True)
    prepared = _prepare(path)
    model = prepared.model.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def _reference_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


# Same weights, float32 everywhere: the only difference is reduction order
# (paged attention in page blocks, packed projections), so relative L2 stays
# within a few float32 ulps of accumulation over at most a few hundred terms.
FP32_RELATIVE_L2 = 1e-4


@pytest.mark.parametrize("prompt", [63, 64, 65, 127, 128, 129, 200])
def test_teacher_forced_logits_match_transformers(checkpoint: Path, prompt: int) -> None:
    """Prefill chunks at every page and capacity boundary, then decode steps that cross
    the next page boundary, against a full Transformers forward."""
    prepared = _prepare(checkpoint)
    # Decode until two tokens are in the next page: each step runs through Triton's
    # interpreter, and the steps after those test nothing more.
    steps = -prompt % prepared.catalog.page_size + 2
    generator = torch.Generator().manual_seed(prompt)
    tokens = torch.randint(3, 512, (prompt + steps,), generator=generator).tolist()
    actual = teacher_forced_logits(prepared, tokens, prompt)
    reference = _reference_logits(checkpoint, tokens)[prompt - 1 :]
    result = compare_logits(actual, reference)
    assert result.relative_l2 < FP32_RELATIVE_L2, result
    assert result.top10_overlap == 1.0


@pytest.fixture(scope="module", params=FAMILIES)
def gained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose RMSNorms have gains other than one."""
    return write_tiny(tmp_path_factory.mktemp(request.param), request.param, norm_gains=True)


@pytest.mark.parametrize("fusion", ["residuals", "norms", "persistent"])
def test_fused_decode_layers_match_transformers(gained: Path, fusion: DecodeFusion) -> None:
    """Decode steps through the fused layers (residuals, then norms too, in the
    projections' kernels; then the persistent layer's operator, on the CPU the same
    operators), across a page boundary, against a full Transformers forward."""
    checkpoint = gained
    prompt = 60
    tokens = torch.randint(3, 512, (prompt + 40,), generator=torch.Generator().manual_seed(5))
    actual = teacher_forced_logits(
        _prepare(checkpoint, decode_fusion=fusion), tokens.tolist(), prompt
    )
    reference = _reference_logits(checkpoint, tokens.tolist())[prompt - 1 :]
    result = compare_logits(actual, reference)
    assert result.relative_l2 < FP32_RELATIVE_L2, result
    assert result.top10_overlap == 1.0


def test_the_norms_fusion_folds_each_gain_into_the_projection_reading_it(gained: Path) -> None:
    """Loaded for "norms", each layer's qkv and gate/up weights hold the checkpoint's
    rows times the gain of the norm before them, and the norms hold ones (prefill's
    canonical norm modules then multiply by one)."""
    tensors = load_file(gained / "model.safetensors")
    layers = _prepare(gained, decode_fusion="norms").model.model.model.layers
    for i, layer in enumerate(layers):
        prefix = f"model.layers.{i}."
        for norm, projections, packed in (
            ("input_layernorm", ("q_proj", "k_proj", "v_proj"), layer.self_attn.qkv),
            ("post_attention_layernorm", ("gate_proj", "up_proj"), layer.mlp.gate_up),
        ):
            gain = tensors[f"{prefix}{norm}.weight"]
            assert not torch.equal(gain, torch.ones_like(gain))
            parent = "self_attn" if norm == "input_layernorm" else "mlp"
            rows = torch.cat([tensors[f"{prefix}{parent}.{p}.weight"] for p in projections])
            assert torch.equal(packed, rows * gain)
            assert torch.equal(getattr(layer, norm).weight, torch.ones_like(gain))


def test_the_norms_fusion_is_refused_where_it_cannot_hold(gained: Path) -> None:
    config = SafetensorsCheckpoint(gained).config()
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="tensor-parallel"):
        llama.LlamaModel(
            config, PagedKvCache(torch.empty(0)), torch.float32, meta, decode_fusion="norms",
            parallel=TensorParallel(0, 2),
        )  # fmt: skip
    config.hidden_size = 72
    with pytest.raises(ValueError, match="groups of 16"):
        llama.LlamaModel(
            config, PagedKvCache(torch.empty(0)), torch.float32, meta, decode_fusion="norms"
        )


def test_auto_fusion_takes_the_norms_wherever_they_fuse() -> None:
    """ "auto": the norms for SmolLM2-135M and Qwen3-8B alike (on the H200 their
    steps 12% and 1.0-2.2% shorter; bench/results/issue23/2026-12-05e-h200-waves). A
    rank of a tensor-parallel group, or a hidden size off the squares' group, cannot
    take the norms."""
    from ignition.loading.random_weights import GEOMETRIES

    smol, qwen = GEOMETRIES["smollm2-135m"](), GEOMETRIES["qwen3-8b"]()
    assert llama.resolve_fusion("auto", smol) == "norms"
    assert llama.resolve_fusion("auto", qwen) == "norms"
    assert llama.resolve_fusion("auto", smol, TensorParallel(0, 2)) == "residuals"
    for fusion in ("none", "residuals", "norms"):  # a named fusion is kept
        assert llama.resolve_fusion(fusion, qwen) == fusion
    smol.hidden_size = 584  # 8 columns past a group of 16
    assert llama.resolve_fusion("auto", smol) == "residuals"


def test_an_auto_fused_model_records_the_fusion_it_runs(checkpoint: Path) -> None:
    source = SafetensorsCheckpoint(checkpoint)
    meta = torch.device("meta")
    for parallel, fusion in ((TensorParallel(0, 2), "residuals"), (ONE_RANK, "norms")):
        model = llama.LlamaModel(
            source.config(), PagedKvCache(torch.empty(0)), torch.bfloat16, meta,
            decode_fusion="auto", parallel=parallel,
        )  # fmt: skip
        assert model.decode_fusion == fusion
        assert all(layer.fuse_norms == (fusion == "norms") for layer in model.model.model.layers)
    with pytest.raises(ValueError, match="resolve"):
        llama.fuse_decode(model.model.model.layers[0], "auto")


def _admit_one(prepared: PreparedModel) -> object:
    """Admits request slot 1 with a 20-token prompt (two pages) and packs its one
    prefill chunk; returns the staging the next graphs read."""
    staging = prepared.storage.staging
    prepared.storage.state.page_table[1, :2] = torch.tensor([1, 2], dtype=torch.int32)
    prompt = torch.randint(3, 512, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    pack_admission(staging, 1, prompt, 100, SamplingParams(temperature=1.0), seed=1)
    prepared.execute(GraphKey(GraphKind.ADMIT, 1))
    pack_chunk(staging, 1, prompt, True)
    return staging


@pytest.mark.parametrize("fusion", ["none", "norms"])
def test_a_decode_step_past_one_row_tile_has_no_op_whose_kernel_follows_the_batch(
    checkpoint: Path, fusion: DecodeFusion
) -> None:
    """A core prepared for 32 requests decodes 32 rows through Flare's batch-invariant
    projections, as it does 16: at 32 they ran cuBLAS, whose kernel follows the row
    count, so a request's tokens depended on how many others shared its step."""
    prepared = _prepare(checkpoint, decode_fusion=fusion, concurrency=32)
    assert 32 in prepared.catalog.decode
    staging = _admit_one(prepared)
    prepared.execute(GraphKey(GraphKind.PREFILL, 128))
    pack_decode(staging, [1], 32)
    ops = step_ops(prepared, GraphKey(GraphKind.DECODE, 32))
    assert not batch_shaped(ops), batch_shaped(ops)
    layers = len(prepared.model.model.model.layers)
    projections = sum(name.startswith("flare.rows_") for name, _ in ops)
    assert projections >= 3 * layers + 1, ops  # qkv, o, gate/up (+ down); the head


def test_decode_fuses_the_rotary_write_into_attention_only_without_qk_norms(
    checkpoint: Path,
) -> None:
    """A decode step writes its rows' K/V inside attention's split kernel
    (``flare::rope_decode_attention``) where the layers have no q/k norms (Llama's);
    with them (Qwen3's) it launches ``flare::rope_write_kv`` then the split: the
    norms' statistic summed in every split program made the 8B's split slower than
    both launches on the GPU. A prefill chunk's layer launches one
    ``flare::rope_prefill_attention``, the write and the attention (on CUDA the one
    Triton kernel after the write, or for long chunks the flash kernel within the
    chunk and the Triton kernel over its history)."""
    prepared = _prepare(checkpoint)
    layers = prepared.model.model.model.layers
    norms = layers[0].self_attn.q_norm is not None
    staging = _admit_one(prepared)
    chunk = [name for name, _ in step_ops(prepared, GraphKey(GraphKind.PREFILL, 128))]
    assert chunk.count("flare.rope_prefill_attention") == len(layers), chunk
    assert chunk.count("flare.rope_write_kv") == 0, chunk
    pack_decode(staging, [1], 1)
    names = [name for name, _ in step_ops(prepared, GraphKey(GraphKind.DECODE, 1))]
    fused, written = names.count("flare.rope_decode_attention"), names.count("flare.rope_write_kv")
    assert (fused, written) == ((0, len(layers)) if norms else (len(layers), 0)), names
    assert names.count("flare.decode_attention") == (len(layers) if norms else 0), names


def test_a_persistent_decode_step_is_one_operator(checkpoint: Path) -> None:
    """Under "persistent", a decode step's layers are one ``flare::persistent_step``
    (over address tables of their weights, exported with them), a prefill chunk's
    the canonical layers."""
    prepared = _prepare(checkpoint, decode_fusion="persistent")
    model = prepared.model
    layers = model.model.model.layers
    assert all(layer.fuse_norms for layer in layers)
    tables = {
        "qkv": [layer.self_attn.qkv for layer in layers],
        "o": [layer.self_attn.o_proj.weight for layer in layers],
        "gate_up": [layer.mlp.gate_up for layer in layers],
        "down": [layer.mlp.down_proj.weight for layer in layers],
    }
    if layers[0].self_attn.q_norm is not None:
        tables["q_norm"] = [layer.self_attn.q_norm.weight for layer in layers]
        tables["k_norm"] = [layer.self_attn.k_norm.weight for layer in layers]
    for name, weights in tables.items():
        addresses = model.weights[f"persistent.{name}_addresses"].tolist()
        assert addresses == [w.data_ptr() for w in weights], name
    assert len(model.persistent_tables) == len(tables)
    staging = _admit_one(prepared)
    chunk_ops = [name for name, _ in step_ops(prepared, GraphKey(GraphKind.PREFILL, 128))]
    assert "flare.persistent_step" not in chunk_ops
    pack_decode(staging, [1], 1)
    names = [name for name, _ in step_ops(prepared, GraphKey(GraphKind.DECODE, 1))]
    assert names.count("flare.persistent_step") == 1, names
    # No layer's operators beside it: the vocabulary head's projection alone.
    attention = ("flare.rope_decode", "flare.rope_write_kv", "flare.decode_attention")
    assert not any(name.startswith(attention) for name in names), names
    assert sum(name.startswith("flare.rows_") for name in names) == 1, names


def test_the_persistent_fusion_is_refused_where_it_cannot_hold(gained: Path) -> None:
    config = SafetensorsCheckpoint(gained).config()
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="tensor-parallel"):
        llama.LlamaModel(
            config, PagedKvCache(torch.empty(0)), torch.float32, meta,
            decode_fusion="persistent", parallel=TensorParallel(0, 2),
        )  # fmt: skip
    config.attention_bias = True
    with pytest.raises(ValueError, match="biases"):
        llama.LlamaModel(
            config, PagedKvCache(torch.empty(0)), torch.float32, meta, decode_fusion="persistent"
        )


def test_chunked_prefill_matches_single_chunk(checkpoint: Path) -> None:
    """A 300-token prompt in 64-token chunks gives the logits of one 300-token pass."""
    tokens = torch.randint(3, 512, (301,), generator=torch.Generator().manual_seed(7)).tolist()
    whole = teacher_forced_logits(_prepare(checkpoint, chunk=512), tokens, 300)
    chunked = teacher_forced_logits(_prepare(checkpoint, chunk=64), tokens, 300, chunk=64)
    assert compare_logits(chunked, whole).relative_l2 < FP32_RELATIVE_L2


def test_attention_with_one_of_the_qk_norms_or_unequal_epsilons_is_refused() -> None:
    """The QKV-finishing kernel normalizes q and k together, with one epsilon."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = Qwen3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, num_hidden_layers=1, vocab_size=32,
    )  # fmt: skip
    geometry = llama.Geometry.from_config(config)
    qkv = torch.empty(128, 64)
    canonical = Qwen3Attention(config, layer_idx=0)
    assert llama.PagedAttention(canonical, qkv, None, geometry).norm_eps == config.rms_norm_eps
    canonical.k_norm.variance_epsilon = 1e-3
    with pytest.raises(CheckpointError, match="different epsilons"):
        llama.PagedAttention(canonical, qkv, None, geometry)
    del canonical.k_norm
    with pytest.raises(CheckpointError, match="not both"):
        llama.PagedAttention(canonical, qkv, None, geometry)
