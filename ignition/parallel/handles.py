"""Passing file descriptors between the rank processes of a tensor-parallel group.

A rank's collective storage must be mapped into its peers' processes at preparation
(their kernels are captured with the peer's addresses, and warmup and the Python
replay run them). CUDA exports a physical allocation as a POSIX file descriptor
(``cuMemExportToShareableHandle``); a descriptor means nothing in another process
unless the kernel passes it there, over a Unix socket (``SCM_RIGHTS``).

``exchange_handles(rank, world, fd)`` gives every rank every other rank's
descriptor, each received as a new descriptor of this process. Each rank listens on
an abstract Unix socket named by a token the group agrees on first (no file on
disk), the group waits until all listen, then each connects to every peer and sends
its descriptor, and accepts one connection from every peer. A connection completes
in the listener's backlog before it is accepted, so no order of sends and accepts
can wait on another. Every wait is bounded by ``TIMEOUT_S``.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable

TIMEOUT_S = 60.0
# What a rank sends with its descriptor: its rank, so the receiver knows whose it is.
_HEADER = struct.Struct("<I")


def _address(token: str, rank: int) -> str:
    return f"\0flare-handles-{token}-{rank}"


def exchange_handles(
    rank: int,
    world: int,
    fd: int,
    agree: Callable[[str], str],
    barrier: Callable[[], object],
) -> dict[int, int]:
    """Every other rank's descriptor, by rank, as descriptors of this process (the
    caller closes them). ``agree(token)`` returns rank 0's token on every rank, and
    ``barrier()`` returns once every rank has called it (the group's collectives:
    ``torch.distributed``'s broadcast and barrier over Gloo in ``ignition.parallel``).
    """
    if not 0 <= rank < world or world < 2:
        raise ValueError(f"rank {rank} of a group of {world} exchanges no handles")
    token = agree(os.urandom(8).hex())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(_address(token, rank))
        listener.listen(world)
        listener.settimeout(TIMEOUT_S)
        barrier()
        for peer in range(world):
            if peer == rank:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as out:
                out.settimeout(TIMEOUT_S)
                out.connect(_address(token, peer))
                socket.send_fds(out, [_HEADER.pack(rank)], [fd])
        received: dict[int, int] = {}
        try:
            while len(received) < world - 1:
                connection, _ = listener.accept()
                with connection:
                    connection.settimeout(TIMEOUT_S)
                    data, fds, _flags, _sender = socket.recv_fds(
                        connection, _HEADER.size, 1, socket.MSG_CMSG_CLOEXEC
                    )
                    if len(data) != _HEADER.size or len(fds) != 1:
                        for extra in fds:
                            os.close(extra)
                        raise ConnectionError("a peer's handle message was incomplete")
                    (sender,) = _HEADER.unpack(data)
                    if sender == rank or sender >= world or sender in received:
                        os.close(fds[0])
                        raise ConnectionError(f"a handle from an unexpected rank ({sender})")
                    received[sender] = fds[0]
        except BaseException:
            for descriptor in received.values():
                os.close(descriptor)
            raise
    return received


def exchange_group_handles(rank: int, world: int, fd: int) -> dict[int, int]:
    """``exchange_handles`` over the process group this rank joined (``spawn_ranks``)."""
    import torch.distributed as dist

    def agree(token: str) -> str:
        box = [token]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])

    return exchange_handles(rank, world, fd, agree, dist.barrier)
