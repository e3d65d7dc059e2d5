"""GGUF checkpoints of the Llama family, read one tensor at a time.

The file is memory-mapped by ``gguf.GGUFReader``; ``load`` dequantizes exactly one
tensor and hands it back as a float32 CPU tensor in the canonical Transformers
layout (PyTorch shape order, Q/K rows in Transformers' rotary layout), so that the
same recipe serves GGUF and safetensors checkpoints.

Supported architectures (``general.architecture``): ``llama`` (which includes the
Mistral and SmolLM files llama.cpp writes under that name) and ``qwen3``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize
from transformers import AutoConfig, PretrainedConfig

from ignition.loading.source import CheckpointError, TensorInfo

# Tensors outside the transformer blocks. ``output.weight`` is absent when the
# embeddings are tied; the recipe then ties ``lm_head`` from the config.
_GLOBAL_NAMES: Final[dict[str, str]] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Tensors of block N, ``blk.N.<key>`` -> ``model.layers.N.<value>``. Biases and
# llama.cpp-only tensors (``rope_freqs``, ...) are deliberately absent: the
# Transformers config built from the same file would not declare them, so
# accepting them would load a model that silently differs from the file.
_LLAMA_BLOCK_NAMES: Final[dict[str, str]] = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# Qwen3 is Llama plus per-head RMS norms on queries and keys.
_QWEN3_BLOCK_NAMES: Final[dict[str, str]] = {
    **_LLAMA_BLOCK_NAMES,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(.+)")


@dataclass(frozen=True)
class _Architecture:
    block_names: dict[str, str]
    # llama.cpp's ``LlamaModel`` converter permutes the rows of Q and K so that
    # GGML's interleaved rotary embedding applies; its Qwen converters do not
    # (and neither does Transformers' reader for qwen3).
    rope_permuted: bool


_ARCHITECTURES: Final[dict[str, _Architecture]] = {
    "llama": _Architecture(_LLAMA_BLOCK_NAMES, rope_permuted=True),
    "qwen3": _Architecture(_QWEN3_BLOCK_NAMES, rope_permuted=False),
}

# ``gguf.quants.dequantize`` yields float32 for every type it supports.
_LOAD_DTYPE: Final[torch.dtype] = torch.float32


@dataclass(frozen=True)
class _Entry:
    tensor: ReaderTensor
    info: TensorInfo
    # Head count the rows were permuted with by llama.cpp, or None when unpermuted.
    permuted_heads: int | None


def _reverse_rope_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``LlamaModel.permute`` on a Q or K projection.

    llama.cpp writes, per head, the rows ``[0, d/2, 1, d/2+1, ...]`` of the
    Transformers layout (``reshape(n_head, 2, d/2, ...).swapaxes(1, 2)``); this
    is the inverse, identical to ``LlamaTensorProcessor._reverse_permute_weights``
    in ``transformers.modeling_gguf_pytorch_utils``.
    """
    half_head_dim = weights.shape[0] // n_head // 2
    heads = weights.reshape(n_head, half_head_dim, 2, *weights.shape[1:])
    return heads.swapaxes(1, 2).reshape(weights.shape)


class GgufCheckpoint:
    """A GGUF file of the Llama family as a ``CheckpointSource``.

    Construction parses the header and tensor table (no tensor data is read) and
    raises ``CheckpointError`` for an unsupported architecture or any tensor name
    outside the mapping tables, so a file is rejected before any loading starts.
    """

    path: Path

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._reader = GGUFReader(self.path)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{self.path}: not a readable GGUF file ({error})") from error

        architecture = self._string_field("general.architecture")
        arch = _ARCHITECTURES.get(architecture)
        if arch is None:
            supported = ", ".join(sorted(_ARCHITECTURES))
            raise CheckpointError(
                f"{self.path}: GGUF architecture {architecture!r} is not supported "
                f"(supported: {supported})"
            )
        block_count = self._int_field(f"{architecture}.block_count")
        n_head = self._int_field(f"{architecture}.attention.head_count")
        # llama.cpp's own default when the key is absent (multi-head attention).
        n_head_kv = self._int_field(f"{architecture}.attention.head_count_kv", default=n_head)

        self._entries: dict[str, _Entry] = {}
        for tensor in self._reader.tensors:
            canonical, block_key = self._canonical_name(tensor.name, arch, block_count)
            permuted_heads: int | None = None
            if arch.rope_permuted and block_key == "attn_q.weight":
                permuted_heads = n_head
            elif arch.rope_permuted and block_key == "attn_k.weight":
                permuted_heads = n_head_kv
            # GGUF stores dimensions in ggml order (fastest-varying first).
            shape = tuple(int(dim) for dim in reversed(tensor.shape.tolist()))
            if permuted_heads is not None and shape[0] % (2 * permuted_heads) != 0:
                raise CheckpointError(
                    f"{self.path}: tensor {tensor.name!r} has {shape[0]} rows, "
                    f"not a multiple of 2 x {permuted_heads} heads"
                )
            info = TensorInfo(name=canonical, shape=shape, dtype=_LOAD_DTYPE)
            self._entries[canonical] = _Entry(tensor, info, permuted_heads)

    def config(self) -> PretrainedConfig:
        """The Transformers config parsed from the GGUF metadata (re-reads the file)."""
        return AutoConfig.from_pretrained(self.path.parent, gguf_file=self.path.name)

    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor by canonical name; shapes in PyTorch order, dtype as ``load`` returns."""
        return {name: entry.info for name, entry in self._entries.items()}

    def load(self, name: str) -> torch.Tensor:
        """Dequantize one tensor to a float32 CPU tensor in the Transformers layout."""
        entry = self._entries.get(name)
        if entry is None:
            raise CheckpointError(f"{self.path}: no tensor named {name!r}")
        tensor = entry.tensor
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as error:
            raise CheckpointError(
                f"{self.path}: tensor {tensor.name!r} is stored as "
                f"{tensor.tensor_type.name}, which gguf cannot dequantize"
            ) from error
        if weights.shape != entry.info.shape:
            raise CheckpointError(
                f"{self.path}: tensor {tensor.name!r} dequantized to shape "
                f"{weights.shape}, expected {entry.info.shape}"
            )
        if entry.permuted_heads is not None:
            weights = _reverse_rope_permute(weights, entry.permuted_heads)
        # An F32 tensor dequantizes to a view of the read-only memory map; copy it
        # so that the result owns its storage and the caller may write to it.
        if np.may_share_memory(weights, self._reader.data):
            weights = weights.copy()
        weights = np.ascontiguousarray(weights, dtype=np.float32)
        return torch.from_numpy(weights)

    def tokenizer_source(self) -> tuple[Path, dict[str, str]]:
        return self.path.parent, {"gguf_file": self.path.name}

    def fingerprint(self) -> str:
        """sha256 of every byte before the tensor data: the GGUF header (magic,
        version, counts), all metadata key/values (architecture, hyperparameters,
        tokenizer, chat template), the tensor-info table (each tensor's name,
        shape, ggml type and data offset) and the alignment padding after it.

        Tensor data is not hashed, so that fingerprinting costs ~2 MB of reading
        rather than the whole file; two files that differ only in weight values,
        with identical metadata and layout, therefore share a fingerprint.
        """
        header = self._reader.data[: self._reader.data_offset]
        return hashlib.sha256(memoryview(header)).hexdigest()

    def _canonical_name(
        self, gguf_name: str, arch: _Architecture, block_count: int
    ) -> tuple[str, str | None]:
        """The canonical name of a GGUF tensor, and its key within a block (or None)."""
        if gguf_name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[gguf_name], None
        match = _BLOCK_NAME.fullmatch(gguf_name)
        if match is not None and match.group(2) in arch.block_names:
            block = int(match.group(1))
            if block >= block_count:
                raise CheckpointError(
                    f"{self.path}: tensor {gguf_name!r} belongs to block {block}, "
                    f"but the file declares {block_count} blocks"
                )
            block_key = match.group(2)
            return f"model.layers.{block}.{arch.block_names[block_key]}", block_key
        raise CheckpointError(
            f"{self.path}: unknown GGUF tensor {gguf_name!r}: it has no canonical "
            "Transformers name in the Llama-family mapping"
        )

    def _string_field(self, key: str) -> str:
        field = self._reader.get_field(key)
        if field is None:
            raise CheckpointError(f"{self.path}: GGUF metadata lacks {key!r}")
        value = field.contents()
        if not isinstance(value, str):
            raise CheckpointError(f"{self.path}: GGUF metadata {key!r} is not a string")
        return value

    def _int_field(self, key: str, default: int | None = None) -> int:
        field = self._reader.get_field(key)
        if field is None:
            if default is None:
                raise CheckpointError(f"{self.path}: GGUF metadata lacks {key!r}")
            return default
        value = field.contents()
        # Per-layer arrays (e.g. head counts varying by layer) are not Llama-shaped.
        if not isinstance(value, int) or isinstance(value, bool):
            raise CheckpointError(f"{self.path}: GGUF metadata {key!r} is not an integer")
        return value
