"""One Python process per tensor-parallel rank, joined by a Gloo coordinator.

``spawn_ranks(world, main, *args)`` starts ``world`` processes on this host; each
joins the process group over a loopback TCP store (bounded by ``TIMEOUT``) and calls
``main(parallel, *args)`` with its ``TensorParallel`` (rank, group size, and the
group's collectives). A rank that raises fails the whole launch: the others are
stopped and the error is raised here. ``main`` must be a module-level function (it
is pickled into the new processes).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ignition.parallel.collectives import GroupCollectives
from ignition.parallel.shard import TensorParallel

TIMEOUT = timedelta(seconds=300)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rank(
    rank: int, world: int, port: int, main: Callable[..., None], args: tuple[Any, ...]
) -> None:
    # The ranks share this host's cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )
    try:
        main(TensorParallel(rank, world, GroupCollectives(world)), *args)
    finally:
        dist.destroy_process_group()


def spawn_ranks(world: int, main: Callable[..., None], *args: Any) -> None:
    """Runs ``main(parallel, *args)`` on each of ``world`` new processes and waits for
    them all."""
    if world < 2:
        raise ValueError(f"a tensor-parallel group needs two ranks or more, not {world}")
    mp.spawn(_rank, args=(world, _free_port(), main, args), nprocs=world, join=True)
