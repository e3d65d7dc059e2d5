"""The checkpoint-source protocol: what every checkpoint format offers the loader.

A source names its tensors in the canonical Transformers naming of the model it
holds (``model.layers.0.self_attn.q_proj.weight``), so that one recipe mapping
serves every format. Tensors are read one at a time: the loader never holds a
second full copy of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import PretrainedConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file or tensor."""


@dataclass(frozen=True)
class TensorInfo:
    """Shape and stored dtype of one checkpoint tensor, read without loading it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class CheckpointSource(Protocol):
    """One checkpoint, readable tensor by tensor in canonical Transformers names."""

    path: Path

    def config(self) -> PretrainedConfig:
        """The model configuration (structural data only, never sampling policy)."""
        ...

    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor the checkpoint stores, by canonical name."""
        ...

    def load(self, name: str) -> torch.Tensor:
        """One tensor on the CPU, dequantized where the format stores it quantized.

        The returned tensor owns only its own storage: the caller may release it
        as soon as it has been copied into its execution layout.
        """
        ...

    def tokenizer_source(self) -> tuple[Path, dict[str, str]]:
        """Where ``AutoTokenizer.from_pretrained`` finds the tokenizer: a directory
        and the keyword arguments it needs (``gguf_file`` for a GGUF file)."""
        ...

    def fingerprint(self) -> str:
        """A content fingerprint of the checkpoint (sha256 over its file headers)."""
        ...
