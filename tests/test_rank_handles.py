"""``ignition.parallel.handles``: every rank of a group receives every other rank's
file descriptor (the way CUDA's exported allocations travel between the rank
processes), here over memory files whose contents name their rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ignition.parallel.handles import exchange_group_handles, exchange_handles
from ignition.parallel.launch import spawn_ranks
from ignition.parallel.shard import TensorParallel


def _exchange(parallel: TensorParallel, out: Path) -> None:
    fd = os.memfd_create(f"rank-{parallel.rank}")
    os.write(fd, f"written by rank {parallel.rank}".encode())
    peers = exchange_group_handles(parallel.rank, parallel.world, fd)
    os.close(fd)  # the peers hold descriptors of their own
    for peer, handle in peers.items():
        # A new descriptor of the same file: read from its start.
        text = os.pread(handle, 64, 0).decode()
        os.close(handle)
        (out / f"{parallel.rank}-from-{peer}").write_text(text)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_receives_every_other_ranks_descriptor(tmp_path: Path, world: int) -> None:
    spawn_ranks(world, _exchange, tmp_path)
    got = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert got == {
        f"{rank}-from-{peer}": f"written by rank {peer}"
        for rank in range(world)
        for peer in range(world)
        if peer != rank
    }


def test_a_group_of_one_or_a_rank_outside_it_is_refused() -> None:
    def never(*_: object) -> str:
        raise AssertionError("no coordination for a refused call")

    for rank, world in ((0, 1), (2, 2), (-1, 2)):
        with pytest.raises(ValueError, match="exchanges no handles"):
            exchange_handles(rank, world, 0, never, never)
