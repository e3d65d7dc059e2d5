"""The hybrid MoE roofline (``bench.suite.sparse_geometry``) against Transformers'
``qwen4_exp_text`` model on the meta device, on the tiny config and the H200 one."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from checkpoints import TINY_HYBRID
from transformers import AutoModelForCausalLM
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

from bench.suite.report import GEOMETRIES, Geometry, resolve_geometry, roofline_step_s
from bench.suite.sparse_geometry import SparseGeometry
from ignition.loading.random_weights import GEOMETRIES as CONFIGS


def _h200_config() -> dict:
    return CONFIGS["qwen4-exp-h200"]().to_dict()


def _tiny_config() -> dict:
    return Qwen4ExpTextConfig(**TINY_HYBRID).to_dict()


def _shapes(config: dict) -> dict[str, tuple[int, ...]]:
    pretrained = Qwen4ExpTextConfig(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(pretrained, dtype=torch.bfloat16)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def h200() -> tuple[SparseGeometry, dict[str, tuple[int, ...]]]:
    config = _h200_config()
    return SparseGeometry.from_config(config), _shapes(config)


@pytest.fixture(scope="module")
def tiny() -> tuple[SparseGeometry, dict[str, tuple[int, ...]]]:
    config = _tiny_config()
    return SparseGeometry.from_config(config), _shapes(config)


@pytest.mark.parametrize("which", ["tiny", "h200"])
def test_sparse_geometry_parts_total_the_models_parameters(
    which: str, request: pytest.FixtureRequest
) -> None:
    geometry, shapes = request.getfixturevalue(which)
    total = sum(math.prod(s) for s in shapes.values())
    assert geometry.parameters() == total
    assert geometry.weight_bytes() == 2 * total
    config = _tiny_config() if which == "tiny" else _h200_config()
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    assert geometry.expert_size == 3 * hidden * inter
    assert geometry.moe_layers == config["num_hidden_layers"]
    assert geometry.ple_layers == len(config["ple_layer_ids"])


def test_sparse_geometry_h200_weights_read_at_batch_1(h200) -> None:
    geometry, shapes = h200
    total = sum(math.prod(s) for s in shapes.values())
    embed = math.prod(shapes["model.embed_tokens.weight"])
    table = shapes["model.layers.0.ple.ple_embedding.ngram_embedding.weight"]
    assert table == (16001920, 160)
    experts = sum(math.prod(s) for n, s in shapes.items() if ".mlp.experts." in n)
    expected = 2 * (
        total - embed - math.prod(table) - experts + experts * 10 / 128 + 2560 + 16 * 160
    )
    read = geometry.weight_bytes_read(1)
    assert read == pytest.approx(expected, rel=1e-2)
    assert read == pytest.approx(12.97e9, rel=1e-2)
    parts = geometry.describe(1, 0)
    assert parts["experts"] == 48 * 10 * 3 * 2560 * 640 * 2
    assert parts["ple_rows"] == 16 * 160 * 2
    assert parts["embedding_rows"] == 2560 * 2


def test_sparse_geometry_expected_distinct_experts(tiny, h200) -> None:
    for geometry, _ in (tiny, h200):
        k, e = geometry.experts_per_tok, geometry.num_experts
        assert geometry.expected_experts(1) == k
        counts = [geometry.expected_experts(b) for b in (1, 2, 4, 8, 16)]
        assert all(a < b for a, b in itertools.pairwise(counts))
        many = [geometry.expected_experts(b) for b in (16, 64, 256, 4096, 65536)]
        assert all(a <= b <= e for a, b in itertools.pairwise(many))
        assert many[-1] == pytest.approx(e)
        assert geometry.describe(1)["experts"] == geometry.moe_layers * k * geometry.expert_size * 2


def test_sparse_geometry_attention_is_bounded_but_indexer_keys_grow(h200) -> None:
    geometry, _ = h200
    bound = geometry.indexer_budget + geometry.indexer_ratio
    at = {c: geometry.describe(2, c) for c in (bound - 4, bound, bound + 4, 4 * bound)}
    assert at[bound - 4]["attention_kv"] < at[bound]["attention_kv"]
    assert (
        at[bound]["attention_kv"] == at[bound + 4]["attention_kv"] == at[4 * bound]["attention_kv"]
    )
    keys = [at[c]["indexer_keys"] for c in sorted(at)]
    assert all(a < b for a, b in itertools.pairwise(keys))
    per_position = 2 * 12 * 2 * 2 * 256 * 2  # batch, layers, K and V, KV heads, dim, bf16
    assert at[bound]["attention_kv"] == bound * per_position
    assert at[4 * bound]["indexer_keys"] == 2 * 12 * bound * 128 * 2


def test_sparse_geometry_describe_sums_to_bytes_per_step(tiny, h200) -> None:
    for geometry, _ in (tiny, h200):
        for batch, context in ((1, 0), (1, 600), (4, 600), (4, 32768), (64, 100_000)):
            parts = geometry.describe(batch, context)
            assert sum(parts.values()) == geometry.bytes_per_step(batch, context)
            weights = ("dense_weights", "embedding_rows", "ple_rows", "experts")
            assert sum(parts[k] for k in weights) == geometry.weight_bytes_read(batch)
        assert roofline_step_s(geometry, 4e12, 4, 600) == geometry.bytes_per_step(4, 600) / 4e12


def test_resolve_geometry_of_a_hybrid_config(tmp_path: Path, tiny) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_tiny_config()))
    resolved = resolve_geometry(str(path))
    assert isinstance(resolved, SparseGeometry)
    assert resolved == tiny[0]
    named = resolve_geometry("qwen4-exp-h200")
    assert isinstance(named, SparseGeometry)
    assert named.weight_bytes_read(1) == pytest.approx(12.97e9, rel=1e-2)
    dense = resolve_geometry("qwen3-8b")
    assert isinstance(dense, Geometry)
    assert dense == GEOMETRIES["qwen3-8b"]


def test_sparse_geometry_round_trips_its_fields(tiny) -> None:
    from dataclasses import asdict

    geometry = tiny[0]
    assert resolve_geometry(json.dumps(asdict(geometry))) == geometry
