"""The serving graph catalog: which kinds and capacities are captured, validated.

An unsupported value fails instead of silently shrinking a chunk or dropping a
variant: the scheduler can rely on every listed capacity existing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ignition.components.linear import INVARIANT_ROWS


class CatalogError(ValueError):
    """A requested capacity the catalog cannot provide; the message says which and why."""


class GraphKind(enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"
    RESUME = "resume"
    ADMIT = "admit"
    SNAPSHOT = "snapshot"
    RESTORE = "restore"


@dataclass(frozen=True, order=True)
class GraphKey:
    kind: GraphKind
    capacity: int

    def __str__(self) -> str:
        return f"{self.kind.value}[{self.capacity}]"


def _powers_below(start: int, limit: int) -> list[int]:
    values = []
    value = start
    while value < limit:
        values.append(value)
        value *= 2
    return values


@dataclass(frozen=True)
class Catalog:
    max_concurrency: int
    prefill_chunk_size: int
    context_limit: int
    page_size: int
    decode: tuple[int, ...]
    prefill: tuple[int, ...]

    @staticmethod
    def plan(
        max_concurrency: int, prefill_chunk_size: int, context_limit: int, page_size: int
    ) -> Catalog:
        """Decode at 1, 2, 4, ... below ``max_concurrency`` plus it; prefill chunks at 128,
        256, ... below ``prefill_chunk_size`` plus it (a limit of 64 captures one graph)."""
        if max_concurrency < 1:
            raise CatalogError(f"--max-concurrency must be at least 1, got {max_concurrency}")
        if max_concurrency > INVARIANT_ROWS:
            raise CatalogError(
                f"--max-concurrency {max_concurrency} exceeds {INVARIANT_ROWS}, the most "
                "decode rows whose results stay independent of their batch; serve more "
                "requests with a second server"
            )
        if context_limit < page_size or context_limit % page_size:
            raise CatalogError(
                f"context limit {context_limit} must be a positive multiple of the "
                f"{page_size}-token page"
            )
        if prefill_chunk_size % page_size or prefill_chunk_size < page_size:
            raise CatalogError(
                f"--prefill-chunk-size {prefill_chunk_size} must be a multiple of "
                f"{page_size} and at least {page_size}"
            )
        if prefill_chunk_size > context_limit:
            raise CatalogError(
                f"--prefill-chunk-size {prefill_chunk_size} exceeds the context limit "
                f"{context_limit}"
            )
        decode = (*_powers_below(1, max_concurrency), max_concurrency)
        prefill = (*_powers_below(128, prefill_chunk_size), prefill_chunk_size)
        return Catalog(
            max_concurrency=max_concurrency,
            prefill_chunk_size=prefill_chunk_size,
            context_limit=context_limit,
            page_size=page_size,
            decode=decode,
            prefill=prefill,
        )

    @property
    def max_pages_per_request(self) -> int:
        return self.context_limit // self.page_size

    def keys(self) -> list[GraphKey]:
        """Every graph, largest first within a kind (captured in this order into one pool)."""
        keys = [GraphKey(GraphKind.PREFILL, c) for c in sorted(self.prefill, reverse=True)]
        keys += [GraphKey(GraphKind.DECODE, c) for c in sorted(self.decode, reverse=True)]
        keys += [GraphKey(kind, 1) for kind in (GraphKind.RESUME, GraphKind.ADMIT)]
        keys += [GraphKey(kind, 1) for kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE)]
        return keys

    def decode_capacity(self, rows: int) -> int:
        """The smallest decode capacity that holds ``rows`` requests."""
        for capacity in self.decode:
            if capacity >= rows:
                return capacity
        raise CatalogError(f"{rows} decode rows exceed the largest capacity {self.decode[-1]}")

    def prefill_capacity(self, tokens: int) -> int:
        """The smallest prefill capacity that holds ``tokens``, else the largest."""
        for capacity in self.prefill:
            if capacity >= tokens:
                return capacity
        return self.prefill[-1]
