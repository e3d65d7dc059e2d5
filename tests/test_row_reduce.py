"""``flare::row_sum``: each row's sum in an order that does not follow the batch (the
hybrid's norms and PLE gate, ``ignition.components.row_reduce``)."""

from __future__ import annotations

import pytest
import torch

from ignition.components import row_reduce


def _rows_agree(device: str, dtype: torch.dtype) -> None:
    """The kernel (interpreted on the CPU; the op's CPU body is torch's reduction)."""
    x = torch.randn(9, 2600, generator=torch.Generator().manual_seed(3)).to(device, dtype)
    sums = row_reduce.triton_row_sum(x)
    # fp32 sums of 2,600 terms of about 1: a few ulp of the largest partial sums.
    torch.testing.assert_close(sums.cpu(), x.cpu().double().sum(-1).float(), rtol=1e-6, atol=1e-4)
    for rows in (1, 4, 9):
        assert torch.equal(row_reduce.triton_row_sum(x[:rows]), sums[:rows])
    # A row is summed the same wherever it sits in the batch.
    assert torch.equal(row_reduce.triton_row_sum(x.flip(0)), sums.flip(0))
    # The squares' sum, in the same kernel: the sum of the fp32 squares stored, but
    # for the roundings a fused multiply-add may save on the GPU.
    squares = row_reduce.triton_row_sum(x, square=True)
    stored = row_reduce.triton_row_sum(x.float().pow(2))
    torch.testing.assert_close(squares, stored, rtol=1e-6, atol=0)
    for rows in (1, 4):
        assert torch.equal(row_reduce.triton_row_sum(x[:rows], square=True), squares[:rows])
    # The operator: the kernel on the GPU, torch's reduction on the CPU.
    torch.testing.assert_close(row_reduce.row_sum(x, square=True), squares, rtol=1e-6, atol=0)


def test_row_sum_matches_and_is_batch_invariant_interpreted() -> None:
    _rows_agree("cpu", torch.float32)


def test_mean_square_is_the_canonical_rms_statistic() -> None:
    x = torch.randn(9, 2, 1300, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    reference = x.float().pow(2).mean(-1, keepdim=True)
    torch.testing.assert_close(row_reduce.mean_square(x), reference, rtol=1e-6, atol=1e-7)
    # The PLE gate's sum: accumulated in fp32, rounded once to the operands' dtype.
    summed = row_reduce.last_sum(x)
    assert summed.dtype == torch.bfloat16 and summed.shape == (9, 2, 1)
    torch.testing.assert_close(summed, x.float().sum(-1, keepdim=True).to(torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_sum_is_batch_invariant_on_gpu(dtype: torch.dtype) -> None:
    _rows_agree("cuda", dtype)
