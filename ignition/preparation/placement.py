"""Where preparation's device memory comes from.

Preparation allocates in named regions: ``weights`` (and derived read-only tables),
``request_state``, ``staging``, ``kv_pages``, ``snapshot_rows``; everything else
(compile-time temporaries, library workspaces, graph pools) comes from whatever
region the caller made current, normally ``scratch``. The default placement is
PyTorch's own allocator. An export places every region in the fixed-address window
(``ignition.export.window``) so that a process without Python can rebuild the graphs
at the same addresses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch

REGIONS = ("weights", "request_state", "staging", "kv_pages", "snapshot_rows", "scratch")


class Placement(Protocol):
    def region(self, name: str) -> AbstractContextManager[None]:
        """Allocations inside the context come from region ``name``."""
        ...

    def graph_pool(self) -> tuple[int, int]:
        """The memory pool handle graphs are captured into."""
        ...


class DefaultPlacement:
    """PyTorch's caching allocator; graphs share one private pool."""

    def __init__(self) -> None:
        self._pool: tuple[int, int] | None = None

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        if name not in REGIONS:
            raise ValueError(f"unknown region {name!r}; regions are {', '.join(REGIONS)}")
        yield

    def graph_pool(self) -> tuple[int, int]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool
