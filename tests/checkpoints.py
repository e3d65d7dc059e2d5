"""Tiny random-weight checkpoints written with ``save_pretrained``, for CPU tests.

Each comes with a small word-level tokenizer and a ChatML template so that the
whole preparation path (config, weights, tokenizer, EOS) runs on real files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ignition.loading.synthetic_tokenizers import word_level_tokenizer

VOCAB = 512


def _tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(VOCAB)


def write_tiny(
    path: Path,
    family: str,
    *,
    tie: bool = False,
    seed: int = 0,
    hidden: int = 64,
    head_dim: int = 16,
    layers: int = 2,
) -> Path:
    """A tiny ``llama`` or ``qwen3`` checkpoint with GQA (4 heads, 2 KV heads)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=tie,
    )
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=head_dim, **common))
    else:
        raise ValueError(family)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path
