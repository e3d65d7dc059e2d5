"""Row-wise inclusive cumulative sums whose rounding never depends on timing.

The sampler scans each row's sorted probabilities (a vocabulary: 151,936 columns for
Qwen3). Inductor lowers such a long scan to a split scan whose programs combine
their predecessors' partial sums by decoupled look-back: a program adds whichever
partials have been published when it looks, so the order of the float additions,
and the rounded sums, change from run to run. A sampled token near a threshold then
changes too, and a recorded qualification sequence no longer reproduces (Qwen3-8B's
first four-row decode step on the H200). ATen's scan gives no promise either.

Here every sum has one fixed order: each block of ``BLOCK`` columns is summed by one
program; each block's offset is the sum of the blocks before it, reduced by the
program that needs it in the same tree order every time; the block's own inclusive
scan adds that offset. Rows are independent programs, so a row's sums do not depend
on how many rows share the call either. Two launches, all blocks in parallel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _block_sums_kernel(x_ptr, sums_ptr, N, stride_x, BLOCKS, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=0.0)
    tl.store(sums_ptr + row * BLOCKS + block, tl.sum(x, axis=0))


@triton.jit
def _block_scan_kernel(
    x_ptr,
    sums_ptr,
    y_ptr,
    N,
    stride_x,
    stride_y,
    BLOCKS,
    BLOCK: tl.constexpr,
    BLOCKS_POW2: tl.constexpr,
):
    row = tl.program_id(0)
    block = tl.program_id(1)
    earlier = tl.arange(0, BLOCKS_POW2)
    sums = tl.load(sums_ptr + row * BLOCKS + earlier, mask=earlier < block, other=0.0)
    offset = tl.sum(sums, axis=0)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N, other=0.0)
    y = tl.cumsum(x, axis=0) + offset
    tl.store(y_ptr + row * stride_y + cols, y, mask=cols < N)


def triton_row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sums along the last dimension of a 2-D float32 ``x``."""
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"row_cumsum takes a 2-D float32 tensor, not {x.dim()}-D {x.dtype}")
    rows, n = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows == 0 or n == 0:
        return y
    x = x.contiguous()
    blocks = triton.cdiv(n, BLOCK)
    sums = torch.empty(rows, blocks, dtype=torch.float32, device=x.device)
    _block_sums_kernel[(rows, blocks)](x, sums, n, x.stride(0), blocks, BLOCK=BLOCK)
    _block_scan_kernel[(rows, blocks)](
        x, sums, y, n, x.stride(0), y.stride(0), blocks,
        BLOCK=BLOCK, BLOCKS_POW2=triton.next_power_of_2(blocks),
    )  # fmt: skip
    return y


@torch.library.custom_op("flare::row_cumsum", mutates_args=())
def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sums of each row: the kernels above on the GPU; on the CPU
    torch's sequential scan (also one order; the CPU tests run the kernels directly
    under Triton's interpreter, which would make every CPU sampler call slow)."""
    return torch.cumsum(x, dim=-1)


@row_cumsum.register_kernel("cuda")
def _row_cumsum_cuda(x: torch.Tensor) -> torch.Tensor:
    return triton_row_cumsum(x)


@row_cumsum.register_fake
def _row_cumsum_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)
