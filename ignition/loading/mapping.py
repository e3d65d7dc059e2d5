"""The recipe mapping: where every checkpoint tensor goes in its execution layout.

A recipe declares, for each canonical checkpoint tensor name, the destination view
it is copied into (often a slice of a packed projection). Loading streams tensors
one at a time through that table, so the only intermediate is the tensor in flight.
A tensor-parallel rank places its shard of a tensor: a range along one dimension
(``place(name, target, shard=Shard(dim, start, stop))``), or several ranges of one
dimension, concatenated (``Shard.more``: its part of each head group a tensor packs).
A checkpoint tensor the
table does not place, or a placed tensor the checkpoint lacks, fails loading with its
name. A recipe may also fold loaded tensors into each other once every tensor is in
(``finish``: an RMSNorm's gain into the projection that reads it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ignition.loading.source import CheckpointError, CheckpointSource


@dataclass(frozen=True)
class Shard:
    """The range ``[start, stop)`` of a checkpoint tensor's dimension ``dim``, and the
    ranges ``more`` of the same dimension after it, in order: a rank's rows of a tensor
    that packs several groups it shards (GDN's query, key and value rows)."""

    dim: int
    start: int
    stop: int
    more: tuple[tuple[int, int], ...] = ()

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return ((self.start, self.stop), *self.more)

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """The shard of ``tensor``: a view when it is one range, else the ranges
        concatenated."""
        pieces = [tensor.narrow(self.dim, lo, hi - lo) for lo, hi in self.ranges]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The shard of ``tensor`` as a view of it (one range only): what a tied
        weight aliases, whose values arrive when ``tensor``'s do."""
        if self.more:
            raise ValueError(f"a shard of {len(self.ranges)} ranges is no view: {self}")
        return self.of(tensor)

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        for lo, hi in self.ranges:
            if not 0 <= lo < hi <= shape[self.dim]:
                raise CheckpointError(
                    f"shard [{lo}, {hi}) of dimension {self.dim} is outside {shape}"
                )
        length = sum(hi - lo for lo, hi in self.ranges)
        return (*shape[: self.dim], length, *shape[self.dim + 1 :])


@dataclass
class WeightMapping:
    """Destination views by canonical tensor name (each the whole tensor or its
    ``shards`` entry), and names deliberately not loaded."""

    placements: dict[str, torch.Tensor] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    shards: dict[str, Shard] = field(default_factory=dict)
    # Run in order once every placed tensor is loaded (``finish``).
    finishers: list[Callable[[], None]] = field(default_factory=list)

    def place(self, name: str, target: torch.Tensor, shard: Shard | None = None) -> None:
        if name in self.placements:
            raise CheckpointError(f"recipe mapping places {name} twice")
        self.placements[name] = target
        if shard is not None:
            self.shards[name] = shard

    def ignore(self, name: str, reason: str) -> None:
        self.ignored[name] = reason

    def finish(self, step: Callable[[], None]) -> None:
        """Runs ``step`` after loading, when every placed tensor holds its values."""
        self.finishers.append(step)


@dataclass(frozen=True)
class LoadReport:
    tensors: int
    bytes_loaded: int
    ignored: dict[str, str]


def check_coverage(source: CheckpointSource, mapping: WeightMapping) -> None:
    """Both directions of completeness, checked from headers before any tensor is read."""
    stored = source.tensors()
    unmapped = sorted(n for n in stored if n not in mapping.placements and n not in mapping.ignored)
    if unmapped:
        more = f" (and {len(unmapped) - 1} more)" if len(unmapped) > 1 else ""
        raise CheckpointError(
            f"checkpoint tensor {unmapped[0]}{more} has no place in the recipe mapping"
        )
    missing = sorted(n for n in mapping.placements if n not in stored)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"the recipe needs tensor {missing[0]}{more}; the checkpoint lacks it"
        )
    for name, target in mapping.placements.items():
        shape = stored[name].shape
        if (shard := mapping.shards.get(name)) is not None:
            shape = shard.shape(shape)
        if tuple(target.shape) != shape:
            raise CheckpointError(
                f"tensor {name}: checkpoint shape {list(shape)}, "
                f"recipe expects {list(target.shape)}"
            )


def load_weights(
    source: CheckpointSource,
    mapping: WeightMapping,
    advance: Callable[[int], None] | None = None,
) -> LoadReport:
    """Copy every placed tensor into its destination, one tensor in flight at a time."""
    check_coverage(source, mapping)
    loaded = 0
    with torch.no_grad():
        for name, target in mapping.placements.items():
            tensor = source.load(name)
            if (shard := mapping.shards.get(name)) is not None:
                tensor = shard.of(tensor)
            target.copy_(tensor)
            loaded += tensor.numel() * tensor.element_size()
            del tensor
            if advance is not None:
                advance(1)
        for step in mapping.finishers:
            step()
    return LoadReport(len(mapping.placements), loaded, dict(mapping.ignored))
