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
from ignition.preparation.prepared import PrepareOptions

VOCAB = 512
# Eager preparation on the CPU in float32, for tests of tiny checkpoints (replace
# what a test needs otherwise).
CPU_OPTIONS = PrepareOptions(
    max_concurrency=2,
    prefill_chunk_size=128,
    context_limit=256,
    snapshot_rows=2,
    compile=False,
    capture=False,
    device="cpu",
    dtype=torch.float32,
)

# The hybrid model of issue 22 at the tiny geometry its CPU tests use: three Gated
# DeltaNet layers and one sparse-attention (QSA) layer, 8 experts top-2 with a shared
# expert, 4 hyperconnection streams, PLE n-gram embeddings on layer 1 (one-indexed),
# an indexer budget of 8 tokens in blocks of 4, partial rotary.
TINY_HYBRID = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["qwen_sparse_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    num_experts=8,
    num_experts_per_tok=2,
    hc_count=4,
    hc_lowrank=8,
    ple_layer_ids=[1],
    ple_embed_dim=32,
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=1000,
    make_ngram_vocab_size_divisible_by=8,
    split_ngram_parts=1,
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=8,
    indexer_compress_ratio=4,
    max_position_embeddings=2048,
    eos_token_id=1,
    bos_token_id=2,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
)

# The tiny hybrid's layers at widths where cuBLAS takes other kernels for 1, 2 and 4
# rows (hidden 1024, heads of 128, 16 experts of 256): for the GPU's batch-invariance
# test.
WIDE_HYBRID = dict(
    hidden_size=1024,
    num_attention_heads=8,
    head_dim=128,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
    num_experts=16,
    num_experts_per_tok=4,
    hc_lowrank=32,
    ple_embed_dim=128,
    indexer_n_heads=4,
    indexer_head_dim=64,
)


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
    attention_bias: bool = False,
    norm_gains: bool = False,
) -> Path:
    """A tiny ``llama`` or ``qwen3`` checkpoint with GQA (4 heads, 2 KV heads);
    ``attention_bias`` gives the attention projections biases, random (Transformers
    initializes them to zero); ``norm_gains`` gives the RMSNorms random gains in [0.5,
    1.5) (Transformers initializes them to one)."""
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
        attention_bias=attention_bias,
    )
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=head_dim, **common))
    else:
        raise ValueError(family)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if attention_bias and name.endswith("bias"):
                param.normal_(0.0, 0.5)
            if norm_gains and "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path


def write_tiny_multimodal_hybrid(
    path: Path, *, seed: int = 0, tie: bool = False
) -> torch.nn.Module:
    """A tiny ``Qwen4ExpForConditionalGeneration`` checkpoint, as Qwen3.8 Flash is
    published: ``TINY_HYBRID``'s text model beside a small vision tower (tensors
    ``model.language_model.*``, ``model.visual.*``, ``lm_head.*``). Returns the model."""
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import (
        Qwen4ExpForConditionalGeneration,
    )

    torch.manual_seed(seed)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = Qwen4ExpConfig(text_config=TINY_HYBRID, vision_config=vision, tie_word_embeddings=tie)
    model = Qwen4ExpForConditionalGeneration(config).eval()
    perturb_zero_initialized(model)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return model


def perturb_zero_initialized(model: torch.nn.Module, scale: float = 0.2) -> None:
    """Transformers initializes ``qwen4_exp``'s RMSNorm gains (``1 + w``) and PLE
    convolution to zero, and GDN's ``dt_bias`` to ones, which would leave those
    weights' arithmetic untested (any rank's slice of a constant ``dt_bias`` is every
    other's): give them the spread of a trained checkpoint's."""
    # dt_bias's spread from a generator of its own: the global stream draws what it
    # drew before dt_bias was spread, so every other weight keeps its value.
    spread = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("ple.conv1d.weight"):
                param.add_(torch.randn_like(param) * scale)
            elif name.endswith("dt_bias"):
                # A trained dt_bias spreads over units (the step sizes' range).
                noise = torch.randn(param.shape, generator=spread, dtype=param.dtype)
                param.add_(noise.to(param.device))


def write_tiny_hybrid(path: Path, *, seed: int = 0, **overrides: object) -> Path:
    """A tiny ``qwen4_exp`` text checkpoint (``TINY_HYBRID``, with ``overrides``)
    with the test tokenizer."""
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM(Qwen4ExpTextConfig(**{**TINY_HYBRID, **overrides}))
    perturb_zero_initialized(model)
    model.save_pretrained(path)
    _tokenizer().save_pretrained(path)
    return path
