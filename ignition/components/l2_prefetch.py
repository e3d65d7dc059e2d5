"""Bulk prefetches into L2 (SM90's ``cp.async.bulk.prefetch.L2``): a byte range
brought into L2 without any program waiting for it or holding it in registers.

Prefetching the next projection's weight while the one before streams its own was
measured a pure cost on the H200 (``programmatic_launch``); a persistent kernel
prefetches the weight tiles of its later phases before its barriers instead
(``persistent_layer``), and ``bench/l2_prefetch_bench.py`` times what a prefetched
weight saves. PTX only: never traced by Triton's interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

# One bulk prefetch of $2 bytes at $1 into L2, skipped for 0 bytes.
BULK_PREFETCH = tl.constexpr(
    "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; } // $0"
)
# The alignment of a bulk prefetch's address and size.
BULK_ALIGN = 16


@triton.jit
def prefetch_l2(ptr, nbytes, piece, LANES: tl.constexpr):
    """Lane i of ``LANES`` prefetches bytes ``[i * piece, (i + 1) * piece)`` of the
    ``nbytes`` at ``ptr`` (a byte pointer), clipped to them (nothing where they end
    before it; ``nbytes`` may be negative: nothing at all). ``ptr``, ``piece`` and
    ``nbytes`` must be multiples of 16 bytes."""
    offs = tl.arange(0, LANES).to(tl.int64) * piece
    size = tl.minimum(piece, tl.maximum(nbytes - offs, 0)).to(tl.int32)
    ok = size > 0
    tl.inline_asm_elementwise(
        BULK_PREFETCH,
        "=r,l,r",
        [ptr + tl.where(ok, offs, 0), tl.where(ok, size, 0)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def piece_bytes(nbytes: int, lanes: int) -> int:
    """Each lane's share of ``nbytes``, rounded up to the bulk alignment."""
    return triton.cdiv(triton.cdiv(nbytes, lanes), BULK_ALIGN) * BULK_ALIGN
