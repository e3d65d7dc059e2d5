"""The text model of a multimodal checkpoint, read as that text model's own checkpoint.

Transformers' ``*ForConditionalGeneration`` checkpoints hold a vision tower beside
the language model: the config nests the text model's as ``text_config``, and the
tensors are ``model.language_model.*`` (the text model's ``model.*``), ``lm_head.*``
and the tower's (``model.visual.*``). A recipe that serves the text model of such a
checkpoint (``Recipe.multimodal_architectures``) reads it through
``TextModelCheckpoint``: the text config, the text tensors under their canonical
names, and the tower's tensors left out, named in ``left_out``. Any other tensor
keeps its name, so the recipe's mapping refuses it as it would in a text checkpoint.
Serving images is not built: the tower is never loaded.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PretrainedConfig

from ignition.loading.source import CheckpointError, CheckpointSource, TensorInfo

LANGUAGE_MODEL = "model.language_model."
TOWER = "model.visual."
LEFT_OUT = "the vision tower (not served)"


def canonical_name(stored: str) -> str | None:
    """The text model's name of a stored tensor, ``None`` for the tower's; any other
    name stays as it is."""
    if stored.startswith(LANGUAGE_MODEL):
        return "model." + stored[len(LANGUAGE_MODEL) :]
    if stored.startswith(TOWER):
        return None
    return stored


class TextModelCheckpoint:
    """``source``'s text model, as a ``CheckpointSource`` in its canonical names."""

    def __init__(self, source: CheckpointSource) -> None:
        self.path: Path = source.path
        self._source = source
        self._stored: dict[str, str] = {}
        self._infos: dict[str, TensorInfo] = {}
        self.left_out: dict[str, str] = {}
        for stored, info in source.tensors().items():
            name = canonical_name(stored)
            if name is None:
                self.left_out[stored] = LEFT_OUT
                continue
            self._stored[name] = stored
            self._infos[name] = replace(info, name=name)
        if not any(name.startswith("model.") for name in self._stored):
            raise CheckpointError(
                f"{self.path}: a multimodal checkpoint without {LANGUAGE_MODEL}* tensors "
                "(its text model is not where Transformers keeps it)"
            )

    def config(self) -> PretrainedConfig:
        """The text model's config. Whether the vocabulary head is tied to the
        embeddings is the whole model's setting (Transformers ties the multimodal
        model's ``lm_head`` by its own config), so it is carried over."""
        composite = self._source.config()
        text = getattr(composite, "text_config", None)
        if not isinstance(text, PretrainedConfig):
            raise CheckpointError(
                f"{self.path}: model_type {composite.model_type!r} has no text_config"
            )
        text = copy.deepcopy(text)
        text.tie_word_embeddings = bool(getattr(composite, "tie_word_embeddings", False))
        return text

    def tensors(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    def load(self, name: str) -> torch.Tensor:
        stored = self._stored.get(name)
        if stored is None:
            raise CheckpointError(f"{self.path}: the text model has no tensor named {name}")
        return self._source.load(stored)

    def tokenizer_source(self) -> tuple[Path, dict[str, str]]:
        return self._source.tokenizer_source()

    def fingerprint(self) -> str:
        return self._source.fingerprint()
