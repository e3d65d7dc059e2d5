"""SmolLM2's stand-in, written from the repository's fixtures: its geometry, and the
fixture's tokenizer and template as a checkpoint loads them."""

from __future__ import annotations

import json
from pathlib import Path

from agent_fixtures import fixture_tokenizer

from bench.smollm2_stand_in import main
from ignition.loading.random_weights import GEOMETRIES, load_tokenizer


def test_the_stand_in_has_smollm2s_geometry_tokenizer_and_template(tmp_path: Path) -> None:
    out = tmp_path / "smollm2"
    assert main([str(out), "--seed", "3"]) == 0
    config = json.loads((out / "config.json").read_text())
    geometry = GEOMETRIES["smollm2-135m"]()
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        assert config[field] == getattr(geometry, field)
    assert json.loads((out / "random-weights.json").read_text())["seed"] == 3

    loaded, fixture = load_tokenizer(str(out)), fixture_tokenizer("smollm2")
    assert loaded.backend_tokenizer.to_str() == fixture.backend_tokenizer.to_str()
    assert loaded.chat_template == fixture.chat_template
    assert loaded.all_special_tokens == fixture.all_special_tokens
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ."}]
    rendered = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == fixture.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert loaded.encode(rendered) == fixture.encode(rendered)
