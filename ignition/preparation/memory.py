"""Memory planning and the preparation memory report.

Pages are what is left: after weights, request state, snapshot rows and staging are
placed, the KV page count comes from the measured free memory minus the configured
reserve and the headroom that compilation, scratch and graph capture need, capped
at what the catalog can ever use. Preparation fails when not even one request at
the context limit fits, rather than serving a smaller contract silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GIB = 1 << 30
MIB = 1 << 20


class MemoryPlanError(ValueError):
    """The requested capacities cannot fit; the message gives the numbers."""


def plan_kv_pages(
    free_bytes: int,
    reserve_bytes: int,
    capture_headroom_bytes: int,
    bytes_per_page: int,
    max_useful_pages: int,
    min_pages: int,
) -> int:
    """KV pages to allocate (page 0, the null page, included)."""
    available = free_bytes - reserve_bytes - capture_headroom_bytes
    fit = max(available, 0) // bytes_per_page
    pages = min(fit, max_useful_pages)
    if pages < min_pages:
        raise MemoryPlanError(
            f"{pages} KV pages of {bytes_per_page / MIB:.1f} MiB fit in "
            f"{free_bytes / GIB:.2f} GiB free after a {reserve_bytes / GIB:.2f} GiB reserve and "
            f"{capture_headroom_bytes / GIB:.2f} GiB capture headroom; at least {min_pages} are "
            "needed (lower --context-limit or --gpu-reserve)"
        )
    return pages


@dataclass
class MemoryReport:
    """Bytes by owner, as prepared. ``graph_pool`` and ``operator_scratch`` are
    measured around warm-up and capture (the growth of the allocator's reserve)."""

    weights: int = 0
    request_state: int = 0
    staging: int = 0
    snapshot_rows: int = 0
    kv_pages: int = 0
    kv_page_count: int = 0
    bytes_per_page: int = 0
    operator_scratch_and_graph_pool: int = 0
    device_free_after: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def lines(self) -> list[str]:
        def fmt(n: int) -> str:
            return f"{n / MIB:10.1f} MiB"

        return [
            f"weights                 {fmt(self.weights)}",
            f"request state           {fmt(self.request_state)}",
            f"staging + completions   {fmt(self.staging)}",
            f"snapshot rows           {fmt(self.snapshot_rows)}",
            f"KV pages                {fmt(self.kv_pages)}  "
            f"({self.kv_page_count} pages x {self.bytes_per_page / MIB:.2f} MiB)",
            f"scratch + graph pool    {fmt(self.operator_scratch_and_graph_pool)}",
            f"device free after       {fmt(self.device_free_after)}",
        ]
