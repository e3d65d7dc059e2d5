"""The Transformers baseline of a random-weight geometry runs the weights Ignition
prepares (``bench/transformers_decode.py``), on the tiny hybrid config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from checkpoints import CPU_OPTIONS, TINY_HYBRID
from transformers import AutoModelForCausalLM
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

from bench.transformers_decode import load
from ignition.loading.random_weights import write_random_checkpoint
from ignition.preparation.prepared import prepare
from recipes.qwen4_exp import checkpoint_views


def test_the_baseline_holds_the_prepared_weights_and_canonical_buffers(tmp_path: Path) -> None:
    config = Qwen4ExpTextConfig(**TINY_HYBRID)
    geometry = write_random_checkpoint(tmp_path / "geometry", config)
    model = load(geometry, device="cpu")
    options = replace(
        CPU_OPTIONS, max_concurrency=1, context_limit=512, snapshot_rows=1, dtype=torch.bfloat16
    )
    prepared = prepare(geometry, options)
    # Every checkpoint tensor, as each model holds it (the prepared model merges some
    # projections, so compare through the checkpoint's names).
    placed = prepared.model.mapping.placements
    compared = 0
    for name, param in model.named_parameters():
        for stored, view in checkpoint_views(name, param, config):
            assert torch.equal(view, placed[stored]), stored
            compared += 1
    assert compared == len(placed)
    # The derived buffers equal those the canonical constructor computes.
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    ours, theirs = dict(model.named_buffers()), dict(fresh.named_buffers())
    assert ours.keys() == theirs.keys()
    for name, buffer in theirs.items():
        assert torch.equal(ours[name].to(buffer.dtype), buffer), name
