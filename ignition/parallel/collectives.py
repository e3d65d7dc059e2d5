"""What a rank's model calls to combine its shard's results with the other ranks'.

``all_reduce`` sums a row-parallel projection's partial results (every rank gets the
sum); ``all_gather_last`` concatenates each rank's slice of the last dimension in
rank order (the vocabulary shards' logits); ``broadcast_from_zero`` gives every rank
rank 0's tensor (the sampled tokens, so every rank's state update follows rank 0's
sample). ``SingleRank`` is the identity: a model
of one rank runs exactly the arithmetic it ran before tensor parallelism existed.
``GroupCollectives`` calls ``torch.distributed`` on the process group this process
joined (Gloo, through host copies of device tensors, so ranks may share one GPU):
the Python reference of a group's arithmetic. It is not capturable into an exported
graph; ``window_collectives.WindowCollectives`` is (two ranks, over fixed storage),
but preparation does not use it yet.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Collectives(Protocol):
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x``."""
        ...

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along the last dimension, in rank order."""
        ...

    def broadcast_from_zero(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``x`` on every rank, bit for bit."""
        ...


class SingleRank:
    """The collectives of a group of one: each returns its input."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def broadcast_from_zero(self, x: torch.Tensor) -> torch.Tensor:
        return x


class GroupCollectives:
    """``torch.distributed``'s collectives over the default process group."""

    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(
                "tensor-parallel preparation needs one process per rank in a process group "
                "(ignition.parallel.launch.spawn_ranks starts them)"
            )
        if dist.get_world_size() != world:
            raise RuntimeError(
                f"the process group has {dist.get_world_size()} ranks; the shard names {world}"
            )
        self._dist = dist
        self.world = world

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        total = x.detach().to("cpu", copy=True)
        self._dist.all_reduce(total)
        return total.to(x.device)

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        local = x.detach().to("cpu").contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world)]
        self._dist.all_gather(parts, local)
        return torch.cat(parts, dim=-1).to(x.device)

    def broadcast_from_zero(self, x: torch.Tensor) -> torch.Tensor:
        ours = x.detach().to("cpu", copy=True).contiguous()
        self._dist.broadcast(ours, src=0)
        return ours.to(x.device)
