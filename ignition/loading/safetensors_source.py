"""Transformers checkpoint directories: ``config.json`` plus safetensors, single or sharded."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from ignition.loading.source import CheckpointError, TensorInfo

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def _read_header(path: Path) -> tuple[bytes, dict[str, dict[str, object]]]:
    """The raw JSON header of one safetensors file, without touching tensor data."""
    with path.open("rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
        (length,) = struct.unpack("<Q", raw_len)
        raw = fh.read(length)
    if len(raw) != length:
        raise CheckpointError(f"{path}: truncated safetensors header")
    header = json.loads(raw)
    header.pop("__metadata__", None)
    return raw, header


class SafetensorsCheckpoint:
    """A checkpoint directory, read one tensor at a time through ``safe_open``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: not a Transformers checkpoint (no config.json)")
        self._files = self._shard_files()
        self._where: dict[str, Path] = {}
        self._infos: dict[str, TensorInfo] = {}
        self._headers: list[bytes] = []
        for file in self._files:
            raw, header = _read_header(file)
            self._headers.append(raw)
            for name, entry in header.items():
                dtype = _DTYPES.get(str(entry["dtype"]))
                if dtype is None:
                    raise CheckpointError(
                        f"{file}: tensor {name} has unsupported dtype {entry['dtype']}"
                    )
                if name in self._where:
                    raise CheckpointError(f"{file}: tensor {name} is stored twice")
                shape = tuple(int(d) for d in entry["shape"])  # type: ignore[union-attr]
                self._where[name] = file
                self._infos[name] = TensorInfo(name, shape, dtype)

    def _shard_files(self) -> list[Path]:
        index = self.path / INDEX_FILE
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = sorted({self.path / shard for shard in weight_map.values()})
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{index}: shards missing: {', '.join(missing)}")
            return files
        single = self.path / SINGLE_FILE
        if single.is_file():
            return [single]
        raise CheckpointError(f"{self.path}: neither {INDEX_FILE} nor {SINGLE_FILE} found")

    def config(self) -> PretrainedConfig:
        return AutoConfig.from_pretrained(self.path)

    def tensors(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    def load(self, name: str) -> torch.Tensor:
        file = self._where.get(name)
        if file is None:
            raise CheckpointError(f"{self.path}: no tensor named {name}")
        with safe_open(str(file), framework="pt", device="cpu") as fh:
            return fh.get_tensor(name)

    def tokenizer_source(self) -> tuple[Path, dict[str, str]]:
        return self.path, {}

    def fingerprint(self) -> str:
        """sha256 over config.json and every shard's header (names, dtypes, shapes, offsets)."""
        digest = hashlib.sha256((self.path / "config.json").read_bytes())
        for raw in self._headers:
            digest.update(raw)
        return digest.hexdigest()
