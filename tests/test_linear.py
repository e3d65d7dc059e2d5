"""The batch-invariant decode projection: accuracy, and a row's result independent of
its batch (bitwise), under Triton's interpreter here and on the GPU."""

from __future__ import annotations

import pytest
import torch

from ignition.components.linear import ROWS_TILE, project, triton_rows_linear


def _operands(device: str, dtype: torch.dtype, n: int, k: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(n * 7 + k)
    x = torch.randn(ROWS_TILE, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, b


def _check(device: str, dtype: torch.dtype, n: int, k: int, tolerance: float) -> None:
    x, w, b = _operands(device, dtype, n, k)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_linear(x, w, b)
    error = (full.double() - reference).norm() / reference.norm()
    assert error < tolerance, error
    for rows in (1, 2, 3, 4):
        for start in range(0, ROWS_TILE - rows + 1, 5):
            part = triton_rows_linear(x[start : start + rows], w, b)
            assert torch.equal(part, full[start : start + rows])


# fp32 operands through fp32 accumulation: far under 1e-5 for K <= 200.
@pytest.mark.parametrize(("n", "k"), [(64, 128), (100, 200), (7, 33)])
def test_rows_linear_matches_and_is_batch_invariant_interpreted(n: int, k: int) -> None:
    _check("cpu", torch.float32, n, k, 1e-5)


def test_project_uses_cublas_beyond_the_tile() -> None:
    x = torch.randn(2, ROWS_TILE + 1, 8)
    w = torch.randn(5, 8)
    assert torch.allclose(project(x, w), torch.nn.functional.linear(x, w))


# bf16 operands, fp32 accumulation, one bf16 rounding of the output: ~4e-3 relative.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(960, 576), (49152, 576), (4096, 4096), (12288, 4096)])
def test_rows_linear_on_gpu(n: int, k: int) -> None:
    _check("cuda", torch.bfloat16, n, k, 8e-3)


@pytest.mark.gpu
def test_rows_linear_replays_in_a_graph() -> None:
    x, w, b = _operands("cuda", torch.bfloat16, 576, 576)
    out = triton_rows_linear(x[:4], w, b)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        triton_rows_linear(x[:4], w, b)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        out = triton_rows_linear(x[:4], w, b)
    for seed in range(3):
        x[:4].copy_(torch.randn(4, 576, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        assert torch.equal(out, triton_rows_linear(x[:4], w, b))
