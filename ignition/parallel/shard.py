"""This process's rank of a tensor-parallel group, and the ranges its shards hold."""

from __future__ import annotations

from dataclasses import dataclass, field

from ignition.loading.mapping import Shard
from ignition.loading.source import CheckpointError
from ignition.parallel.collectives import Collectives, SingleRank


@dataclass(frozen=True)
class TensorParallel:
    """Rank ``rank`` of a group of ``world`` ranks, with the collectives its model
    calls (the identity for a group of one)."""

    rank: int = 0
    world: int = 1
    collectives: Collectives = field(default_factory=SingleRank, compare=False)

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of a group of {self.world}")

    @property
    def sharded(self) -> bool:
        return self.world > 1

    @property
    def leads(self) -> bool:
        """Rank 0: the one that adds what must be added once (a row-parallel
        projection's bias and residual)."""
        return self.rank == 0

    def part(self, total: int, what: str) -> int:
        """Each rank's equal share of ``total`` units of ``what``."""
        if total % self.world:
            raise CheckpointError(
                f"{what} ({total}) do not divide among {self.world} tensor-parallel ranks"
            )
        return total // self.world

    def span(self, total: int, what: str, unit: int = 1) -> Shard:
        """This rank's range of ``total`` units of ``what`` (each ``unit`` elements
        long), along dimension 0 (``dataclasses.replace`` moves it)."""
        share = self.part(total, what)
        return Shard(0, self.rank * share * unit, (self.rank + 1) * share * unit)

    def spans(self, groups: tuple[tuple[int, int, str], ...]) -> Shard:
        """This rank's range of each of the consecutive ``groups`` a tensor packs
        along dimension 0, each ``(units, unit, what)`` (``span``'s arguments), in one
        shard: the rows of a projection whose output is several groups of heads."""
        ranges = []
        offset = 0
        for total, unit, what in groups:
            part = self.span(total, what, unit)
            ranges.append((offset + part.start, offset + part.stop))
            offset += total * unit
        (start, stop), *more = ranges
        return Shard(0, start, stop, tuple(more))


ONE_RANK = TensorParallel()
