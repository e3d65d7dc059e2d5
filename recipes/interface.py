"""What a recipe gives preparation: the one interface every model family implements.

Preparation, the exporter, the manifest writer and the replay harness never import a
recipe by name: ``recipes.registry.recipe_for`` picks one by the checkpoint config's
``architectures`` (or, for configs that carry none, such as GGUF's, its
``model_type``; a multimodal checkpoint whose text model a recipe serves is read as
that text model's checkpoint), and everything after reads it through ``Recipe``:

- ``validate_config`` refuses what the recipe's forwards do not implement, naming
  the field;
- ``layout`` is the per-request storage the recipe's model reads and writes (the KV
  page geometry, the saved hidden vector, the vocabulary), from which preparation
  sizes request state, pages and snapshot rows;
- ``page_size`` is the KV page (and the catalog's granularity);
- ``build`` composes the canonical Transformers model (on one rank of a
  tensor-parallel group, its shard) with the recipe's replaced modules over
  execution-layout storage (the pages, whose tensors preparation allocates after the
  weights, and the continuation rows), and declares where each checkpoint tensor
  goes (``TextModel.mapping``, GGUF names already translated by the loader);
- ``sampling_defaults`` are the model card's defaults of a verified checkpoint,
  recognized by content, and the recipe's ranges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PretrainedConfig

from ignition.components.continuation import ContinuationRows, RowField
from ignition.components.kv_cache import AttentionStep, PagedField, PagedKvCache
from ignition.loading.mapping import WeightMapping
from ignition.parallel.shard import ONE_RANK, TensorParallel
from ignition.preparation.compile_flags import DecodeFusion


@dataclass(frozen=True)
class SamplingDefaults:
    """Typed defaults and inclusive ranges, resolved into a request's parameters by
    ``ignition.replay.sampling_policy`` (and by Helios, from the manifest): a requested
    value clamps into its parameter's range; a parameter absent from ``ranges`` is
    fixed at its default."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ranges: tuple[tuple[str, float, float], ...] = (
        ("temperature", 0.01, 2.0),
        ("top_k", 0, 1 << 30),
        ("top_p", 0.01, 1.0),
        ("min_p", 0.0, 1.0),
        ("repetition_penalty", 0.5, 2.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
    )


@dataclass(frozen=True)
class StateLayout:
    """The per-request storage a recipe's model uses: ``kv_layers`` layers of paged
    K/V, each ``kv_heads`` heads of ``head_dim`` per token; further paged tensors
    (``paged``, addressed by the same pages); continuation rows (``rows``: state
    that is not paged, one row per request slot and per checkpoint); a saved hidden
    vector of ``hidden`` (the resume input); logits over ``vocab`` tokens."""

    vocab: int
    hidden: int
    kv_layers: int
    kv_heads: int
    head_dim: int
    paged: tuple[PagedField, ...] = ()
    rows: tuple[RowField, ...] = ()


class TextGeometry(Protocol):
    """What callers read of a prepared model's geometry."""

    @property
    def vocab(self) -> int: ...

    @property
    def hidden(self) -> int: ...

    @property
    def layers(self) -> int: ...


class TextModel(Protocol):
    """A recipe's prepared model over execution-layout storage."""

    @property
    def config(self) -> PretrainedConfig: ...

    @property
    def geometry(self) -> TextGeometry: ...

    @property
    def decode_fusion(self) -> DecodeFusion:
        """What its decode layers fuse into their projections, "auto" resolved ("none"
        where the recipe fuses nothing)."""
        ...

    @property
    def mapping(self) -> WeightMapping:
        """Where each checkpoint tensor is loaded."""
        ...

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """Every read-only tensor the forwards read, by manifest name."""
        ...

    def weight_bytes(self) -> int: ...

    def forward_tokens(
        self, tokens: torch.Tensor, positions: torch.Tensor, step: AttentionStep
    ) -> torch.Tensor:
        """Final hidden states [tokens, hidden] of packed ``tokens``."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 vocabulary logits of final hidden vectors."""
        ...

    def compile_layers(self, **options: object) -> None:
        """Regional compilation (``--compile-scope layer``)."""
        ...


class Recipe(Protocol):
    """A model family's preparation ([module docs](recipes.interface))."""

    @property
    def name(self) -> str: ...

    @property
    def architectures(self) -> tuple[str, ...]: ...

    @property
    def multimodal_architectures(self) -> tuple[str, ...]:
        """Multimodal checkpoints whose text model the recipe serves, read through
        ``ignition.loading.text_model`` (their vision tower is not loaded)."""
        ...

    @property
    def model_types(self) -> tuple[str, ...]: ...

    @property
    def page_size(self) -> int: ...

    def validate_config(self, config: PretrainedConfig) -> None: ...

    def layout(
        self, config: PretrainedConfig, dtype: torch.dtype, parallel: TensorParallel = ONE_RANK
    ) -> StateLayout:
        """The storage of ``config`` at the execution ``dtype``, on one rank of
        ``parallel`` (its KV heads)."""
        ...

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
    ) -> TextModel:
        """The model's shard on one rank of ``parallel``; a recipe not sharded for
        tensor parallelism refuses a group of more than one."""
        ...

    def sampling_defaults(self, fingerprint: str) -> SamplingDefaults: ...
