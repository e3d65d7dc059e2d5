"""Prefill's residual additions made by the projection's GEMM into the residual
(``accumulate_project``): its values, when it takes the residual's storage, and that
Inductor keeps it in place, with no copy of the residual, where the residual is an
input of the compiled region or an intermediate of it (a decoder layer's two)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

from ignition.components.linear import INVARIANT_ROWS, accumulate_project

HIDDEN = 32


def _operands(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows)
    acc, x = (torch.randn(rows, HIDDEN, generator=generator) for _ in range(2))
    return acc, x, torch.randn(HIDDEN, HIDDEN, generator=generator)


def test_prefill_rows_are_summed_into_the_residual() -> None:
    acc, x, w = _operands(INVARIANT_ROWS + 1)
    expected = torch.addmm(acc, x, w.t())
    before = acc.clone()
    result = accumulate_project(acc, x, w)
    assert result.data_ptr() == acc.data_ptr()
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    assert not torch.equal(acc, before)


def test_decode_rows_and_biased_projections_leave_the_residual() -> None:
    for rows, bias in ((INVARIANT_ROWS, None), (INVARIANT_ROWS + 1, torch.ones(HIDDEN))):
        acc, x, w = _operands(rows)
        before = acc.clone()
        result = accumulate_project(acc, x, w, bias)
        assert result.data_ptr() != acc.data_ptr()
        assert torch.equal(acc, before)
        # float32: the residual kernel and the reference differ only in summation order
        torch.testing.assert_close(result, before + F.linear(x, w, bias), rtol=1e-5, atol=1e-5)


def _layer(hidden: torch.Tensor, w_o: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """A decoder layer's dataflow: the o projection into the layer's input, a norm of
    that, the down projection into it."""
    x = hidden[0]
    h = accumulate_project(x, torch.tanh(x), w_o)
    normed = F.rms_norm(h, (h.shape[-1],))
    return accumulate_project(h, torch.relu(normed), w_down).unsqueeze(0)


def test_inductor_keeps_both_additions_in_place_without_copies() -> None:
    acc, _, w_o = _operands(2 * INVARIANT_ROWS)
    w_down = torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(1))
    hidden = acc.unsqueeze(0)
    expected = _layer(hidden.clone(), w_o, w_down)
    compiled = torch.compile(_layer, fullgraph=True, dynamic=False)
    result, (code,) = run_and_get_code(compiled, hidden, w_o, w_down)
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
    # The layer's output is its input's storage, summed into twice.
    assert result.data_ptr() == hidden.data_ptr()
    calls = [line for line in code.splitlines() if "ops.flare.accumulate_linear" in line]
    assert len(calls) == 2, code
    # Both into the graph's input (arg0_1), neither into a copy of it.
    assert all("arg0_1" in line.split("(", 1)[1].split(",", 1)[0] for line in calls), calls
    assert ".copy_(" not in code and "clone" not in code, code


@pytest.mark.gpu
def test_cublas_sums_into_the_residual_as_accurately() -> None:
    """The 8B's down projection shape at 512 rows, bf16 on the GPU: the in-place GEMM
    gives ``torch.addmm``'s bits (the same cuBLAS product, beta 1), its mean error from
    the exact sum is no larger than the canonical GEMM-then-addition's, and it replays
    in a CUDA graph with the same bits.

    Two earlier bounds failed on an H100. Half a bf16 ulp per element: cuBLAS may
    reduce in reduced precision (``allow_bf16_reduced_precision_reduction``, torch's
    default), so the product's own error is not the fp32 dot's
    (``bench/results/issue23/2026-12-06k-h100-prefill-accumulate/pytest-gpu.log``).
    A strictly smaller mean error than the canonical's: both were 0.0021, the final
    bf16 rounding of a sum of magnitude about 1.4 (a quarter of its ulp) dominating
    (``bench/results/issue23/2026-12-06m-h100-accumulate-mimalloc/``). The margin
    allowed is the mean's sampling spread: 2M elements, under 0.1%, taken as 1%."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, k, n = 512, 12288, 4096
    acc, x = (torch.randn(rows, d, device="cuda", generator=generator) for d in (n, k))
    w = torch.randn(n, k, device="cuda", generator=generator) / k**0.5
    acc, x, w = acc.bfloat16(), x.bfloat16(), w.bfloat16()
    exact = acc.double() + x.double() @ w.double().t()
    eager = accumulate_project(acc.clone(), x, w)
    assert torch.equal(eager, torch.addmm(acc, x, w.t()))
    canonical = acc + F.linear(x, w)
    error = (eager.double() - exact).abs().mean().item()
    canonical_error = (canonical.double() - exact).abs().mean().item()
    print(f"mean error: in place {error:.6g}, canonical {canonical_error:.6g}")
    assert error <= canonical_error * 1.01, (error, canonical_error)
    residual = acc.clone()
    graph = torch.cuda.CUDAGraph()
    accumulate_project(residual.clone(), x, w)  # cuBLAS's workspace before capture
    with torch.cuda.graph(graph):
        accumulate_project(residual, x, w)
    residual.copy_(acc)
    graph.replay()
    assert torch.equal(residual, eager)
