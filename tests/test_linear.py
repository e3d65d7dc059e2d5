"""The batch-invariant decode projection: accuracy, and a row's result independent of
its batch (bitwise), under Triton's interpreter here and on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ignition.components.linear import (
    BLOCK_NS,
    ROWS_TILE,
    block_n,
    project,
    silu_mul,
    triton_rows_linear,
)


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


def _widths_agree(device: str, dtype: torch.dtype, n: int, k: int) -> None:
    x, w, b = _operands(device, dtype, n, k)
    outputs = [triton_rows_linear(x[:4], w, b, width) for width in BLOCK_NS]
    for other in outputs[1:]:
        assert torch.equal(other, outputs[0])


def test_the_tile_width_fills_the_sms() -> None:
    sms = 132
    assert block_n(151936, sms) == 64  # vocabulary heads, gate/up: 64 columns
    assert block_n(24576, sms) == 64
    assert block_n(6144, sms) == 32  # Qwen3-8B's qkv: 192 programs
    assert block_n(4096, sms) == 16  # its o and down: 256 programs, not 64
    assert block_n(576, sms) == 16  # too narrow to fill the SMs at any width
    assert block_n(64 * sms, sms) == 64


@pytest.mark.parametrize(("n", "k"), [(64, 128), (100, 200)])
def test_every_tile_width_computes_the_same_bits_interpreted(n: int, k: int) -> None:
    _widths_agree("cpu", torch.float32, n, k)


@pytest.mark.parametrize(("n", "k"), [(64, 128), (100, 200), (7, 33)])
def test_the_gated_projection_applies_silu_mul_and_is_batch_invariant_interpreted(
    n: int, k: int
) -> None:
    gen = torch.Generator().manual_seed(n + k)
    gate_up = torch.randn(ROWS_TILE, 2 * k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5
    b = torch.randn(n, generator=gen)
    gate, up = gate_up.double().chunk(2, dim=-1)
    reference = torch.nn.functional.linear(
        torch.nn.functional.silu(gate) * up, w.double(), b.double()
    )
    full = triton_rows_linear(gate_up, w, b, gated=True)
    assert (full.double() - reference).norm() / reference.norm() < 1e-5
    for rows in (1, 2, 3, 4):
        assert torch.equal(triton_rows_linear(gate_up[:rows], w, b, gated=True), full[:rows])
    outputs = [triton_rows_linear(gate_up[:4], w, b, width, gated=True) for width in BLOCK_NS]
    assert all(torch.equal(other, outputs[0]) for other in outputs[1:])
    # project(gated=True): the fused kernel for few rows, the unfused operations beyond.
    assert torch.equal(project(gate_up[:4], w, b, gated=True), full[:4])
    many = torch.randn(ROWS_TILE + 1, 2 * k, generator=gen)
    assert torch.allclose(project(many, w, b, gated=True), F.linear(silu_mul(many), w, b))
    with pytest.raises(ValueError, match="columns"):
        triton_rows_linear(gate_up[:, :k], w, b, gated=True)


def test_project_uses_cublas_beyond_the_tile() -> None:
    x = torch.randn(2, ROWS_TILE + 1, 8)
    w = torch.randn(5, 8)
    assert torch.allclose(project(x, w), torch.nn.functional.linear(x, w))


# bf16 operands, fp32 accumulation, one bf16 rounding of the output: ~4e-3 relative.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(960, 576), (49152, 576), (4096, 4096), (12288, 4096)])
def test_rows_linear_on_gpu(n: int, k: int) -> None:
    _check("cuda", torch.bfloat16, n, k, 8e-3)


# bf16: the fused activation rounds silu(gate) and the product as eager does, so the
# operand matches the unfused one but for a rare fp32 ulp of the sigmoid at a bf16
# rounding boundary; such an element moves outputs by far less than the one bf16
# rounding of each output (2**-8 relative), which bounds the difference.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(576, 1536), (4096, 12288)])
def test_the_gated_projection_matches_the_unfused_one_on_gpu(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n)
    gate_up = torch.randn(4, 2 * k, generator=gen).cuda().bfloat16()
    w = (torch.randn(n, k, generator=gen) / k**0.5).cuda().bfloat16()
    fused = project(gate_up, w, gated=True)
    unfused = triton_rows_linear(silu_mul(gate_up), w, None)
    error = (fused.double() - unfused.double()).norm() / unfused.double().norm()
    assert error < 2**-8, error
    for rows in (1, 2, 3):
        assert torch.equal(project(gate_up[:rows], w, gated=True), fused[:rows])


# The width only moves columns between programs: each element's K loop is the same.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(960, 576), (4096, 4096), (4096, 12288)])
def test_every_tile_width_computes_the_same_bits_on_gpu(n: int, k: int) -> None:
    _widths_agree("cuda", torch.bfloat16, n, k)


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
