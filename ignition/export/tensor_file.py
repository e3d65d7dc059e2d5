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

Pieces are written while the next ones are copied: ``WRITERS`` threads each write a
piece at its offset (``os.pwrite``, which releases the GIL) from one of
``WRITERS + 1`` staging buffers, pinned when the tensors lie on the GPU so that the
device copies run at the link's speed. Host memory stays those buffers.
"""

from __future__ import annotations

import json
import math
import os
import queue
import struct
import threading
from collections.abc import Iterator, Mapping
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
# Threads writing pieces at their offsets, each from its own staging buffer.
WRITERS = 4


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


def _pieces(
    tensors: Mapping[str, torch.Tensor], start: int, chunk_bytes: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """(file offset, bytes) of every piece of ``tensors`` in ``_order``, the data
    starting at ``start``; each piece at most ``chunk_bytes``, on the tensor's device."""
    offset = start
    for name in _order(tensors):
        tensor = tensors[name]
        if tensor.numel() == 0:
            continue
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        for begin in range(0, flat.numel(), chunk_bytes):
            piece = flat[begin : begin + chunk_bytes]
            yield offset, piece
            offset += piece.numel()


def write_tensors(
    path: Path,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    writers: int = WRITERS,
) -> None:
    """Write ``tensors`` (any device, any strides) to the safetensors file ``path``,
    holding at most ``writers + 1`` pieces of ``chunk_bytes`` in host memory."""
    if chunk_bytes <= 0 or writers <= 0:
        raise ValueError("chunk_bytes and writers must be positive")
    head = header(tensors, {"format": "pt", **(metadata or {})})
    largest = max((_nbytes(t) for t in tensors.values()), default=0)
    size = max(1, min(chunk_bytes, largest))
    pinned = torch.cuda.is_available() and any(t.is_cuda for t in tensors.values())
    free: queue.Queue[torch.Tensor] = queue.Queue()
    for _ in range(writers + 1):
        free.put(torch.empty(size, dtype=torch.uint8, pin_memory=pinned))
    filled: queue.Queue[tuple[int, torch.Tensor, int] | None] = queue.Queue()
    errors: list[BaseException] = []
    with open(path, "wb") as file:
        file.write(head)
        # The writers' own descriptor: were the joins below interrupted (a second
        # Ctrl-C), closing ``file`` must not let a late pwrite land in whatever file
        # reuses its number. It is closed once every writer has ended.
        fd = os.dup(file.fileno())

        def write() -> None:
            while (job := filled.get()) is not None:
                offset, staging, length = job
                try:
                    if not errors:
                        view = memoryview(staging.numpy())[:length]
                        while view:
                            written = os.pwrite(fd, view, offset)
                            view = view[written:]
                            offset += written
                except BaseException as error:  # re-raised by the caller
                    errors.append(error)
                free.put(staging)

        threads = [threading.Thread(target=write, daemon=True) for _ in range(writers)]
        try:
            for thread in threads:
                thread.start()
            for offset, piece in _pieces(tensors, len(head), chunk_bytes):
                if errors:
                    break
                staging = free.get()
                # Synchronous from the device: the copy is done when it returns, while
                # the writer threads write the pieces before it.
                staging[: piece.numel()].copy_(piece)
                filled.put((offset, staging, piece.numel()))
        finally:
            for _ in threads:
                filled.put(None)
            for thread in threads:
                if thread.ident is not None:
                    thread.join()
            os.close(fd)
        if errors:
            raise errors[0]
