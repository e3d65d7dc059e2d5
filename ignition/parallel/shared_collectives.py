"""Two rank processes' collectives over each other's storage (preparation's side of
``window_collectives``): each rank maps fresh memory at its recorded address and
exports it, the ranks trade descriptors over the process group
(``ignition.parallel.handles``), and each maps its peer's memory at the peer's
address, so both processes, and later Helios's one, name the same bytes by the same
address.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from ignition.export.window import GRANULE
from ignition.parallel.handles import exchange_group_handles
from ignition.parallel.window_collectives import CollectiveStorage, WindowCollectives

# Where two rank processes put their storage when nothing else decides (the logits
# check): granule multiples 1 GiB apart, past the windows' default base and far below
# the host's mapped libraries.
RANK_ADDRESSES = (0x3000_0000_0000, 0x3000_4000_0000)


def storage_elements(hidden: int, vocab: int, chunk_rows: int, decode_rows: int) -> int:
    """16-bit storage elements the largest call of two ranks needs: a prefill chunk's
    all-reduce (``chunk_rows`` x ``hidden``), or a decode step's logits gather (each
    rank's ``vocab / 2`` float32 columns, two elements each, for ``decode_rows`` rows;
    a chunk gathers only its last row's). The tokens' broadcast is smaller."""
    return max(chunk_rows * hidden, decode_rows * vocab)


def span_size(capacity: int, dtype: torch.dtype) -> int:
    """One rank's span: its storage rounded up to whole granules."""
    return -(-CollectiveStorage.span_bytes(capacity, dtype) // GRANULE) * GRANULE


def share_collectives(
    rank: int, addresses: Sequence[int], capacity: int, dtype: torch.dtype, device: int
) -> tuple[WindowCollectives, list[Any]]:
    """Rank ``rank`` of two: its collectives over its own storage at
    ``addresses[rank]`` and its peer's at the other address, on CUDA device
    ``device``; and the two spans (``flare_heliopause.SharedSpan``), which the caller
    keeps open while the collectives run and closes after."""
    if len(addresses) != 2 or rank not in (0, 1):
        raise ValueError(f"two ranks share their collectives, not rank {rank} of {addresses}")
    size = span_size(capacity, dtype)
    if abs(addresses[1] - addresses[0]) < size:
        raise ValueError(
            f"spans of {size} bytes at {addresses[0]:#x} and {addresses[1]:#x} overlap"
        )
    import flare_heliopause as hp

    own = hp.SharedSpan.export(addresses[rank], size, device)
    try:
        collectives, peer = join_peer(
            rank, addresses[rank], addresses[1 - rank], size, own.take_fd(), capacity, dtype,
            device,
        )  # fmt: skip
    except BaseException:
        own.close()
        raise
    return collectives, [own, peer]


def join_peer(
    rank: int,
    own_address: int,
    peer_address: int,
    size: int,
    fd: int,
    capacity: int,
    dtype: torch.dtype,
    device: int,
) -> tuple[WindowCollectives, Any]:
    """Rank ``rank`` of two, whose storage of ``size`` bytes at ``own_address`` was
    exported as ``fd`` (closed here): trades descriptors with its peer over the process
    group, maps the peer's memory at ``peer_address`` and returns the collectives over
    both, with the peer's span (``flare_heliopause.SharedSpan``), which the caller
    keeps open while the collectives run and closes after."""
    import flare_heliopause as hp

    try:
        received = exchange_group_handles(rank, 2, fd)
    finally:
        os.close(fd)
    peer_rank = 1 - rank
    try:
        span = hp.SharedSpan.import_(peer_address, size, received[peer_rank], device)
    finally:
        os.close(received[peer_rank])
    cuda = torch.device("cuda", device)
    own = CollectiveStorage.over(own_address, capacity, dtype, cuda)
    theirs = CollectiveStorage.over(peer_address, capacity, dtype, cuda)
    return WindowCollectives(rank, own, theirs), span
