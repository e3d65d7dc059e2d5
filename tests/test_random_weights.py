"""A random-weights geometry directory prepares like a checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from bench.suite.report import GEOMETRIES as ROOFLINE_GEOMETRIES
from bench.suite.report import Geometry
from ignition.components.kv_cache import PagedKvCache
from ignition.loading.default_model import default_model_path
from ignition.loading.mapping import check_coverage
from ignition.loading.open import open_checkpoint
from ignition.loading.random_weights import (
    GEOMETRIES,
    MARKER,
    RandomWeightsCheckpoint,
    load_tokenizer,
    write_random_checkpoint,
)
from ignition.loading.source import CheckpointError
from ignition.loading.synthetic_tokenizers import char_level_tokenizer
from ignition.preparation.prepared import PrepareOptions, prepare
from ignition.replay.harness import Harness, Request, SamplingParams
from recipes import llama


def _tiny(path: Path) -> Path:
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    return write_random_checkpoint(path, config, seed=3)


def test_tensors_are_deterministic_and_complete(tmp_path: Path) -> None:
    source = open_checkpoint(_tiny(tmp_path / "geo"))
    assert isinstance(source, RandomWeightsCheckpoint)
    names = source.tensors()
    assert "lm_head.weight" not in names  # tied
    a = source.load("model.layers.0.self_attn.q_proj.weight")
    b = RandomWeightsCheckpoint(tmp_path / "geo").load("model.layers.0.self_attn.q_proj.weight")
    assert torch.equal(a, b) and a.dtype == torch.bfloat16 and a.shape == (64, 64)
    assert 0.015 < float(a.float().std()) < 0.025
    assert torch.equal(source.load("model.norm.weight"), torch.ones(64, dtype=torch.bfloat16))
    assert not torch.equal(a, source.load("model.layers.1.self_attn.q_proj.weight"))
    with pytest.raises(CheckpointError, match="no tensor"):
        source.load("nope")
    model = llama.LlamaModel(source.config(), _cache(), torch.bfloat16, torch.device("meta"))
    check_coverage(source, model.mapping)


def _cache() -> PagedKvCache:
    return PagedKvCache(torch.empty(0))


def test_named_geometries_match_their_models() -> None:
    llama_8b = GEOMETRIES["llama-8b"]()
    assert (llama_8b.hidden_size, llama_8b.num_hidden_layers, llama_8b.vocab_size) == (
        4096,
        32,
        128256,
    )
    assert GEOMETRIES["qwen3-8b"]().head_dim == 128
    # The roofline's geometries (bench/suite/report.py) describe the same models, so
    # a step timed on a geometry directory is held against its own bytes.
    for name in ("smollm2-135m", "qwen3-8b"):
        config = GEOMETRIES[name]().to_dict()
        want = ROOFLINE_GEOMETRIES[name]
        assert Geometry.from_config(config, want.dtype_bytes) == replace(want, qk_norm=False)
    with pytest.raises(CheckpointError, match="unknown geometry"):
        write_random_checkpoint(Path("unused"), "llama-900b")


def test_prepares_and_generates(tmp_path: Path) -> None:
    options = PrepareOptions(
        max_concurrency=2,
        prefill_chunk_size=128,
        context_limit=256,
        compile=False,
        capture=False,
        device="cpu",
        dtype=torch.float32,
    )
    prepared = prepare(_tiny(tmp_path / "geo"), options)
    (result,) = Harness(prepared).run(
        [Request(0, list(range(3, 40)), 5, SamplingParams(temperature=1.0), seed=1)]
    )
    assert len(result.tokens) == 5 or result.finish_reason == "stop"


def test_materialized_weights_are_the_generated_ones(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from ignition.loading.random_weights import materialize

    geometry = _tiny(tmp_path / "geo")
    # Shards of ~20 KB: several files and an index, as an 8B checkpoint has.
    checkpoint = materialize(geometry, tmp_path / "ckpt", shard_bytes=20_000)
    assert len(list(checkpoint.glob("model-*-of-*.safetensors"))) > 2
    generated = RandomWeightsCheckpoint(geometry)
    loaded = open_checkpoint(checkpoint)
    assert not isinstance(loaded, RandomWeightsCheckpoint)
    assert set(loaded.tensors()) == set(generated.tensors())
    for name in generated.tensors():
        assert torch.equal(loaded.load(name), generated.load(name)), name
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    q = model.model.layers[1].self_attn.q_proj.weight
    assert torch.equal(q, generated.load("model.layers.1.self_attn.q_proj.weight"))


def test_the_config_names_its_transformers_class(tmp_path: Path) -> None:
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for name in GEOMETRIES:
        config = AutoConfig.from_pretrained(write_random_checkpoint(tmp_path / name, name))
        # What `transformers serve` instantiates (it failed on the 8B without it): the
        # causal LM class of the model type (Qwen4ExpForCausalLM for qwen4_exp_text).
        (architecture,) = config.architectures
        assert architecture == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]
        assert hasattr(transformers, architecture)


def test_the_tokenizer_keeps_prompts_apart_and_decodes_every_id(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from bench.suite.workloads import LONG_HEAD, long_requests

    geometry = _tiny(tmp_path / "geo")
    tokenizer = AutoTokenizer.from_pretrained(geometry)
    assert len(tokenizer) == 300  # the model's vocabulary

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    # The suite's cold prompts must reach the server as different tokens right after
    # their common head, or a prefix cache serves them warm (the word-level tokenizer
    # made every suite word <unk>: all prompts were one token sequence).
    prompts = [encode(r.prompt) for r in long_requests(encode, 512, 3, 0, 1)]
    assert all(len(p) == 512 and tokenizer.unk_token_id not in p for p in prompts)
    shared = len(encode(LONG_HEAD)) + len("Entry 1: at ")
    assert len({tuple(p[: shared + 8]) for p in prompts}) == 3
    # Every id a model can sample streams text.
    assert all(tokenizer.decode([i]) for i in range(3, 300))
    chat = [{"role": "user", "content": "Entry 7: at 12:30"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(encode(text)) == text


def test_a_real_tokenizer_and_its_template_replace_the_character_one(tmp_path: Path) -> None:
    """``--tokenizer default``: SmolLM2's geometry with the embedded GGUF's own tokenizer
    and chat template, as the serving measurements use it in place of the GGUF."""
    gguf = default_model_path()
    real = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out = write_random_checkpoint(
        tmp_path / "smol", "smollm2-135m", tokenizer=load_tokenizer("default")
    )
    written = AutoTokenizer.from_pretrained(str(out))
    assert written.chat_template == real.chat_template
    chat = [{"role": "user", "content": "What is the weather in Paris?"}]
    assert written.apply_chat_template(chat, tokenize=True) == real.apply_chat_template(
        chat, tokenize=True
    )
    assert (out / MARKER).is_file()
    # A tokenizer with more ids than the geometry's vocabulary is refused.
    with pytest.raises(CheckpointError, match="vocabulary"):
        write_random_checkpoint(
            tmp_path / "small", "smollm2-135m", tokenizer=char_level_tokenizer(60000)
        )
