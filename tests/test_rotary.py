"""The prepared rotary table equals the canonical module, position by position."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from ignition.components.rotary import RotaryTable


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_table_rows_equal_the_canonical_module_for_any_batch(dtype: torch.dtype) -> None:
    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=20000,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    rotary = LlamaRotaryEmbedding(config=config)
    # More positions than one build chunk, so the chunked build is covered.
    table = RotaryTable(rotary, 9000, dtype, torch.device("cpu"))
    assert table.cos.shape == (9000, 64) and table.cos.dtype == dtype
    probe = torch.empty(1, 1, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    for count in (1, 2, 4, 37, 128):
        positions = torch.randint(0, 9000, (count,), generator=gen)
        cos, sin = rotary(probe, positions.unsqueeze(0))
        got_cos, got_sin = table.lookup(positions)
        assert torch.equal(got_cos, cos[0]) and torch.equal(got_sin, sin[0])


def test_qwen3_table_and_clamped_padding_positions() -> None:
    config = Qwen3Config(hidden_size=128, num_attention_heads=2, head_dim=64)
    rotary = Qwen3RotaryEmbedding(config=config)
    table = RotaryTable(rotary, 256, torch.bfloat16, torch.device("cpu"))
    cos, _ = table.lookup(torch.tensor([255, 256, 10_000]))
    assert torch.equal(cos[1], table.cos[255]) and torch.equal(cos[2], table.cos[255])
    assert table.nbytes() == 2 * 256 * 64 * 2
    with pytest.raises(ValueError, match="at least one position"):
        RotaryTable(rotary, 0, torch.bfloat16, torch.device("cpu"))
