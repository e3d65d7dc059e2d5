"""The recipe interface: the registry picks a recipe by the config, and preparation
reads everything model-specific through it (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import CPU_OPTIONS, write_tiny, write_tiny_hybrid
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from ignition.loading.source import CheckpointError
from ignition.preparation.prepared import plan, prepare
from recipes import llama, qwen4_exp
from recipes.interface import Recipe, StateLayout
from recipes.registry import RECIPES, recipe_for, recipe_named

CPU = CPU_OPTIONS


def test_the_registry_picks_by_architectures_then_model_type() -> None:
    assert [recipe.name for recipe in RECIPES] == ["llama", "qwen4_exp"]
    by_architecture = LlamaConfig(architectures=["Qwen3ForCausalLM"])
    assert recipe_for(by_architecture) is llama.RECIPE
    # GGUF configs carry a model_type and no architectures.
    by_type = AutoConfig.for_model("qwen3")
    assert not getattr(by_type, "architectures", None)
    assert recipe_for(by_type) is llama.RECIPE
    assert recipe_named("llama") is llama.RECIPE
    unserved = AutoConfig.for_model("gpt2")
    with pytest.raises(CheckpointError, match="not served by any recipe"):
        recipe_for(unserved)
    with pytest.raises(CheckpointError, match="no recipe is named"):
        recipe_named("mamba")


def test_llama_is_a_recipe_whose_layout_is_its_geometry() -> None:
    recipe: Recipe = llama.RECIPE
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
    )
    assert recipe.layout(config, torch.float32) == StateLayout(
        vocab=96, hidden=32, kv_layers=3, kv_heads=2, head_dim=8
    )
    assert recipe.page_size == llama.PAGE_SIZE
    assert recipe.sampling_defaults("0" * 64) == llama.SamplingDefaults()
    config.hidden_act = "gelu"
    with pytest.raises(CheckpointError, match="hidden_act"):
        recipe.validate_config(config)


def test_preparation_plans_through_the_recipe(tmp_path: Path) -> None:
    path = Path(write_tiny(tmp_path, "llama"))
    planned = plan(path, CPU)
    assert planned.recipe is llama.RECIPE
    assert planned.layout == llama.RECIPE.layout(planned.config, CPU.dtype)
    assert planned.catalog.page_size == llama.PAGE_SIZE
    assert planned.context_limit == 256 and planned.stop_tokens
    prepared = prepare(path, CPU)
    assert prepared.recipe == "llama"
    # The storage is the layout's: pages of the recipe's K/V, the saved hidden vector.
    layout = planned.layout
    kv = prepared.storage.cache.kv
    assert kv.shape[0] == layout.kv_layers and layout.kv_heads in kv.shape
    assert prepared.storage.state.hidden.shape[-1] == layout.hidden
    assert prepared.storage.staging.logits.shape[-1] == layout.vocab


def test_the_tiny_hybrid_is_the_issues_geometry_and_its_recipe_declares_its_state(
    tmp_path: Path,
) -> None:
    # Issue 22's CPU fixture: the canonical model loads from the written files with
    # three Gated DeltaNet layers (PLE on the first), one sparse-attention layer, 8
    # experts top-2; the registry picks the hybrid recipe, whose layout declares the
    # selector pages and the continuation rows preparation allocates.
    path = write_tiny_hybrid(tmp_path / "hybrid")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    layers = model.model.layers
    mixers = [
        type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__
        for layer in layers
    ]
    assert mixers[:3] == ["Qwen4ExpTextGatedDeltaNet"] * 3 and mixers[3] == "Qwen4ExpTextAttention"
    assert [getattr(layer, "ple", None) is not None for layer in layers] == [
        True,
        False,
        False,
        False,
    ]
    assert model.config.num_experts == 8 and model.config.num_experts_per_tok == 2
    ids = torch.randint(3, 512, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert model(ids).logits.shape == (1, 24, 512)
    assert recipe_for(model.config) is qwen4_exp.RECIPE
    prepared = prepare(path, CPU)
    assert prepared.recipe == "qwen4_exp"
    layout = qwen4_exp.RECIPE.layout(model.config, CPU.dtype)
    assert layout.kv_layers == 1 and [f.name for f in layout.paged] == ["selectors"]
    storage = prepared.storage
    assert set(storage.cache.extra) == {"selectors"}
    rows = {f.name for f in layout.rows}
    assert set(storage.rows.tensors) == rows
    assert {n for n in storage.snapshots.tensors() if n.startswith("rows.")} == {
        f"rows.{n}" for n in rows
    }
    # A dense model declares neither.
    assert llama.RECIPE.layout(AutoConfig.for_model("qwen3"), CPU.dtype).rows == ()
