"""What a decode step of the hybrid MoE ``qwen4_exp_text`` family reads: the sparse
counterpart of ``bench.suite.report.Geometry``, for the bandwidth roofline.

A decode step of ``batch`` sequences, each at ``context`` positions, reads from HBM at
least:

- every weight that every token uses, once (all parameters but the token embedding
  table, the PLE n-gram tables and the routed experts; the LM head in full);
- one embedding row per sequence (a tied model reads its whole table as the LM head
  instead, as the dense geometry does);
- per sequence and PLE layer, the n-gram table rows its hashed n-gram heads look up:
  ``heads_per_ngram * (ngram_size - 1)`` rows of the table's width;
- per MoE layer, the routed experts the batch selects: the expected number of
  distinct experts under uniform independent routing, ``E * (1 - (1 - k/E) ** batch)``
  (an expectation, not a bound; exactly ``k`` at batch 1), each ``gate``, ``up`` and
  ``down`` of ``hidden x moe_intermediate_size``;
- per sequence, its recurrent state, read and written: each Gated DeltaNet layer's
  fp32 state ``[value heads, key dim, value dim]`` and bf16 convolution state
  (``2 * key heads * key dim + value heads * value dim`` channels of ``kernel - 1``
  positions), and each PLE layer's convolution state (``hc_count * hidden``
  channels of ``(ple_conv_kernel_size - 1) * ngram_size`` positions, bf16);
- per sequence and QSA layer, K and V of the positions attention may select,
  ``min(context, indexer_budget + indexer_compress_ratio)``, and the indexer's
  compressed keys, ``ceil(context / indexer_compress_ratio)`` of
  ``indexer_kv_heads * indexer_head_dim``, all of which the indexer scores.

The parameter counts come from Transformers' own model built on the meta device
(no memory, no weights), so every module the family has is counted as it is
declared; the per-step terms come from the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MODEL_TYPE = "qwen4_exp_text"
LINEAR = "linear_attention"
SPARSE = "qwen_sparse_attention"


def _canonical_parameters(config: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Name and shape of every parameter of Transformers' model of ``config``, built
    on the meta device (tied parameters once, under their first name)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    model_type = fields.pop("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise ValueError(f"SparseGeometry is of model_type {MODEL_TYPE!r}, not {model_type!r}")
    pretrained = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(pretrained, dtype=torch.bfloat16)
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


@dataclass(frozen=True)
class SparseGeometry:
    """What a decode step reads, from a hybrid MoE (``qwen4_exp_text``) model: its
    parameters split into those every step reads in full (``dense_parameters``, the LM
    head included), the token embedding table, the PLE n-gram tables and the routed
    experts, each of the last three read only where the batch's tokens select them;
    and the shapes of the per-sequence state (Gated DeltaNet and PLE recurrent
    state, QSA's K/V and indexer keys). Build it with ``from_config``."""

    hidden: int
    vocab: int
    tied: bool
    # Parameters, counted from the canonical model.
    dense_parameters: int
    embedding_parameters: int
    ple_table_parameters: int
    expert_parameters: int  # every routed expert of every layer
    # Routed experts.
    moe_layers: int
    num_experts: int
    experts_per_tok: int
    expert_size: int  # parameters of one expert of one layer (gate, up, down)
    # PLE: per PLE layer and token, ple_lookups rows of ple_row values.
    ple_layers: int
    ple_lookups: int
    ple_row: int
    ple_conv_channels: int
    ple_conv_history: int
    # Gated DeltaNet layers.
    linear_layers: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    linear_conv_channels: int
    linear_conv_kernel: int
    # QSA layers.
    sparse_layers: int
    kv_heads: int
    head_dim: int
    indexer_budget: int
    indexer_ratio: int
    indexer_kv_heads: int
    indexer_head_dim: int
    dtype_bytes: int = 2
    state_bytes: int = 4  # the Gated DeltaNet state is fp32

    @classmethod
    def from_config(cls, config: dict[str, Any], dtype_bytes: int = 2) -> SparseGeometry:
        """From a Transformers ``config.json`` of ``qwen4_exp_text`` (as a dict)."""
        parameters = _canonical_parameters(config)
        num_experts = int(config["num_experts"])
        tied = bool(config.get("tie_word_embeddings", False))
        dense = embedding = ple_table = experts = 0
        moe_layers: set[str] = set()
        ple_layers = 0
        ple_row = 0
        for name, shape in parameters:
            numel = math.prod(shape)
            if "embed_tokens" in name:
                embedding += numel
            elif "ngram_embedding" in name:
                ple_table += numel
                ple_layers += 1
                ple_row = shape[-1]
            elif ".mlp.experts." in name and shape[0] == num_experts:
                experts += numel
                moe_layers.add(name.split(".mlp.experts.")[0])
            else:  # the LM head among them (absent, being the table, when tied)
                dense += numel
        if tied:
            # The table is the LM head: every step reads it in full.
            dense += embedding
            embedding = 0
        hidden = int(config["hidden_size"])
        expert_size = experts // (len(moe_layers) * num_experts) if moe_layers else 0
        layer_types = list(config["layer_types"])
        heads = int(config["num_attention_heads"])
        key_heads = int(config["linear_num_key_heads"])
        key_dim = int(config["linear_key_head_dim"])
        value_heads = int(config["linear_num_value_heads"])
        value_dim = int(config["linear_value_head_dim"])
        ngram_size = int(config["ngram_size"])
        return cls(
            hidden=hidden,
            vocab=int(config["vocab_size"]),
            tied=tied,
            dense_parameters=dense,
            embedding_parameters=embedding,
            ple_table_parameters=ple_table,
            expert_parameters=experts,
            moe_layers=len(moe_layers),
            num_experts=num_experts,
            experts_per_tok=int(config["num_experts_per_tok"]),
            expert_size=expert_size,
            ple_layers=ple_layers,
            ple_lookups=int(config["heads_per_ngram"]) * (ngram_size - 1),
            ple_row=ple_row,
            ple_conv_channels=int(config.get("hc_count", 1)) * hidden,
            ple_conv_history=(int(config.get("ple_conv_kernel_size", 4)) - 1) * ngram_size,
            linear_layers=layer_types.count(LINEAR),
            linear_value_heads=value_heads,
            linear_key_dim=key_dim,
            linear_value_dim=value_dim,
            linear_conv_channels=2 * key_heads * key_dim + value_heads * value_dim,
            linear_conv_kernel=int(config.get("linear_conv_kernel_dim", 4)),
            sparse_layers=layer_types.count(SPARSE),
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            indexer_budget=int(config["indexer_budget"]),
            indexer_ratio=int(config["indexer_compress_ratio"]),
            indexer_kv_heads=int(config["indexer_kv_heads"]),
            indexer_head_dim=int(config["indexer_head_dim"]),
            dtype_bytes=dtype_bytes,
        )

    # ------------------------------------------------------------ weights

    def parameters(self) -> int:
        return (
            self.dense_parameters
            + self.embedding_parameters
            + self.ple_table_parameters
            + self.expert_parameters
        )

    def weight_bytes(self) -> int:
        """Bytes of every parameter."""
        return self.parameters() * self.dtype_bytes

    def expected_experts(self, batch: int = 1) -> float:
        """Distinct routed experts ``batch`` tokens select in one MoE layer, expected
        under uniform independent routing: ``E * (1 - (1 - k/E) ** batch)``. An
        expectation (a skewed router selects fewer), exactly ``k`` at batch 1, rising
        with ``batch`` towards ``E``, never above it."""
        return float(self._expected_experts(batch))

    def _expected_experts(self, batch: int) -> Fraction:
        e, k = self.num_experts, self.experts_per_tok
        return e * (1 - Fraction(e - k, e) ** batch)

    def _parts(self, batch: int, context: int) -> dict[str, int]:
        b = self.dtype_bytes
        dense = self.dense_parameters * b
        rows = 0 if self.tied else batch * self.hidden * b
        ple = batch * self.ple_layers * self.ple_lookups * self.ple_row * b
        experts = round(self._expected_experts(batch) * self.moe_layers * self.expert_size * b)
        gdn = (
            self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * self.state_bytes
            + self.linear_conv_channels * (self.linear_conv_kernel - 1) * b
        )
        ple_conv = self.ple_conv_channels * self.ple_conv_history * b
        recurrent = 2 * batch * (self.linear_layers * gdn + self.ple_layers * ple_conv)
        selected = min(context, self.indexer_budget + self.indexer_ratio)
        kv = batch * self.sparse_layers * selected * 2 * self.kv_heads * self.head_dim * b
        blocks = -(-context // self.indexer_ratio)
        keys = (
            batch * self.sparse_layers * blocks * self.indexer_kv_heads * self.indexer_head_dim * b
        )
        return {
            "dense_weights": dense,
            "embedding_rows": rows,
            "ple_rows": ple,
            "experts": experts,
            "recurrent_state": recurrent,
            "attention_kv": kv,
            "indexer_keys": keys,
        }

    def weight_bytes_read(self, batch: int = 1) -> int:
        """Weights one decode step of ``batch`` sequences reads: the dense ones in
        full, the embedding and PLE rows its tokens look up, the routed experts it is
        expected to select (``expected_experts``)."""
        parts = self._parts(batch, 0)
        return sum(parts[k] for k in ("dense_weights", "embedding_rows", "ple_rows", "experts"))

    def bytes_per_step(self, batch: int = 1, context: int = 0) -> int:
        """Bytes one decode step reads: the weights it uses once, and each sequence's
        recurrent state, selected K/V and indexer keys."""
        return sum(self._parts(batch, context).values())

    def describe(self, batch: int = 1, context: int = 0) -> dict[str, int]:
        """``bytes_per_step`` by part: dense_weights, embedding_rows, ple_rows,
        experts (expected), recurrent_state, attention_kv, indexer_keys."""
        return self._parts(batch, context)
