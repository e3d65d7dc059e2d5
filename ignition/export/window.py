"""The preparation allocator: every device allocation of an export in one window.

Heliopause (``flare_heliopause``) reserves one fixed virtual-address window and
backs it on demand; PyTorch allocates from it through ``CUDAPluggableAllocator``
with one ``MemPool`` per region (the caching allocator reuses cached segments
within a pool, so a pool must never serve two regions). ``region(name)`` selects
the region in Heliopause and routes this thread's allocations to its pool; graphs
are captured into a pool of their own inside the scratch region. A process without
Python later reserves the same window and maps the same spans, so no pointer needs
rewriting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from ignition.export import flare_core_pb2 as pb
from ignition.preparation.placement import REGIONS

GIB = 1 << 30
# Window base: 32 TiB, 2 MiB aligned, far from where the driver places allocations.
DEFAULT_BASE = 0x200000000000

REGION_KINDS = {
    "weights": pb.REGION_KIND_WEIGHTS,
    "request_state": pb.REGION_KIND_REQUEST_STATE,
    "staging": pb.REGION_KIND_STAGING,
    "kv_pages": pb.REGION_KIND_KV_PAGES,
    "snapshot_rows": pb.REGION_KIND_SNAPSHOT_ROWS,
    "scratch": pb.REGION_KIND_SCRATCH,
    # A tensor-parallel rank's collectives storage, mapped whole with memory its peer
    # maps too (``WindowPlacement.export_collectives``); never allocated from.
    "collectives": pb.REGION_KIND_COLLECTIVES,
}
# The driver's allocation granularity on the GPUs we prepare on (it refuses other
# sizes with a typed error): window layouts and shared spans are whole granules.
GRANULE = 2 << 20
# The least a collectives region takes: its peer maps it with a reservation of its own
# at its exact address, which the driver honours only from 32 MiB (SharedSpan); a
# smaller region laid out last would have that reservation run into the next rank's
# window.
COLLECTIVES_MINIMUM = 32 << 20


class WindowError(RuntimeError):
    """The window could not be opened, or an allocation escaped it."""


def region_capacities(device_bytes: int, collectives_bytes: int = 0) -> list[tuple[str, int]]:
    """Address space per region. Reserving costs no memory (backing follows use), so
    regions that scale with the model get the whole device's size and the small ones
    a few GiB; the window is then the same shape for every model on a device. A
    tensor-parallel rank adds a ``collectives`` region of ``collectives_bytes`` (whole
    granules, at least ``COLLECTIVES_MINIMUM``) last, so it sits at the same offset in
    every rank's window."""
    small = 4 * GIB
    large = -(-device_bytes // GIB) * GIB
    sizes = {
        "weights": large,
        "request_state": small,
        "staging": small,
        "kv_pages": large,
        "snapshot_rows": large,
        "scratch": large,
    }
    regions = [(name, sizes[name]) for name in REGIONS]
    if collectives_bytes:
        size = max(COLLECTIVES_MINIMUM, -(-collectives_bytes // GRANULE) * GRANULE)
        regions.append(("collectives", size))
    return regions


def rank_base(rank: int, window_size: int, base: int = DEFAULT_BASE) -> int:
    """Rank ``rank``'s window base: the ranks' windows side by side from ``base``,
    disjoint, so one serving process maps them all (and a rank's process maps its
    peer's collectives region at the peer's address, free in its own space)."""
    if rank < 0:
        raise ValueError(f"rank {rank}")
    return base + rank * (-(-window_size // GRANULE) * GRANULE)


@dataclass(frozen=True)
class RegionUsage:
    name: str
    offset: int
    capacity: int
    mapped: int


class WindowPlacement:
    """A ``Placement`` over the Heliopause window; open with ``WindowPlacement.open``."""

    def __init__(self, heliopause: ModuleType, base: int, size: int) -> None:
        self.hp = heliopause
        self.base = base
        self.size = size
        self.allocator = torch.cuda.memory.CUDAPluggableAllocator(
            heliopause.library_path(), "flare_window_alloc", "flare_window_free"
        )
        self.pools: dict[str, Any] = {
            name: torch.cuda.MemPool(self.allocator.allocator()) for name in REGIONS
        }
        # Graphs capture into a pool of their own (a capture cannot target the pool
        # the thread already allocates from); its memory comes from the scratch region,
        # which is selected around every capture (preparation runs inside it).
        self.graphs = torch.cuda.MemPool(self.allocator.allocator())
        self._current: list[str] = []

    @classmethod
    def open(
        cls,
        device: int = 0,
        base: int = DEFAULT_BASE,
        collectives_bytes: int = 0,
        rank: int = 0,
    ) -> WindowPlacement:
        """The window on ``device``: rank ``rank``'s of a group (``rank_base`` from
        ``base``), with a collectives region of ``collectives_bytes`` when nonzero."""
        try:
            import flare_heliopause as hp
        except ImportError as error:
            raise WindowError(
                "flare_heliopause is not installed: build it with "
                "`maturin build --release -m heliopause/Cargo.toml` and pip install the wheel"
            ) from error
        total = torch.cuda.get_device_properties(device).total_memory
        regions = region_capacities(total, collectives_bytes)
        size = sum(capacity for _, capacity in regions)
        base = rank_base(rank, size, base)
        try:
            hp.window_open(base, size, regions, device=device)
        except hp.WindowError as error:
            raise WindowError(f"cannot open the window at {base:#x}: {error}") from error
        return cls(hp, base, size)

    @contextmanager
    def region(self, name: str) -> Iterator[None]:
        if name not in self.pools:
            raise ValueError(f"unknown region {name!r}; regions are {', '.join(REGIONS)}")
        self.hp.window_select(name)
        self._current.append(name)
        try:
            with torch.cuda.use_mem_pool(self.pools[name]):
                yield
        finally:
            self._current.pop()
            if self._current:
                self.hp.window_select(self._current[-1])

    def export_collectives(self) -> tuple[int, int, int]:
        """Maps the ``collectives`` region whole with zeroed memory its peer may map:
        ``(address, size, fd)``, the descriptor the caller's to pass on and close."""
        try:
            address, size, fd = self.hp.window_export_region("collectives")
        except self.hp.WindowError as error:
            raise WindowError(f"cannot export the collectives region: {error}") from error
        return int(address), int(size), int(fd)

    def graph_pool(self) -> tuple[int, int]:
        if not self._current or self._current[-1] != "scratch":
            raise WindowError("graphs are captured inside the scratch region")
        return self.graphs.id

    def usage(self) -> list[RegionUsage]:
        return [
            RegionUsage(r["name"], int(r["offset"]), int(r["capacity"]), int(r["mapped"]))
            for r in self.hp.window_usage()
        ]

    def contains(self, address: int, nbytes: int) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.size

    def check_clean(self) -> None:
        """Refuses when an allocation failed inside the window, or when PyTorch holds
        a device segment outside it (something allocated around the placement)."""
        error = self.hp.window_last_error()
        if error is not None:
            raise WindowError(f"an allocation in the window failed: {error}")
        outside = [
            segment
            for segment in torch.cuda.memory.memory_snapshot()
            if not self.contains(int(segment["address"]), int(segment["total_size"]))
        ]
        if outside:
            first = outside[0]
            raise WindowError(
                f"{len(outside)} device segment(s) outside the window, the first "
                f"{int(first['total_size'])} bytes at {int(first['address']):#x} "
                f"(stream {first.get('stream')}); every preparation allocation must "
                "happen inside a placement region"
            )

    def close(self) -> None:
        """Gives the window back once nothing in it is alive (call after the prepared
        model, its graphs and every tensor are gone)."""
        self.pools.clear()
        del self.graphs
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        info = self.hp.window_info()
        if info is not None and info["live_blocks"] == 0:
            self.hp.window_close()
