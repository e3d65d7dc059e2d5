"""One tensor-parallel runtime core from the cores its ranks exported.

Each rank of a group exports a core of its own (its window at its base, its buffers
and graphs, its shards as initial contents, the kernel images its graphs use).
``merge_rank_cores`` writes the group's core: rank 0's, with every other rank as a
bundle of its rank layout (``manifest.with_rank_layout``). What ranks share must
agree (ABI, identity, contract, frontend, the catalog of graphs); what is a rank's
own travels with it:

- a peer's initial contents are stored under ``rank{r}/`` plus the tensor's name, and
  its buffers name them so (the ranks' shards differ under one name);
- the kernel images are the union of every rank's (a rank's autotuning may choose
  kernels its peer's did not), each declared once.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import CoreDirError, read_core_dir, write_core_dir
from ignition.export.manifest import with_rank_layout

SHARED_FIELDS = ("abi_version", "identity", "contract", "frontend")


def peer_tensor_name(rank: int, name: str) -> str:
    """Where rank ``rank``'s initial tensor ``name`` is stored in the group's core."""
    return f"rank{rank}/{name}"


def merge_rank_cores(
    ranks: Sequence[Path], out: Path, wait_limit_offset: int | None = None
) -> pb.Core:
    """Writes the group's core to ``out`` from each rank's core directory, rank 0's
    first, and returns its manifest. Refuses ranks that disagree on what they share
    (``CoreDirError``, naming the rank and the part); the written core is checked as
    every core is (``write_core_dir``), and Helios validates its rank layout on load.
    ``wait_limit_offset``: where the collectives' wait limit lies in every rank's
    collectives region (``window_collectives.LIMIT_OFFSET``), which Helios writes at
    load."""
    if len(ranks) < 2:
        raise CoreDirError(f"a tensor-parallel core joins two ranks or more, not {len(ranks)}")
    read = [read_core_dir(path) for path in ranks]
    zero, initial, images = read[0]
    if zero.HasField("rank_layout"):
        raise CoreDirError(f"{ranks[0]} already holds a rank layout")
    initial = dict(initial)
    images = dict(images)
    declared = {image.sha256: image for image in zero.images}
    peers = []
    for rank, (core, own_initial, own_images) in enumerate(read[1:], start=1):
        for field in SHARED_FIELDS:
            if getattr(core, field) != getattr(zero, field):
                raise CoreDirError(f"rank {rank} ({ranks[rank]}) differs from rank 0 in {field}")
        if core.HasField("rank_layout"):
            raise CoreDirError(f"{ranks[rank]} already holds a rank layout")
        peer = pb.Core()
        peer.CopyFrom(core)
        for buffer in peer.buffers:
            if buffer.initial_tensor:
                renamed = peer_tensor_name(rank, buffer.initial_tensor)
                initial[renamed] = own_initial[buffer.initial_tensor]
                buffer.initial_tensor = renamed
        for image in core.images:
            declared.setdefault(image.sha256, image)
        images.update(own_images)
        peers.append(peer)
    merged = pb.Core()
    merged.CopyFrom(zero)
    with_rank_layout(merged, peers)
    if wait_limit_offset is not None:
        merged.rank_layout.collectives_wait_limit_offset = wait_limit_offset
    del merged.images[:]
    merged.images.extend(declared[digest] for digest in sorted(declared))
    write_core_dir(out, merged, initial, images)
    return merged


def rank_initial(
    core: pb.Core, initial: dict[str, torch.Tensor], rank: int
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s initial contents by its buffers' names, from a group's core."""
    buffers = (
        core.buffers
        if rank == 0
        else next(peer.buffers for peer in core.rank_layout.peers if peer.rank == rank)
    )
    return {b.name: initial[b.initial_tensor] for b in buffers if b.initial_tensor}
