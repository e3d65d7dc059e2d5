"""The ``qwen4_exp`` recipe's text model: the hybrid of Gated DeltaNet and QSA layers,
routed and shared experts, hyperconnections and PLE, over packed tokens, fixed pages
and slot-indexed continuation rows.

Composition: the canonical Transformers model is built on the meta device and keeps
its embedding, decoder layers (their forward included: PLE injection, the two
hyperconnection mixers, the injections), router, experts' weights, final
hyperconnection mixer and vocabulary head. Three modules are replaced, the smallest
units whose dataflow serving changes; each reads its request state through the step
context that the decoder layer passes as ``past_key_values``:

- ``linear_attn`` becomes ``PreparedGatedDeltaNet``: the canonical projections,
  gated norm and output projection around ``ignition.components.gated_delta`` over
  the row's recurrent matrix and convolution history;
- ``self_attn`` (QSA with its indexer) becomes ``PreparedSparseAttention``: the
  canonical projections, norms and partial rotary function; the indexer writes
  block keys to the selector pages and its ring, selects
  (``ignition.components.selector``), and attention reads the selected tokens of
  the paged K/V it writes first;
- ``ple`` becomes ``PreparedPle``: the canonical n-gram hash, projections, gate and
  norms over the row's two-token history and dilated convolution history.

Three more are replaced for speed, measured on the H200 (``bench/results/issue22/``):

- ``mlp`` becomes ``PreparedMoe``, the canonical block's forward with the shared
  expert's gate, up and sigmoid-gate projections as one GEMM; GDN's four input
  projections, and QSA's query, key, value and indexer projections, are one GEMM each
  too (``MERGED``: each canonical weight is a row view of
  the merged one, so loading is unchanged). At the H200 geometry a step ran about
  1,060 small cuBLAS launches at 1.5 TB/s;
- each layer's ``attn_hyper_connection`` and ``mlp_hyper_connection`` become
  ``PreparedGatedResidual``, the canonical forward with its input-mix and injection
  projections (both of the normed streams) as one GEMM;
- ``mlp.experts`` becomes ``PreparedExperts``: a prefill chunk's routed experts run
  Transformers' ``grouped_mm`` implementation (no host synchronization), a decode
  step's few tokens one matrix-vector product per token and slot
  (``flare::routed_experts``: sorting a handful of rows into 64-row grouped-GEMM
  tiles read the experts at 1.7 TB/s).

A request's decode arithmetic does not depend on which requests share its step
(served at capacity 1 and in a batch of 4, the same request samples the same tokens):
every projection of a decode step goes through ``invariant_project`` (the fixed-tile
Triton kernel, or the K-split kernel for projections too narrow for it): the merged
ones explicitly (the router's among them: ``route`` is the canonical router's forward
from its logits), every ``nn.Linear`` (the vocabulary head's too) as a ``ProjectedLinear``
(``project_linears``); GDN's and PLE's decode convolutions are sums of taps
(``ignition.components.depthwise_conv``), not cuDNN; every RMSNorm's mean square and
PLE's gate sum are ``flare::row_sum`` (``invariant_norms``), not CUDA reductions that
pick their strategy by the row count. On the H200 the served
50-prompt corpus matched the harness for none of its prompts at concurrency 1 before
(the harness decodes in batches of up to 4; cuBLAS picks its kernel by row count).

Tensor parallel (``ignition.parallel``): rank r of n builds the canonical model from
its own counts (``local_config``: GDN's key and value heads, QSA's heads and KV heads,
the routed and shared experts' intermediate sizes divided by n) and loads its part of
each checkpoint tensor (``shards``). The GDN, QSA and MoE blocks all-reduce their
outputs; the indexer, router, hyperconnections and PLE run whole on every rank, so
every rank selects the same blocks and routes to the same experts. The vocabulary
head's shards are gathered.

The rotary table is the canonical interleaved-mRoPE module's output with its three
position rows equal (text only).

A step's rows each carry one request's tokens: a prefill chunk is one row of the
chunk's capacity (``step.start``, ``step.n_valid``), decode is one token per row
(``step.seq_lens`` > 0 where live). ``step.slots`` names each row's continuation row.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.activations import ACT2FN

from ignition.components import gated_delta, selector
from ignition.components.continuation import (
    ContinuationRows,
    RowField,
    read_slot_rows,
    write_slot_rows,
)
from ignition.components.depthwise_conv import causal_taps
from ignition.components.experts import FUSED_MAX_TOKENS, routed_experts
from ignition.components.kv_cache import AttentionStep, PagedField, PagedKvCache, write_kv
from ignition.components.linear import invariant_project, project_linears
from ignition.components.rotary import RotaryTable
from ignition.components.row_reduce import last_sum, mean_square
from ignition.loading.mapping import Shard, WeightMapping
from ignition.loading.source import CheckpointError
from ignition.parallel.collectives import Collectives
from ignition.parallel.shard import ONE_RANK, TensorParallel
from ignition.preparation.compile_flags import DecodeFusion
from recipes.composition import check_placed, place_rotary, set_parameter
from recipes.interface import SamplingDefaults, StateLayout

NAME = "qwen4_exp"
ARCHITECTURES = ("Qwen4ExpForCausalLM",)
# Qwen3.8 Flash as published: the text model beside a vision tower.
MULTIMODAL_ARCHITECTURES = ("Qwen4ExpForConditionalGeneration",)
MODEL_TYPES = ("qwen4_exp_text",)
PAGE_SIZE = 64
SELECTORS = "selectors"
KV = "kv"
# Projections of one input that preparation stores as one weight (the members' rows in
# order, each member's parameter a view of its rows), so a step runs one GEMM where the
# canonical module runs several: GDN's four input projections, QSA's query, key and
# value projections with its indexer's, the shared expert's gate and up with its
# sigmoid gate and the router (all four read the MoE block's input; narrow, they run
# the K-split kernel, whose two launches were 7 us per projection at one row on the
# H200, bench/results/issue22/2026-12-04-h200-split/), and each hyperconnection's
# input-mix and injection projections. Keyed by the merged weight's name within its
# layer.
MERGED = {
    "linear_attn.in_proj": (
        "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z",
        "linear_attn.in_proj_b",
        "linear_attn.in_proj_a",
    ),
    "self_attn.in_proj": (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.indexer.index_qk_proj",
    ),
    "mlp.shared_in": (
        "mlp.shared_expert.gate_proj",
        "mlp.shared_expert.up_proj",
        "mlp.shared_expert_gate",
        "mlp.gate",
    ),
    **{
        f"{site}_hyper_connection.mix_in": (
            f"{site}_hyper_connection.input_mix_weight_down",
            f"{site}_hyper_connection.block_inject_weight",
        )
        for site in ("attn", "mlp")
    },
}
# The PLE n-gram hash's persistent buffers, which Transformers computes from the
# config (and saves); preparation computes them the same way.
NGRAM_CONSTANTS = ("layer_multipliers", "ngram_heads_vocab_sizes", "ngram_heads_offsets")
# The config's counts a tensor-parallel rank holds its part of (``local_config``).
SHARDED_COUNTS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "num_attention_heads",
    "num_key_value_heads",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
LINEAR = "linear_attention"
SPARSE = "qwen_sparse_attention"


@functools.cache
def canonical() -> ModuleType:
    """Transformers' ``modeling_qwen4_exp``, imported on first use: importing it
    imports fla-core where it is installed, and fla initializes CUDA on import, which
    must not happen before an export starts recording kernel images (registering this
    recipe must not import it)."""
    from transformers.models.qwen4_exp import modeling_qwen4_exp

    return modeling_qwen4_exp


@dataclass(frozen=True)
class HybridGeometry:
    vocab: int
    hidden: int
    layers: int
    layer_types: tuple[str, ...]
    # Gated DeltaNet
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    # QSA
    heads: int
    kv_heads: int
    head_dim: int
    index_heads: int
    index_dim: int
    ratio: int
    budget: int
    # hyperconnections and PLE
    streams: int
    ple_layers: tuple[int, ...]  # zero-based layer indices
    ngram_context: int
    ple_conv_history: int

    @staticmethod
    def from_config(config: PretrainedConfig) -> HybridGeometry:
        return HybridGeometry(
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            layer_types=tuple(config.layer_types),
            key_heads=config.linear_num_key_heads,
            value_heads=config.linear_num_value_heads,
            key_dim=config.linear_key_head_dim,
            value_dim=config.linear_value_head_dim,
            conv_kernel=config.linear_conv_kernel_dim,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            index_heads=config.indexer_n_heads,
            index_dim=config.indexer_head_dim,
            ratio=config.indexer_compress_ratio,
            budget=config.indexer_budget,
            streams=config.hc_count,
            ple_layers=tuple(i - 1 for i in config.ple_layer_ids),
            ngram_context=config.ngram_size - 1,
            ple_conv_history=(config.ple_conv_kernel_size - 1) * config.ngram_size,
        )

    def local(self, parallel: TensorParallel) -> HybridGeometry:
        """What one rank of ``parallel`` holds (``shards``): its GDN key and value
        heads, its QSA heads and KV heads. The indexer, the hyperconnections and PLE
        are whole on every rank, and so is the vocabulary (the vocabulary head's rows
        are sharded, its logits gathered)."""
        return dataclasses.replace(
            self,
            key_heads=parallel.part(self.key_heads, "linear_num_key_heads"),
            value_heads=parallel.part(self.value_heads, "linear_num_value_heads"),
            heads=parallel.part(self.heads, "attention heads"),
            kv_heads=parallel.part(self.kv_heads, "KV heads"),
        )

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SPARSE)

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def layer_entries(self, layer: int) -> dict[str, int]:
        """Where decoder layer ``layer`` keeps its state: for each continuation field
        it uses (and ``KV`` and ``SELECTORS``, the paged tensors of QSA layers), the
        index of this layer among the layers of its kind."""
        entries: dict[str, int] = {}
        if layer in self.linear_layers:
            index = self.linear_layers.index(layer)
            entries.update(gdn_state=index, gdn_conv=index)
        if layer in self.sparse_layers:
            index = self.sparse_layers.index(layer)
            entries.update({"qsa_ring": index, "qsa_tags": index, KV: index, SELECTORS: index})
        if layer in self.ple_layers:
            index = self.ple_layers.index(layer)
            entries.update(ple_conv=index, ple_tokens=index)
        return entries

    def row_fields(self, dtype: torch.dtype, eos: int) -> tuple[RowField, ...]:
        """The continuation row: what a request's state holds besides its pages."""
        gdn, qsa, ple = len(self.linear_layers), len(self.sparse_layers), len(self.ple_layers)
        return (
            RowField(
                "gdn_state", (gdn, self.value_heads, self.key_dim, self.value_dim), torch.float32
            ),
            RowField("gdn_conv", (gdn, self.conv_channels, self.conv_kernel - 1), dtype),
            RowField("ple_conv", (ple, self.streams * self.hidden, self.ple_conv_history), dtype),
            RowField("ple_tokens", (ple, self.ngram_context), torch.int64, float(eos)),
            RowField("qsa_ring", (qsa, self.ratio, self.index_dim), dtype),
            RowField("qsa_tags", (qsa, self.ratio), torch.int32, -1.0),
        )


def validate_config(config: PretrainedConfig) -> None:
    """Refuse what this recipe's forwards do not implement, naming the field."""
    if config.model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"model_type {config.model_type!r} is not served by the {NAME} recipe "
            f"(it serves {', '.join(MODEL_TYPES)})"
        )
    if config.indexer_n_heads is None:
        raise CheckpointError("qwen_sparse_attention layers without an indexer are not served")
    if config.hidden_act != "silu":
        raise CheckpointError(f"hidden_act {config.hidden_act!r}: the recipe implements silu")
    if getattr(config, "attention_bias", False):
        raise CheckpointError("attention_bias=True is not served by this recipe")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope_type {rope.get('rope_type')!r}: the recipe implements default")
    if PAGE_SIZE % config.indexer_compress_ratio != 0:
        raise CheckpointError(
            f"indexer_compress_ratio {config.indexer_compress_ratio} does not divide the "
            f"{PAGE_SIZE}-token page"
        )


def local_config(config: PretrainedConfig, parallel: TensorParallel) -> PretrainedConfig:
    """``config`` with the head and intermediate counts of one rank of ``parallel``:
    the canonical model built from it has this rank's shapes."""
    if not parallel.sharded:
        return config
    local = copy.deepcopy(config)
    for field in SHARDED_COUNTS:
        setattr(local, field, parallel.part(getattr(config, field), field))
    return local


def shards(config: PretrainedConfig, parallel: TensorParallel) -> Callable[[str], Shard | None]:
    """Where rank ``parallel``'s part of each checkpoint tensor lies, by the tensor's
    name (``None``: whole on every rank). Column-parallel: GDN's query, key and value
    rows (and their convolution channels) by key and value head, its gate, decay and
    step rows by value head; QSA's query (with its gate, interleaved per head), key
    and value rows by head; every expert's and the shared expert's gate and up rows
    by intermediate row; the vocabulary head's rows. Row-parallel (dimension 1): the
    output projections of GDN and QSA and the down projections, whose partial sums
    the layer all-reduces. The router, the shared expert's gate, the indexer, the
    norms, the hyperconnections, PLE and the embeddings are replicated."""
    if not parallel.sharded:
        return lambda name: None
    g = HybridGeometry.from_config(config)
    key_heads = (g.key_heads, g.key_dim, "linear_num_key_heads")
    value_heads = (g.value_heads, g.value_dim, "linear_num_value_heads")
    packed = parallel.spans((key_heads, key_heads, value_heads))
    value_rows = parallel.span(g.value_heads, "linear_num_value_heads", g.value_dim)
    per_value_head = parallel.span(g.value_heads, "linear_num_value_heads")
    heads = parallel.span(g.heads, "attention heads", unit=g.head_dim)
    kv_heads = parallel.span(g.kv_heads, "KV heads", unit=g.head_dim)
    expert = parallel.span(config.moe_intermediate_size, "moe_intermediate_size")
    shared = parallel.span(
        config.shared_expert_intermediate_size, "shared_expert_intermediate_size"
    )
    columns = dataclasses.replace
    by_suffix = {
        "linear_attn.in_proj_qkv.weight": packed,
        "linear_attn.conv1d.weight": packed,
        "linear_attn.in_proj_z.weight": value_rows,
        "linear_attn.in_proj_b.weight": per_value_head,
        "linear_attn.in_proj_a.weight": per_value_head,
        "linear_attn.dt_bias": per_value_head,
        "linear_attn.A_log": per_value_head,
        "linear_attn.out_proj.weight": columns(value_rows, dim=1),
        # The query projection's rows are each head's query, then its gate.
        "self_attn.q_proj.weight": parallel.span(g.heads, "attention heads", 2 * g.head_dim),
        "self_attn.k_proj.weight": kv_heads,
        "self_attn.v_proj.weight": kv_heads,
        "self_attn.o_proj.weight": columns(heads, dim=1),
        # Each expert's (``mlp.experts.E.gate_proj.weight``, the index dropped).
        "mlp.experts.gate_proj.weight": expert,
        "mlp.experts.up_proj.weight": expert,
        "mlp.experts.down_proj.weight": columns(expert, dim=1),
        "mlp.shared_expert.gate_proj.weight": shared,
        "mlp.shared_expert.up_proj.weight": shared,
        "mlp.shared_expert.down_proj.weight": columns(shared, dim=1),
    }
    vocab = parallel.span(g.vocab, "vocab_size")

    def shard(name: str) -> Shard | None:
        if name == "lm_head.weight":
            return vocab
        name = re.sub(r"\.experts\.\d+\.", ".experts.", name)
        return next((s for end, s in by_suffix.items() if name.endswith(f".{end}")), None)

    return shard


@dataclass
class StepContext:
    """What the replaced modules read of one step, passed through the canonical
    decoder layer as ``past_key_values``. A step's context holds every layer's state;
    ``at`` narrows it to what one layer reads, the form the modules take."""

    # Each continuation field [rows, layers of its kind, ...]; in a layer's context
    # only the fields of that layer, narrowed to it ([rows, 1, ...]).
    fields: dict[str, torch.Tensor]
    kv: torch.Tensor  # the QSA layers' K/V pages [layers, 2, pages, ...] (a layer's: [1, ...])
    selectors: torch.Tensor  # their block keys [layers, pages, blocks, dim] (likewise)
    step: AttentionStep
    slots: torch.Tensor  # int64 [rows]
    start: torch.Tensor  # int64 [rows]: position of each row's first token
    n_valid: torch.Tensor  # int64 [rows]: real tokens of each row
    positions: torch.Tensor  # int64 [rows, tokens]
    cos_sin: tuple[torch.Tensor, torch.Tensor]  # [rows * tokens, rotary]
    rotary: RotaryTable
    decode: bool

    @staticmethod
    def of(
        step: AttentionStep,
        positions: torch.Tensor,
        cache: PagedKvCache,
        continuation: ContinuationRows,
        rotary: RotaryTable,
    ) -> StepContext:
        """The context of ``step`` over ``positions`` (decode rows when the step has
        sequence lengths, else one prefill chunk)."""
        if step.slots is None:
            raise ValueError("the hybrid model needs each row's request slot (step.slots)")
        decode = step.seq_lens is not None
        if step.seq_lens is not None:
            start = positions.to(torch.int64)
            n_valid = (step.seq_lens > 0).to(torch.int64)
        else:
            assert step.start is not None and step.n_valid is not None
            start = step.start.to(torch.int64).view(1)
            n_valid = step.n_valid.to(torch.int64).view(1)
        return StepContext(
            fields=dict(continuation.tensors),
            kv=cache.kv,
            selectors=cache.extra[SELECTORS],
            step=step,
            slots=step.slots.to(torch.int64),
            start=start,
            n_valid=n_valid,
            positions=positions.to(torch.int64).view(step.slots.shape[0], -1),
            cos_sin=rotary.lookup(positions),
            rotary=rotary,
            decode=decode,
        )

    def at(self, entries: dict[str, int]) -> StepContext:
        """The context of one decoder layer (``HybridGeometry.layer_entries``): its
        fields, K/V and selector pages as views at entry 0. Every layer of a kind then
        runs the same code over its own tensors, so one compiled region of a shape
        serves all of them (``--compile-scope layer``); an index attribute would be
        specialized into a compilation per layer."""

        def narrow(t: torch.Tensor, name: str, dim: int) -> torch.Tensor:
            return t.narrow(dim, entries[name], 1) if name in entries else t.narrow(dim, 0, 0)

        return dataclasses.replace(
            self,
            fields={n: narrow(t, n, 1) for n, t in self.fields.items() if n in entries},
            kv=narrow(self.kv, KV, 0),
            selectors=narrow(self.selectors, SELECTORS, 0),
        )

    @property
    def rows(self) -> int:
        return self.slots.shape[0]

    @property
    def valid(self) -> torch.Tensor:
        """bool [rows, tokens]"""
        index = torch.arange(self.positions.shape[1], device=self.positions.device)
        return index.view(1, -1) < self.n_valid.view(-1, 1)

    @property
    def live(self) -> torch.Tensor:
        """bool [rows]: rows that consume tokens (their state is written)."""
        return self.n_valid > 0

    @property
    def page_tables(self) -> torch.Tensor:
        """int32 [rows, max_pages]"""
        tables = self.step.page_tables
        return tables if tables.dim() == 2 else tables.unsqueeze(0)

    def read(self, field: str) -> torch.Tensor:
        """Each row's value of this layer's ``field`` (a layer's context)."""
        return read_slot_rows(self.fields[field], 0, self.slots)

    def write(self, field: str, value: torch.Tensor) -> None:
        """Each live row's new value of this layer's ``field``; other rows write back
        what they read."""
        tensor = self.fields[field]
        keep = self.live.view(-1, *([1] * (value.dim() - 1)))
        # A plain read may fuse here: its consumer is the write's own input, which is
        # materialized before the write.
        old = tensor.select(1, 0).index_select(0, self.slots)
        write_slot_rows(tensor, 0, self.slots, torch.where(keep, value.to(tensor.dtype), old))


class PreparedGatedDeltaNet(nn.Module):
    """The canonical GDN module's projections and norms over continuation rows."""

    def __init__(
        self,
        module: nn.Module,
        in_proj: torch.Tensor,
        collectives: Collectives = ONE_RANK.collectives,
    ) -> None:
        """``in_proj``: the merged input projections (``MERGED``), whose row views
        are the canonical ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b`` and
        ``in_proj_a`` weights. ``collectives`` sums a rank's output projection with
        the other ranks'."""
        super().__init__()
        self.canonical = module
        self.in_proj = nn.Parameter(in_proj, requires_grad=False)
        self.collectives = collectives

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache_params: StepContext,
        attention_mask: torch.Tensor | None = None,
        **_: object,
    ) -> torch.Tensor:
        m, ctx = self.canonical, cache_params
        x = hidden_states[0]
        tokens = x.shape[0]
        mixed, z, b, a = invariant_project(x, self.in_proj).split(
            [2 * m.key_dim + m.value_dim, m.value_dim, m.num_v_heads, m.num_v_heads], dim=-1
        )
        z = z.reshape(tokens, -1, m.head_v_dim)
        weight = m.conv1d.weight.squeeze(1)
        history = ctx.read("gdn_conv")
        if ctx.decode:
            mixed, history = gated_delta.conv_decode(mixed, history, weight)
        else:
            mixed, history = gated_delta.conv_prefill(mixed, history[0], weight, ctx.n_valid)
            history = history.unsqueeze(0)
        ctx.write("gdn_conv", history)
        q, k, v = torch.split(mixed, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
        q = q.reshape(tokens, -1, m.head_k_dim)
        k = k.reshape(tokens, -1, m.head_k_dim)
        v = v.reshape(tokens, -1, m.head_v_dim)
        beta = b.sigmoid()
        g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias)
        repeat = m.num_v_heads // m.num_k_heads
        if repeat > 1:
            q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
        state = ctx.read("gdn_state")
        if ctx.decode:
            out, state = gated_delta.delta_rule_decode(q, k, v, g, beta, state)
        else:
            valid = ctx.valid.view(-1)
            out, final = gated_delta.delta_rule_prefill(q, k, v, g, beta, state[0], valid)
            state = final.unsqueeze(0)
        ctx.write("gdn_state", state)
        out = m.norm(out.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))
        return self.collectives.all_reduce(m.out_proj(out.reshape(1, tokens, -1)))


class PreparedSparseAttention(nn.Module):
    """The canonical QSA module (gated attention with its indexer) over paged K/V,
    selector pages and the continuation row's ring."""

    def __init__(
        self,
        module: nn.Module,
        geometry: HybridGeometry,
        in_proj: torch.Tensor,
        collectives: Collectives = ONE_RANK.collectives,
    ) -> None:
        """``in_proj``: the merged input projections (``MERGED``), whose row views
        are the canonical ``q_proj``, ``k_proj``, ``v_proj`` and indexer
        ``index_qk_proj`` weights. ``geometry``: this rank's (its heads); every rank
        runs the whole indexer and selects the same blocks. ``collectives`` sums a
        rank's output projection with the other ranks'."""
        super().__init__()
        self.canonical = module
        self.geometry = geometry
        self.in_proj = nn.Parameter(in_proj, requires_grad=False)
        self.collectives = collectives
        self.selection = selector.SelectorGeometry(geometry.ratio, geometry.budget, PAGE_SIZE)
        # Resolved here, not in the forward (Dynamo would trace through the cache).
        self.apply_rotary = canonical().apply_rotary_pos_emb

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The canonical partial rotary function of ``x [..., heads, dim]`` by
        ``cos/sin [..., rotary]``."""
        return self.apply_rotary(x, cos=cos, sin=sin, unsqueeze_dim=-2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: object = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: StepContext | None = None,
        **_: object,
    ) -> tuple[torch.Tensor, None]:
        m, ctx, g = self.canonical, past_key_values, self.geometry
        assert ctx is not None
        x = hidden_states[0]
        tokens = x.shape[0]
        rows, per_row = ctx.rows, tokens // ctx.rows
        cos, sin = ctx.cos_sin
        tables = ctx.page_tables
        # The indexer: raw keys into blocks and the ring, then the selection.
        ix = m.indexer
        heads = [m.q_proj, m.k_proj, m.v_proj, ix.index_qk_proj]
        q_all, k_all, v_all, qk = invariant_project(x, self.in_proj).split(
            [h.out_features for h in heads], dim=-1
        )
        iq, raw = torch.split(qk, [g.index_heads * g.index_dim, g.index_dim], dim=-1)
        iq = self._rope(ix.q_layernorm(iq.reshape(tokens, g.index_heads, g.index_dim)), cos, sin)
        ring = ctx.read("qsa_ring")
        tags = ctx.read("qsa_tags")
        selector.write_blocks(
            ctx.selectors,
            0,
            ring,
            tags,
            raw.reshape(rows, per_row, g.index_dim),
            ctx.start,
            ctx.n_valid,
            tables,
            self.selection,
            ix.k_layernorm,
            lambda key, c, s: self._rope(key.unsqueeze(-2), c, s).squeeze(-2),
            ctx.rotary.lookup,
        )
        ctx.write("qsa_ring", ring)
        ctx.write("qsa_tags", tags)
        positions = ctx.positions.reshape(-1)
        valid = ctx.valid.reshape(-1)
        scores = selector.block_scores(
            iq,
            ctx.selectors[0],
            tables,
            per_row,
            positions,
            valid,
            g.ratio,
        )
        blocks = selector.select_blocks(scores, positions, valid, self.selection)
        # Gated attention over the selected tokens of the pages it writes first.
        query, gate = torch.chunk(q_all.view(tokens, g.heads, 2 * g.head_dim), 2, dim=-1)
        gate = gate.reshape(tokens, -1)
        query = m.q_norm(query)
        key = m.k_norm(k_all.reshape(tokens, g.kv_heads, g.head_dim))
        value = v_all.reshape(tokens, g.kv_heads, g.head_dim)
        query, key = self.apply_rotary(query, key, cos, sin, unsqueeze_dim=1)
        write_kv(ctx.kv, 0, ctx.step.rows, key, value)
        kv = ctx.kv[0]
        out = selector.selected_attention(
            query, kv, tables, per_row, blocks, positions, g.ratio, m.scaling
        )
        out = out.reshape(tokens, -1) * torch.sigmoid(gate)
        return self.collectives.all_reduce(m.o_proj(out).unsqueeze(0)), None


def route(router: nn.Module, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The canonical top-k router's forward (``Qwen4ExpTextTopKRouter``: softmax,
    top-k, renormalized) from its projection's ``logits`` (computed with the MoE
    block's merged input projections): its routing weights and experts."""
    probs = F.softmax(logits, dtype=torch.float, dim=-1)
    top, experts = torch.topk(probs, router.top_k, dim=-1)
    if router.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), experts


class PreparedMoe(nn.Module):
    """The canonical MoE block (router, routed experts, shared expert and its sigmoid
    gate) with the shared expert's three input projections and the router's as one
    GEMM."""

    def __init__(
        self,
        module: nn.Module,
        shared_in: torch.Tensor,
        collectives: Collectives = ONE_RANK.collectives,
    ) -> None:
        """``shared_in``: the merged projections (``MERGED``), whose row views are
        the canonical ``shared_expert.gate_proj``, ``up_proj``,
        ``shared_expert_gate`` and router (``gate``) weights. ``collectives`` sums a
        rank's part (its rows of every expert's intermediate, routed and shared; the
        router and the shared gate are whole on every rank) with the other ranks'."""
        super().__init__()
        self.canonical = module
        self.shared_in = nn.Parameter(shared_in, requires_grad=False)
        self.collectives = collectives

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        m = self.canonical
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        inter = m.shared_expert.intermediate_size
        gate, up, shared_gate, logits = invariant_project(x, self.shared_in).split(
            [inter, inter, 1, m.gate.num_experts], dim=-1
        )
        shared = m.shared_expert.down_proj(m.shared_expert.act_fn(gate) * up)
        routing_weights, selected_experts = route(m.gate, logits)
        routed = m.experts(x, selected_experts, routing_weights)
        return self.collectives.all_reduce(
            (routed + torch.sigmoid(shared_gate) * shared).reshape(shape)
        )


class PreparedGatedResidual(nn.Module):
    """A decoder layer's canonical hyperconnection (the mix into the block's input
    and the injection weights) with its two projections of the normed streams as
    one GEMM."""

    def __init__(self, module: nn.Module, mix_in: torch.Tensor) -> None:
        """``mix_in``: the merged projections (``MERGED``), whose row views are the
        canonical ``input_mix_weight_down`` and ``block_inject_weight`` weights."""
        super().__init__()
        self.canonical = module
        self.mix_in = nn.Parameter(mix_in, requires_grad=False)

    def forward(self, hyper_input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.canonical
        streams = (m.hc_count, m.hidden_size)
        normed = m.hc_norm(hyper_input)
        rank = m.input_mix_weight_down.out_features
        down, inject = invariant_project(normed, self.mix_in).split([rank, m.hc_count], dim=-1)
        mix = torch.sigmoid(m.input_mix_weight_up(F.silu(down / m.hc_count)))
        mixed = (mix.unflatten(-1, streams) * normed.unflatten(-1, streams)).mean(dim=-2)
        return mixed, hyper_input, 2 * torch.sigmoid(inject / m.hc_count)


def _invariant_norm(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``Qwen4ExpTextRMSNorm._norm`` with each row's mean square from
    ``flare::row_sum``: the same formula, rounded in an order that does not follow
    the batch."""
    group = self.group_size
    if group is not None:
        x = x.reshape(*x.shape[:-1], -1, group)
    out = x * torch.rsqrt(mean_square(x) + self.eps)
    return out.flatten(-2) if group is not None else out


def _invariant_gated_norm(
    self: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """``Qwen4ExpTextRMSNormGated.forward`` (GDN's output norm) with each row's mean
    square from ``flare::row_sum``."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    hidden_states = hidden_states * torch.rsqrt(mean_square(hidden_states) + self.variance_epsilon)
    hidden_states = self.weight * hidden_states.to(input_dtype)
    hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))
    return hidden_states.to(input_dtype)


@functools.cache
def _prepared_norm_classes() -> dict[type[nn.Module], type[nn.Module]]:
    """Each canonical RMSNorm class, and its prepared subclass (its weight, names and
    the rest of its forward canonical) whose mean squares are ``flare::row_sum``'s."""
    m = canonical()
    return {
        m.Qwen4ExpTextRMSNorm: type(
            "PreparedRmsNorm", (m.Qwen4ExpTextRMSNorm,), {"_norm": _invariant_norm}
        ),
        m.Qwen4ExpTextRMSNormGated: type(
            "PreparedRmsNormGated",
            (m.Qwen4ExpTextRMSNormGated,),
            {"forward": _invariant_gated_norm},
        ),
    }


def invariant_norms(root: nn.Module) -> int:
    """Makes every canonical RMSNorm under ``root`` (the hyperconnections', PLE's,
    GDN's output norm, the query, key and indexer norms) its prepared class, in
    place; how many. The
    canonical ``x.pow(2).mean(-1)`` takes its CUDA reduction strategy from the row
    count: at the H200 geometry one request's mean squares differed in the last bits
    between capacity-1 and capacity-4 decode steps, and the served corpus sampled
    other tokens at concurrency 1 than the harness at 4."""
    prepared = _prepared_norm_classes()
    count = 0
    for module in root.modules():
        if type(module) in prepared:
            module.__class__ = prepared[type(module)]
            count += 1
    return count


class PreparedExperts(nn.Module):
    """The canonical routed experts; up to ``FUSED_MAX_TOKENS`` tokens (a decode
    step's) through ``flare::routed_experts`` instead, which rounds as the canonical
    ``grouped_mm`` path does."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.canonical = module

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        m = self.canonical
        if hidden_states.shape[0] > FUSED_MAX_TOKENS:
            return m(hidden_states, top_k_index, top_k_weights)
        return routed_experts(
            hidden_states, m.gate_up_proj, m.down_proj, top_k_index, top_k_weights
        )


class PreparedPle(nn.Module):
    """The canonical PLE layer over the continuation row's token and convolution
    histories."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.canonical = module

    def forward(
        self,
        hidden_states: torch.Tensor,
        input_ids: torch.Tensor,
        past_key_values: StepContext,
        conv_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        m, ctx = self.canonical, past_key_values
        tokens = hidden_states.shape[1]
        rows, per_row = ctx.rows, tokens // ctx.rows
        history = ctx.read("ple_tokens")
        embeddings = ngram_embeddings(m.ple_embedding, input_ids.reshape(rows, per_row), history)
        ext = torch.cat([history, input_ids.reshape(rows, per_row).long()], dim=-1)
        context = history.shape[-1]
        keep = ctx.n_valid.view(-1, 1) + torch.arange(context, device=ext.device)
        ctx.write("ple_tokens", ext.gather(1, keep))
        embeddings = embeddings.reshape(1, tokens, -1)
        key = m.norm_key(m.key_proj(embeddings)).unflatten(-1, (m.hc_count, m.hidden_size))
        value = m.value_proj(embeddings)
        query = m.norm_query(hidden_states).unflatten(-1, (m.hc_count, m.hidden_size))
        gate = last_sum(key * query) / math.sqrt(m.hidden_size)
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gated = torch.sigmoid(gate) * value.unsqueeze(-2)
        normed = m.norm_conv(gated.flatten(-2))
        gated = gated.flatten(-2)
        # The dilated convolution over the history and these rows' inputs.
        conv_history = ctx.read("ple_conv")  # [rows, channels, history]
        inputs = normed[0].reshape(rows, per_row, -1).transpose(1, 2)
        ext = torch.cat([conv_history, inputs.to(conv_history.dtype)], dim=-1)
        weight = m.conv1d.weight
        if ctx.decode:  # a sum of taps: a row's output does not depend on the batch
            conv = causal_taps(ext.to(weight.dtype), weight.squeeze(1), m.conv1d.dilation[0])
        else:
            conv = m.conv1d(ext.to(weight.dtype))
        conv = F.silu(conv)  # [rows, channels, per_row]
        span = conv_history.shape[-1]
        keep = ctx.n_valid.view(-1, 1) + torch.arange(span, device=ext.device)
        ctx.write("ple_conv", ext.gather(2, keep.unsqueeze(1).expand(-1, ext.shape[1], -1)))
        conv = conv.transpose(1, 2).reshape(1, tokens, -1).to(gated.dtype)
        return gated + conv


def ngram_ids(module: nn.Module, tokens: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """The PLE table rows ``[rows, tokens, ngram heads]`` of ``tokens [rows, tokens]``
    after each row's last ``history [rows, context]`` tokens: the canonical hash
    (``Qwen4ExpTextNGramEmbedding``: splitmix64 multipliers, per-head primes, EOS
    segment resets) over the same concatenated history its cached forward builds.
    The ids are the boundary where host-delivered table rows (the real 95 GiB table)
    will replace the lookup."""
    token_history = torch.cat([history, tokens.long()], dim=-1)
    shifted = [module._shift_right_ignore_eos(token_history, s) for s in range(module.ngram_size)]
    blocks = []
    for ngram in range(2, module.ngram_size + 1):
        lo = (ngram - 2) * module.heads_per_ngram
        hi = lo + module.heads_per_ngram
        mixed = shifted[0] * module.layer_multipliers[0]
        for position in range(1, ngram):
            mixed = torch.bitwise_xor(mixed, shifted[position] * module.layer_multipliers[position])
        sizes = module.ngram_heads_vocab_sizes[lo:hi]
        offsets = module.ngram_heads_offsets[lo:hi]
        blocks.append(
            torch.remainder(mixed.unsqueeze(-1), sizes.view(1, 1, -1)) + offsets.view(1, 1, -1)
        )
    return torch.cat(blocks, dim=-1)[:, -tokens.shape[1] :]


def ngram_embeddings(
    module: nn.Module, tokens: torch.Tensor, history: torch.Tensor
) -> torch.Tensor:
    """The n-gram embeddings ``[rows, tokens, ple_embed_dim]``: the table resident on
    the GPU, looked up at ``ngram_ids``."""
    return module.ngram_embedding(ngram_ids(module, tokens, history)).flatten(-2)


def place_ngram_constants(ple: nn.Module, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Computes a canonical n-gram embedding module's hash constants
    (``NGRAM_CONSTANTS``) from its configuration on ``device``, as its constructor
    does, sets them on it and returns them by name (a model built on the meta device
    has none)."""
    ple.layer_multipliers = (
        canonical()
        ._build_layer_multipliers(
            ple.unigram_vocab_size, ple.ngram_size, ple.ple_layer_index, ple.seed
        )
        .to(device)
    )
    ple.ngram_heads_vocab_sizes = torch.tensor(
        ple.head_vocab_sizes, dtype=torch.long, device=device
    )
    ple.ngram_heads_offsets = torch.tensor(ple.head_offsets, dtype=torch.long, device=device)
    return {name: getattr(ple, name) for name in NGRAM_CONSTANTS}


def checkpoint_views(
    name: str, tensor: torch.Tensor, config: PretrainedConfig
) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint tensors that make up parameter ``name`` and where each goes, as
    Transformers' conversion for ``qwen4_exp_text`` reads them: each expert's
    ``gate_proj``/``up_proj``/``down_proj`` into its rows of the fused expert weights,
    and the PLE table's ``shard_k`` into the k-th of ``split_ngram_parts`` chunks
    (``torch.chunk``, as saving splits it)."""
    if name.endswith(".mlp.experts.gate_up_proj"):
        base, half = name.removesuffix("gate_up_proj"), tensor.shape[1] // 2
        return [
            view
            for e in range(tensor.shape[0])
            for view in (
                (f"{base}{e}.gate_proj.weight", tensor[e, :half]),
                (f"{base}{e}.up_proj.weight", tensor[e, half:]),
            )
        ]
    if name.endswith(".mlp.experts.down_proj"):
        base = name.removesuffix("down_proj")
        return [(f"{base}{e}.down_proj.weight", tensor[e]) for e in range(tensor.shape[0])]
    if name.endswith(".ngram_embedding.weight"):
        base = name.removesuffix("weight")
        chunks = torch.chunk(tensor, config.split_ngram_parts, dim=0)
        return [(f"{base}shard_{k}.weight", chunk) for k, chunk in enumerate(chunks)]
    return [(name, tensor)]


class HybridModel:
    """The prepared hybrid text model: canonical modules over execution storage."""

    # Its decoder layers' residuals are hyperconnection injections: nothing to fuse.
    decode_fusion: DecodeFusion = "none"

    def __init__(
        self,
        config: PretrainedConfig,
        cache: PagedKvCache,
        continuation: ContinuationRows,
        dtype: torch.dtype,
        device: torch.device,
        positions: int | None = None,
        parallel: TensorParallel = ONE_RANK,
    ) -> None:
        """``cache``: the QSA layers' pages (``layout``), whose tensors preparation
        allocates after the weights; ``continuation``: the rows of ``row_fields``;
        ``parallel``: the rank whose shards (``shards``) this model holds."""
        validate_config(config)
        self.config = config
        self.parallel = parallel
        self.geometry = HybridGeometry.from_config(config)
        g = self.geometry.local(parallel)
        shard = shards(config, parallel)
        collectives = parallel.collectives
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                local_config(config, parallel), dtype=dtype, experts_implementation="grouped_mm"
            )
        model.eval()
        self.mapping = WeightMapping()
        self.weights: dict[str, torch.Tensor] = {}
        parameters = dict(model.named_parameters())
        views: dict[str, torch.Tensor] = {}
        self.merged: list[dict[str, torch.Tensor]] = [{} for _ in range(g.layers)]
        for i in range(g.layers):
            for merged, members in MERGED.items():
                names = [f"model.layers.{i}.{member}.weight" for member in members]
                if not all(name in parameters for name in names):
                    continue
                rows = [parameters[name].shape[0] for name in names]
                columns = parameters[names[0]].shape[1]
                whole = torch.empty(sum(rows), columns, dtype=dtype, device=device)
                views.update(zip(names, whole.split(rows), strict=True))
                self.merged[i][merged] = whole
                self.weights[f"model.layers.{i}.{merged}.weight"] = whole
        for name, param in parameters.items():
            real = views.get(name)
            if real is None:
                shape = tuple(param.shape)
                if name == "lm_head.weight" and (vocab := shard(name)) is not None:
                    shape = vocab.shape(shape)  # the local config keeps the whole vocabulary
                real = torch.empty(shape, dtype=dtype, device=device)
                self.weights[name] = real
            set_parameter(model, name, real)
            for stored, target in checkpoint_views(name, real, config):
                self.mapping.place(stored, target, shard(stored))
        for name, _ in model.named_buffers():
            if name.rsplit(".", 1)[-1] in NGRAM_CONSTANTS:
                self.mapping.ignore(name, "an n-gram hash constant, derived from the config")
        if config.tie_word_embeddings:
            embeddings = model.model.embed_tokens.weight
            if (vocab := shard("lm_head.weight")) is not None:
                # This rank's vocabulary rows of the embeddings (replicated whole).
                set_parameter(model, "lm_head.weight", vocab.view(embeddings.data))
            else:
                model.lm_head.weight = embeddings
            self.mapping.ignore(
                "lm_head.weight", "tied to model.embed_tokens.weight (tie_word_embeddings)"
            )
        # Derived buffers (the n-gram hash constants, rotary frequencies): recomputed
        # from the configuration, never loaded.
        for layer_index in g.ple_layers:
            ple = model.model.layers[layer_index].ple.ple_embedding
            # The derived tables are read-only tensors the forwards read.
            prefix = f"model.layers.{layer_index}.ple.ple_embedding"
            for name, table in place_ngram_constants(ple, device).items():
                self.weights[f"{prefix}.{name}"] = table
        for i, layer in enumerate(model.model.layers):
            if i in g.linear_layers:
                in_proj = self.merged[i]["linear_attn.in_proj"]
                layer.linear_attn = PreparedGatedDeltaNet(layer.linear_attn, in_proj, collectives)
            else:
                in_proj = self.merged[i]["self_attn.in_proj"]
                layer.self_attn = PreparedSparseAttention(layer.self_attn, g, in_proj, collectives)
            if i in g.ple_layers:
                layer.ple = PreparedPle(layer.ple)
            layer.mlp.experts = PreparedExperts(layer.mlp.experts)
            layer.mlp = PreparedMoe(layer.mlp, self.merged[i]["mlp.shared_in"], collectives)
            for site in ("attn", "mlp"):
                name = f"{site}_hyper_connection"
                mix_in = self.merged[i][f"{name}.mix_in"]
                setattr(layer, name, PreparedGatedResidual(getattr(layer, name), mix_in))
        # Every other projection (GDN's and QSA's output projections, the shared
        # expert's down projection, the hyperconnections' mix-up projections and the
        # final mixer's, PLE's): batch-invariant for decode rows.
        project_linears(model)
        invariant_norms(model)
        self.entries = [g.layer_entries(i) for i in range(g.layers)]
        # Interleaved mRoPE takes three position rows, equal for text.
        self.rotary = place_rotary(
            model, config, self.weights, positions, dtype, device, position_rows=3
        )
        check_placed(model, device)
        self.model = model
        self.cache = cache
        self.continuation = continuation

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def forward_tokens(
        self, tokens: torch.Tensor, positions: torch.Tensor, step: AttentionStep
    ) -> torch.Tensor:
        """Final hidden vectors [tokens, hidden] (the last hyperconnection mixer's
        output) of packed ``tokens``, consuming them into the rows ``step.slots``."""
        ctx = StepContext.of(step, positions, self.cache, self.continuation, self.rotary)
        text = self.model.model
        h = text.embed_tokens(tokens).unsqueeze(0).repeat(1, 1, self.config.hc_count)
        for layer, entries in zip(text.layers, self.entries, strict=True):
            h = layer(
                h,
                position_embeddings=ctx.cos_sin,
                attention_mask=None,
                conv_mask=None,
                past_key_values=ctx.at(entries),
                ple_input_ids=tokens.unsqueeze(0),
            )
        return text.hyper_connection_mixer(h)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits of final hidden vectors (each rank projects its
        vocabulary rows; the shards are gathered in rank order)."""
        logits = self.model.lm_head(hidden).float()  # a ProjectedLinear
        return self.parallel.collectives.all_gather_last(logits)

    def compile_layers(self, **options: object) -> None:
        """Regional compilation: each decoder layer as its own compiled region
        (``torch.compile`` ``options``). A layer reads its state through its own
        context (``StepContext.at``), so one compilation per shape serves every layer
        of a kind (GDN, GDN with PLE, QSA): compile time no longer grows with depth.
        The embedding, the final mixer and the vocabulary head run as they are."""
        for layer in self.model.model.layers:
            layer.compile(**options)


class Qwen4ExpRecipe:
    """The ``recipes.interface.Recipe`` of the hybrid ``qwen4_exp`` text model."""

    name = NAME
    architectures = ARCHITECTURES
    multimodal_architectures = MULTIMODAL_ARCHITECTURES
    model_types = MODEL_TYPES
    page_size = PAGE_SIZE

    def validate_config(self, config: PretrainedConfig) -> None:
        validate_config(config)

    def layout(
        self, config: PretrainedConfig, dtype: torch.dtype, parallel: TensorParallel = ONE_RANK
    ) -> StateLayout:
        g = HybridGeometry.from_config(config).local(parallel)
        eos = config.eos_token_id
        eos = eos[0] if isinstance(eos, list) else eos
        return StateLayout(
            vocab=g.vocab,
            hidden=g.hidden,
            kv_layers=len(g.sparse_layers),
            kv_heads=g.kv_heads,
            head_dim=g.head_dim,
            paged=(
                PagedField(
                    SELECTORS, len(g.sparse_layers), (PAGE_SIZE // g.ratio, g.index_dim), dtype
                ),
            ),
            rows=g.row_fields(dtype, int(eos)),
        )

    def build(
        self,
        config: PretrainedConfig,
        cache: PagedKvCache,
        rows: ContinuationRows,
        dtype: torch.dtype,
        device: torch.device,
        positions: int,
        decode_fusion: DecodeFusion,
        parallel: TensorParallel = ONE_RANK,
    ) -> HybridModel:
        """``decode_fusion`` does not apply: the decoder layer's residuals are
        hyperconnection injections, with no projection epilogue to fuse them into."""
        return HybridModel(config, cache, rows, dtype, device, positions, parallel)

    def sampling_defaults(self, fingerprint: str) -> SamplingDefaults:
        return SamplingDefaults()


RECIPE = Qwen4ExpRecipe()
