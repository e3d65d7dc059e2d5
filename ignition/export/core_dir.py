"""The runtime-core directory: manifest, initial buffer contents and kernel images.

    CORE/manifest.pb            flare.core.v1.Core, binary protobuf
    CORE/buffers.safetensors    initial contents of every buffer with ``initial_tensor``
    CORE/images/<sha256>.bin    kernel images, named by the sha256 of their bytes

Writing checks that the three parts agree (every referenced tensor present with the
buffer's dtype and shape, every referenced image present with its digest), so a
core that would fail to load is never written.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from ignition.export import flare_core_pb2 as pb
from ignition.export.tensor_file import write_tensors

MANIFEST = "manifest.pb"
BUFFERS = "buffers.safetensors"
IMAGES = "images"

_TORCH_DTYPES = {
    pb.DTYPE_BF16: torch.bfloat16,
    pb.DTYPE_F16: torch.float16,
    pb.DTYPE_F32: torch.float32,
    pb.DTYPE_I32: torch.int32,
    pb.DTYPE_I64: torch.int64,
    pb.DTYPE_U8: torch.uint8,
}


class CoreDirError(ValueError):
    """A core whose parts disagree; the message names the buffer or image."""


def _check(core: pb.Core, initial: dict[str, torch.Tensor], images: dict[str, bytes]) -> None:
    # Rank 0's buffers, then every peer rank's (a tensor-parallel core's own shards).
    buffers = [*core.buffers, *(b for peer in core.rank_layout.peers for b in peer.buffers)]
    for buffer in buffers:
        if not buffer.initial_tensor:
            continue
        tensor = initial.get(buffer.initial_tensor)
        if tensor is None:
            raise CoreDirError(
                f"buffer {buffer.name}: initial tensor {buffer.initial_tensor} missing"
            )
        if tensor.dtype != _TORCH_DTYPES.get(buffer.dtype) or list(tensor.shape) != list(
            buffer.shape
        ):
            raise CoreDirError(
                f"buffer {buffer.name}: initial tensor is {tensor.dtype} {list(tensor.shape)}, "
                f"the manifest declares {pb.DType.Name(buffer.dtype)} {list(buffer.shape)}"
            )
    declared = {image.sha256: image.size_bytes for image in core.images}
    for digest, data in images.items():
        if hashlib.sha256(data).hexdigest() != digest:
            raise CoreDirError(f"image {digest}: contents do not match the digest")
        if declared.get(digest) != len(data):
            raise CoreDirError(f"image {digest}: not declared with its size in the manifest")
    missing = sorted(set(declared) - set(images))
    if missing:
        raise CoreDirError(f"image {missing[0]} is declared but not provided")


def write_core_dir(
    path: Path, core: pb.Core, initial: dict[str, torch.Tensor], images: dict[str, bytes]
) -> None:
    """Write a core directory after checking that its parts agree. ``initial`` may
    lie on the GPU: each tensor is copied to the host in bounded pieces as it is
    written, so host memory never holds the weights whole."""
    _check(core, initial, images)
    (path / IMAGES).mkdir(parents=True, exist_ok=True)
    for digest, data in images.items():
        (path / IMAGES / f"{digest}.bin").write_bytes(data)
    write_tensors(path / BUFFERS, initial)
    (path / MANIFEST).write_bytes(core.SerializeToString())


def read_core_dir(path: Path) -> tuple[pb.Core, dict[str, torch.Tensor], dict[str, bytes]]:
    """Read a core directory back, with the same agreement checks as writing."""
    core = pb.Core()
    core.ParseFromString((path / MANIFEST).read_bytes())
    buffers = path / BUFFERS
    initial = load_file(str(buffers)) if buffers.is_file() else {}
    images = {image.sha256: (path / IMAGES / f"{image.sha256}.bin") for image in core.images}
    missing = [digest for digest, file in images.items() if not file.is_file()]
    if missing:
        raise CoreDirError(f"image {missing[0]} is declared but its file is missing")
    contents = {digest: file.read_bytes() for digest, file in images.items()}
    _check(core, initial, contents)
    return core, initial, contents
