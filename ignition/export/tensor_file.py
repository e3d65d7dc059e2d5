"""A safetensors file written one bounded piece at a time.

``safetensors.torch.save_file`` needs every tensor in host memory at once, so an
export held a host copy of all its weights (75 GB for the hybrid's H200 geometry)
before writing a byte. ``write_tensors`` takes tensors on any device, computes the
header from their dtypes and shapes alone, and copies each tensor's bytes to the host
in pieces of at most ``chunk_bytes`` while it writes them: host memory stays one
piece. The file is an ordinary safetensors file (tensors in name order, the header
padded with spaces to 8 bytes, the tensors ordered by element size, largest first, then
by name, as safetensors orders them: each starts aligned to its element size), which
``safetensors`` and Helios read as any other.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path

import torch

_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
}
CHUNK_BYTES = 256 << 20


def _nbytes(tensor: torch.Tensor) -> int:
    return math.prod(tensor.shape) * tensor.element_size()


def _order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Largest elements first, then by name: every tensor starts aligned."""
    return sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))


def header(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> bytes:
    """The length-prefixed JSON header of ``tensors`` in ``_order``."""
    entries: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in _order(tensors):
        tensor = tensors[name]
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"tensor {name}: dtype {tensor.dtype} has no safetensors name")
        size = _nbytes(tensor)
        entries[name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_tensors(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> None:
    """Write ``tensors`` (any device, any strides) to the safetensors file ``path``,
    holding at most ``chunk_bytes`` of them in host memory at a time."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    with open(path, "wb") as file:
        file.write(header(tensors, {"format": "pt", **(metadata or {})}))
        for name in _order(tensors):
            tensor = tensors[name]
            if tensor.numel() == 0:
                continue
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            for start in range(0, flat.numel(), chunk_bytes):
                piece = flat[start : start + chunk_bytes].cpu()
                file.write(memoryview(piece.numpy()))
