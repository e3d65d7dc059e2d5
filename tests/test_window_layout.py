"""The preparation window's layout (``ignition.export.window``): the regions' address
space, a tensor-parallel rank's collectives region and the ranks' window bases."""

from __future__ import annotations

from itertools import pairwise

import pytest

from ignition.export import flare_core_pb2 as pb
from ignition.export.window import (
    COLLECTIVES_MINIMUM,
    DEFAULT_BASE,
    GRANULE,
    REGION_KINDS,
    rank_base,
    region_capacities,
)
from ignition.preparation.placement import REGIONS

H200 = 143_771 << 20  # device bytes


def test_a_rank_adds_its_collectives_region_last_in_whole_granules() -> None:
    one = region_capacities(H200)
    assert [name for name, _ in one] == list(REGIONS)
    ranked = region_capacities(H200, collectives_bytes=GRANULE + 1)
    # Every other region keeps its place, so the collectives region sits at the same
    # offset in every rank's window (their devices are alike). It takes at least the
    # 32 MiB its peer's reservation of it does, so that reservation stays inside it.
    assert ranked[:-1] == one
    assert ranked[-1] == ("collectives", COLLECTIVES_MINIMUM)
    wide = COLLECTIVES_MINIMUM + GRANULE + 1
    assert region_capacities(H200, wide)[-1] == ("collectives", COLLECTIVES_MINIMUM + 2 * GRANULE)
    assert REGION_KINDS["collectives"] == pb.REGION_KIND_COLLECTIVES


def test_the_ranks_windows_lie_side_by_side() -> None:
    size = sum(capacity for _, capacity in region_capacities(H200, GRANULE))
    bases = [rank_base(rank, size) for rank in range(4)]
    assert bases[0] == DEFAULT_BASE
    assert all(b % GRANULE == 0 for b in bases)
    # Disjoint: each starts where the one before ends (rounded to a granule).
    assert all(later - earlier >= size for earlier, later in pairwise(bases))
    assert rank_base(1, GRANULE + 1) == DEFAULT_BASE + 2 * GRANULE
    with pytest.raises(ValueError, match="rank -1"):
        rank_base(-1, size)
