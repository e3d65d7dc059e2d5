"""The batch-invariant decode projection: accuracy, and a row's result independent of
its batch (bitwise), under Triton's interpreter here and on the GPU."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from fractions import Fraction

import numpy as np
import pytest
import torch

from bench.rows_linear_bench import launch
from ignition.components import linear
from ignition.components.linear import (
    BLOCK_NS,
    GATED_NARROWEST,
    INVARIANT_ROWS,
    PIPELINE_BYTES,
    ROWS_TILE,
    SQUARE_GROUP,
    STAGES,
    ProjectedLinear,
    RowStatistic,
    fills_the_device,
    fitted_block_k,
    fold_gain,
    gated_project,
    gated_tile_shape,
    group_squares,
    invariant_project,
    pipeline_stages,
    project,
    project_linears,
    project_squares,
    row_tiles,
    split_shape,
    tile_shape,
    triton_rows_gated,
    triton_rows_linear,
    triton_rows_split_linear,
    wave_fill,
)


@pytest.fixture(autouse=True)
def _row_invariant_interpreted_dot(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Under Triton's interpreter ``tl.dot`` is numpy's matmul, and the host's BLAS may
    round a row differently by its position in the tile: OpenBLAS's sgemm on an AMD
    EPYC development machine computes rows 6-11 of a 16-row tile with another
    kernel than the rest, one float32 ulp apart. The GPU's MMA sums every row's
    products in the same order. This dot does too (each output element accumulates
    its K products in order, elementwise), so the interpreted tests check the
    kernels' own batch invariance rather than the host BLAS's."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # type: ignore[no-untyped-def]
        dtype = d.data.dtype
        x, y = a.data.astype(dtype), b.data.astype(dtype)
        out = np.zeros(
            np.broadcast_shapes((*x.shape[:-1], 1), (*y.shape[:-2], 1, y.shape[-1])), dtype
        )
        for k in range(x.shape[-1]):
            out += x[..., :, k : k + 1] * y[..., k : k + 1, :]
        return interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    yield


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
    # One K step for every width (the default would fit each width's own pipeline:
    # 256 columns at 64, 512 at 32 for the 8B's down projection), one that fits all.
    x, w, b = _operands(device, dtype, n, k)
    block_k = fitted_block_k(512, k, max(BLOCK_NS), w.element_size())
    outputs = [triton_rows_linear(x[:4], w, b, width, block_k=block_k) for width in BLOCK_NS]
    for other in outputs[1:]:
        assert torch.equal(other, outputs[0])


def test_the_tile_keeps_the_weight_stream_in_flight() -> None:
    sms = 132
    # Vocabulary heads and gate/up: 64 columns, several programs per SM, short K steps.
    assert tile_shape(151936, 4096, sms) == (64, 128)
    assert tile_shape(24576, 4096, sms) == (64, 128)
    assert tile_shape(49152, 576, sms) == (64, 128)
    # Qwen3-8B's qkv: 96 programs of 64 columns fill as much of their wave as 192 of
    # 32 do of their two: the wider; one program per SM, 512-column K steps halved for
    # the shared memory.
    assert tile_shape(6144, 4096, sms) == (64, 256)
    # Its o and down: 128 programs, one per SM, 512-column K steps.
    assert tile_shape(4096, 4096, sms) == (32, 512)
    assert tile_shape(4096, 12288, sms) == (32, 512)
    # More than half the SMs idle at 32 columns: 16, the most programs. K in one step
    # where it fits, else in steps of at most a third of K, so the pipeline fills:
    # SmolLM2's qkv and down.
    assert tile_shape(960, 576, sms) == (16, 128)
    assert tile_shape(576, 1536, sms) == (16, 512)
    assert tile_shape(576, 200, sms) == (16, 256)
    assert tile_shape(64, 33, sms) == (16, 64)
    # ``narrowest`` where 32 columns would leave SMs idle (``fills_the_device`` counts
    # at 32).
    assert tile_shape(1024, 576, sms) == (16, 128)
    assert tile_shape(1024, 576, sms, narrowest=GATED_NARROWEST) == (32, 128)
    # The gated kernel at one row tile: the widest, halves of 32 columns, its K step
    # that width's; past one row tile as a plain weight's (SmolLM2's gate/up: 32).
    assert gated_tile_shape(1024, 576, sms) == (64, 128)
    assert gated_tile_shape(3072, 576, sms) == (64, 128)
    assert gated_tile_shape(24576, 4096, sms) == (64, 128)
    assert gated_tile_shape(3072, 576, sms, tiles=4, step_fixes_bits=False) == (32, 128)
    # One 64-column program per SM: 512-column steps of bf16 would overflow shared
    # memory (4 stages of 80 KiB), so 256; fp32 halves the steps again.
    assert tile_shape(64 * sms, 4096, sms) == (64, 256)
    assert tile_shape(64 * sms, 4096, sms, itemsize=4) == (64, 128)
    assert tile_shape(4096, 4096, sms, itemsize=4) == (32, 256)
    # The edge: 32-column programs for half the SMs, or 16-column ones for more.
    assert tile_shape(32 * (sms // 2), 4096, sms)[0] == 32
    assert tile_shape(32 * (sms // 2 - 1), 4096, sms)[0] == 16
    # A wave of 64-column programs and one more: 32 columns fill their three waves
    # better (265 of 396 slots against 133 of 264); a last wave more than half full
    # keeps 64 columns.
    assert tile_shape(64 * sms + 1, 4096, sms) == (32, 128)
    assert tile_shape(2 * 64 * sms + 1, 4096, sms) == (32, 128)
    assert tile_shape(64 * (sms + sms // 2 + 1), 4096, sms) == (64, 256)
    assert tile_shape(64 * (sms + sms // 2), 4096, sms) == (32, 128)


def test_wave_fill_is_the_share_of_slots_the_programs_take() -> None:
    # The 8B's qkv on 132 SMs: 96 programs of one wave, or 192 of two: a tie.
    assert wave_fill(6144, 64, 132) == wave_fill(6144, 32, 132) == Fraction(96, 132)
    # Its o: 64 programs of one wave against 128 of one.
    assert wave_fill(4096, 64, 132) == Fraction(64, 132)
    assert wave_fill(4096, 32, 132) == Fraction(128, 132)
    assert wave_fill(1, 64, 132) == Fraction(1, 132)
    assert wave_fill(0, 64, 132) == 0  # no programs, no waves


def test_a_k_step_fits_the_pipeline_of_its_width() -> None:
    assert fitted_block_k(512, 12288, 32, 2) == 512
    assert fitted_block_k(512, 12288, 64, 2) == 256  # 4 stages of 80 KiB do not fit
    assert fitted_block_k(512, 12288, 16, 2) == 512
    assert fitted_block_k(512, 12288, 16, 4) == 256  # fp32: 4 stages of 64 KiB
    assert fitted_block_k(512, 100, 16, 2) == 128  # one step
    assert fitted_block_k(128, 300, 16, 2) == 64  # three full steps
    assert fitted_block_k(512, 1535, 32, 2) == 256
    assert fitted_block_k(512, 1536, 32, 2) == 512


@pytest.mark.parametrize(("n", "k"), [(64, 128), (100, 200)])
def test_every_tile_width_computes_the_same_bits_interpreted(n: int, k: int) -> None:
    _widths_agree("cpu", torch.float32, n, k)


def test_the_tile_bench_launches_the_serving_kernel_interpreted() -> None:
    x, w, _ = _operands("cpu", torch.float32, 64, 128)
    for tile in ((16, 128, 3, 4), (64, 128, 4, 8)):  # the same K loop: the same bits
        y = torch.empty(4, 64)
        launch(x[:4], w, y, tile)()
        assert torch.equal(y, triton_rows_linear(x[:4], w, None, block_k=128))


@pytest.mark.parametrize("block_k", [128, 256, 512])
def test_every_k_step_matches_and_is_batch_invariant_interpreted(block_k: int) -> None:
    x, w, b = _operands("cpu", torch.float32, 48, 600)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_linear(x, w, b, block_k=block_k)
    assert (full.double() - reference).norm() / reference.norm() < 1e-5
    for rows in (1, 3):
        part = triton_rows_linear(x[:rows], w, b, block_k=block_k)
        assert torch.equal(part, full[:rows])


def _check_gated(device: str, dtype: torch.dtype, n: int, k: int, tolerance: float) -> None:
    """The fused gate/up kernel against float64 ``silu(gate) * up`` of the same
    operands (each projection rounded to ``dtype`` first, as the kernel and eager do),
    and each row's result independent of its batch, bitwise."""
    x, w, _ = _operands(device, dtype, 2 * n, k)
    gate, up = torch.nn.functional.linear(x, w).chunk(2, dim=-1)  # rounded to dtype
    reference = torch.nn.functional.silu(gate.double()) * up.double()
    full = triton_rows_gated(x, w)
    error = (full.double() - reference).norm() / reference.norm()
    assert error < tolerance, error
    for rows in (1, 2, 3):
        for start in range(0, ROWS_TILE - rows + 1, 5):
            part = triton_rows_gated(x[start : start + rows], w)
            assert torch.equal(part, full[start : start + rows])


# fp32 operands and accumulation: far under 1e-5 for K <= 200.
@pytest.mark.parametrize(("n", "k"), [(64, 128), (50, 200), (7, 33)])
def test_rows_gated_matches_and_is_batch_invariant_interpreted(n: int, k: int) -> None:
    _check_gated("cpu", torch.float32, n, k, 1e-5)


def test_gated_project_is_the_canonical_mlp_activation() -> None:
    x, w, _ = _operands("cpu", torch.float32, 2 * 24, 40)
    gate, up = torch.nn.functional.linear(x, w).chunk(2, dim=-1)
    expected = torch.nn.SiLU()(gate) * up
    copies = INVARIANT_ROWS // ROWS_TILE + 1
    for rows in (INVARIANT_ROWS, INVARIANT_ROWS + 1):  # the fused kernel, then cuBLAS
        many = torch.cat([x] * copies)[:rows].view(1, rows, -1)
        got = gated_project(many, w, torch.nn.SiLU())
        torch.testing.assert_close(got[0], torch.cat([expected] * copies)[:rows])
    with pytest.raises(ValueError, match="packed pair"):
        triton_rows_gated(x, w[:-1])


def test_rows_gated_widths_give_the_same_bits_interpreted() -> None:
    # The packed tile's width (bench/rows_linear_bench.py --widths) changes no bit at the
    # default's K step; a half narrower than a dot's least dimension is refused.
    x, w, _ = _rows_operands(2 * 96, 80, 3, "cpu", torch.float32)
    outputs = [triton_rows_gated(x, w, width=width) for width in (64, 32)]
    assert torch.equal(outputs[0], outputs[1])
    torch.testing.assert_close(outputs[0], triton_rows_gated(x, w))
    with pytest.raises(ValueError, match="half is at least 16"):
        triton_rows_gated(x, w, width=16)


class _Grids:
    """A kernel stand-in recording each launch's grid."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        self.grids.append(grid)
        return lambda *args, **kwargs: None


def test_the_gated_kernel_takes_the_widest_tile_on_many_sms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On 132 SMs a plain weight of 1024 rows takes 16-column tiles; the packed gate/up
    # of 512 columns a half takes 64 (32 a half: 16 programs).
    monkeypatch.setattr(linear, "_sm_count", lambda device: 132)
    kernels = _Grids()
    monkeypatch.setattr(linear, "_rows_gated_kernel", kernels)
    x, w, _ = _rows_operands(1024, 576, 1, "cpu", torch.float32)
    triton_rows_gated(x, w)
    assert kernels.grids == [(1, 512 // 32)]


def test_project_uses_cublas_beyond_the_invariant_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, INVARIANT_ROWS // 2 + 1, 8)
    monkeypatch.setattr(linear, "rows_linear", None)  # not called
    w = torch.randn(5, 8)
    assert torch.allclose(project(x, w), torch.nn.functional.linear(x, w))


def _eager_norm(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's and Qwen3's RMSNorm: the fp32 statistic, the normalized vector rounded
    to x's dtype, times the gain."""
    f = x.float()
    return gain * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _check_fused(device: str, dtype: torch.dtype, n: int, k: int, tolerance: float) -> None:
    """The decode layer's fusions against eager's composition on the same operands:
    the norm's statistic from the rows' partial squares, its gain folded into the
    weight (``residual + linear(rms_norm(x))``, and the gated projection of the
    normalized rows); the residual epilogue and the partial squares it leaves. Each
    row's result, squares included, independent of its batch, bitwise."""
    x, w, b = _operands(device, dtype, n, k)
    gen = torch.Generator().manual_seed(k)
    gain = (1 + torch.randn(k, generator=gen) / 4).to(device, dtype)
    x = x * torch.linspace(0.1, 10, ROWS_TILE, dtype=dtype, device=device)[:, None]
    residual = torch.randn(ROWS_TILE, n, generator=gen).to(device, dtype)
    gate_up = torch.cat([w, w.flip(0)])
    folded, folded_gate_up = w.clone(), gate_up.clone()
    fold_gain(folded, gain)
    fold_gain(folded_gate_up, gain)
    squares = group_squares(x)  # x's partial squares (the producer's, in torch's order)

    def norm(rows: slice) -> RowStatistic:
        return RowStatistic(squares[rows], 1e-6)

    def with_squares(rows: slice) -> torch.Tensor:
        out = torch.empty(len(x[rows]), n // SQUARE_GROUP, device=device)
        triton_rows_linear(x[rows], w, b, residual=residual[rows], squares=out)
        return out

    linear = torch.nn.functional.linear
    normalized = _eager_norm(x, gain, 1e-6)
    cases = (
        (
            lambda rows: triton_rows_linear(
                x[rows], folded, b, norm=norm(rows), residual=residual[rows]
            ),
            residual + linear(normalized, w, b),
        ),
        (
            lambda rows: triton_rows_linear(x[rows], folded, b, norm=norm(rows)),
            linear(normalized, w, b),
        ),
        (
            lambda rows: triton_rows_linear(x[rows], w, None, residual=residual[rows]),
            residual + linear(x, w),
        ),
        (
            lambda rows: triton_rows_gated(x[rows], folded_gate_up, norm(rows)),
            torch.nn.functional.silu(linear(normalized, w)) * linear(normalized, w.flip(0)),
        ),
        # The squares of the rounded result, summed in another order: fp32 ulps.
        (with_squares, group_squares(triton_rows_linear(x, w, b, residual=residual))),
    )
    for run, reference in cases:
        full = run(slice(None))
        error = (full.double() - reference.double()).norm() / reference.double().norm()
        assert error < tolerance, error
        for rows in (1, 3):
            for start in (0, 7):
                part = run(slice(start, start + rows))
                assert torch.equal(part, full[start : start + rows])


# fp32: the norm scales the sums instead of the operand and the gain is folded into
# the weight; a few ulps from eager.
@pytest.mark.parametrize(("n", "k"), [(64, 128), (48, 208)])
def test_norm_statistic_and_residual_epilogue_interpreted(n: int, k: int) -> None:
    _check_fused("cpu", torch.float32, n, k, 1e-5)


def test_partial_squares_follow_no_tile_interpreted() -> None:
    # The producer's tile follows the row count (``many_rows_tile``); its partial
    # squares, each 16 columns summed by one spelled-out tree, must not.
    x, w, b = _rows_operands(64, 96, 5, "cpu", torch.float32)
    sums = []
    for width in BLOCK_NS:
        out = torch.empty(5, 64 // SQUARE_GROUP)
        triton_rows_linear(x, w, b, width=width, squares=out)
        sums.append(out)
    assert all(torch.equal(s, sums[0]) for s in sums)
    torch.testing.assert_close(sums[0], group_squares(triton_rows_linear(x, w, b)))


# The compiled tile's layout follows its width; the squares' tree must not.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(576, 576), (4096, 12288)])
def test_partial_squares_follow_no_tile_on_gpu(n: int, k: int) -> None:
    x, w, b = _rows_operands(n, k, 2 * ROWS_TILE + 3, "cuda", torch.bfloat16)
    residual = torch.randn(len(x), n).to("cuda", torch.bfloat16)
    sums = []
    for width in BLOCK_NS:
        out = torch.empty(len(x), n // SQUARE_GROUP, device="cuda")
        triton_rows_linear(x, w, b, width=width, residual=residual, squares=out)
        sums.append(out)
    assert all(torch.equal(s, sums[0]) for s in sums)
    y = triton_rows_linear(x, w, b, residual=residual)
    torch.testing.assert_close(sums[0], group_squares(y), rtol=1e-5, atol=0)


def test_project_fuses_the_norm_and_residual_only_for_decode_rows() -> None:
    x, w, b = _operands("cpu", torch.float32, 32, 48)
    gain = torch.rand(48) + 0.5
    folded = w.clone()
    fold_gain(folded, gain)
    residual = torch.randn(ROWS_TILE, 32)
    copies = INVARIANT_ROWS // ROWS_TILE + 1
    for rows in (INVARIANT_ROWS, INVARIANT_ROWS + 1):  # the fused kernel, then eager
        many = torch.cat([x] * copies)[:rows].view(1, rows, -1)
        extra = torch.cat([residual] * copies)[:rows].view(1, rows, -1)
        norm = RowStatistic(group_squares(many[0]), 1e-5)
        got = project(many, folded, b, norm=norm, residual=extra)
        expected = extra + torch.nn.functional.linear(_eager_norm(many, gain, 1e-5), w, b)
        torch.testing.assert_close(got, expected)
    y, squares = project_squares(x, w, b, residual=residual)
    torch.testing.assert_close(squares, group_squares(y))
    with pytest.raises(ValueError, match="squares"):
        triton_rows_linear(x, w, b, norm=RowStatistic(torch.ones(ROWS_TILE, 2), 1e-5))
    with pytest.raises(ValueError, match="squares"):
        triton_rows_linear(x, w, b, squares=torch.empty(ROWS_TILE, 3))
    with pytest.raises(ValueError, match="residual"):
        triton_rows_linear(x, w, b, residual=residual[:, :23])
    with pytest.raises(ValueError, match="at most"):
        project_squares(torch.zeros(1, INVARIANT_ROWS + 1, 48), w)
    with pytest.raises(ValueError, match="fold"):
        fold_gain(folded, gain[:-1])


# bf16 operands, fp32 accumulation, one bf16 rounding of the output: ~4e-3 relative.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(960, 576), (49152, 576), (4096, 4096), (12288, 4096)])
def test_rows_linear_on_gpu(n: int, k: int) -> None:
    _check("cuda", torch.bfloat16, n, k, 8e-3)


# bf16: one rounding of each projection, of the activation and of the product.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(1536, 576), (12288, 4096)])
def test_rows_gated_on_gpu(n: int, k: int) -> None:
    _check_gated("cuda", torch.bfloat16, n, k, 8e-3)


# bf16: the fused norm rounds the weight times the gain once where eager rounds the
# normalized x and its product with the gain, and scales the fp32 sums; about one
# operand rounding from eager's result.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(576, 576), (4096, 4096)])
def test_norm_statistic_and_residual_epilogue_on_gpu(n: int, k: int) -> None:
    _check_fused("cuda", torch.bfloat16, n, k, 8e-3)


# A decode step reads each MLP weight once; copying those bytes also writes them, so
# the MLP (gate/up projection, activation, down projection) must take less time than
# a copy. Applying the activation inside the down projection's operand load once made
# it 2.9x slower than the copy at this shape (359 us for the down projection alone).
@pytest.mark.gpu
def test_the_decode_mlp_reads_its_weights_faster_than_a_copy_on_gpu() -> None:
    from bench.cuda_timing import median_graph_ms
    from recipes.llama import PackedMLP

    hidden, intermediate = 4096, 12288  # Qwen3-8B
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(2 * intermediate, hidden, device="cuda", generator=gen).bfloat16()
    down = torch.nn.Linear(intermediate, hidden, bias=False, device="cuda", dtype=torch.bfloat16)
    mlp = PackedMLP(gate_up, down, torch.nn.SiLU())
    x = torch.randn(1, 1, hidden, device="cuda", generator=gen).bfloat16()
    weights = (gate_up, down.weight)
    copies = [torch.empty_like(w) for w in weights]
    with torch.no_grad():
        mlp_ms = median_graph_ms([lambda: mlp(x)])
        copy_ms = median_graph_ms(
            [lambda: [c.copy_(w) for c, w in zip(copies, weights, strict=True)]]
        )
    assert mlp_ms < copy_ms, (mlp_ms, copy_ms)


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


def test_narrow_projections_split_k_at_any_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # The hybrid's decode projections at the H200 geometry on 132 SMs: the fixed-tile
    # kernel for those whose grid gives at least half the SMs a program, the K split
    # for the rest (cuBLAS at 16 padded rows took 8 to 12 us for the 6.6 MB ones,
    # bench/results/issue22/2026-12-03-h200-invariance).
    monkeypatch.setattr(linear, "_sm_count", lambda device: 132)
    cpu = torch.device("cpu")
    wide = [(16480, 2560), (2560, 6144), (11392, 2560), (2560, 640), (10240, 64)]
    narrow = [(128, 2560), (324, 10240), (1281, 2560), (1409, 2560)]  # and with the router
    assert all(fills_the_device(n, k, cpu) for n, k in wide)
    assert not any(fills_the_device(n, k, cpu) for n, k in narrow)
    # Near one program per SM: 11 column tiles x 12 ranges, 41 x 3, 4 x 10.
    assert split_shape(324, 10240, 132) == (32, 128, 896)
    assert split_shape(1281, 2560, 132) == (32, 128, 896)
    assert split_shape(128, 2560, 132) == (32, 128, 256)
    assert split_shape(1409, 2560, 132) == (32, 128, 1280)  # 45 x 2
    # At most 32 ranges; a K shorter than two steps in one.
    assert split_shape(1, 65536, 132) == (32, 128, 2048)
    assert split_shape(8, 100, 132) == (32, 128, 128)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(128, 2560, generator=gen) / 50
    calls: list[tuple[int, ...]] = []
    real_linear = torch.nn.functional.linear

    def spy(a: torch.Tensor, *rest: object) -> torch.Tensor:
        calls.append(tuple(a.shape))
        return real_linear(a, *rest)

    monkeypatch.setattr(linear.F, "linear", spy)
    for rows in (1, 3, INVARIANT_ROWS):
        x = torch.randn(rows, 2560, generator=gen)
        torch.testing.assert_close(invariant_project(x, w), real_linear(x, w))
    assert not calls  # interpreted: the split kernels, never cuBLAS
    x = torch.randn(INVARIANT_ROWS + 1, 2560, generator=gen)
    invariant_project(x, w)
    assert calls == [(INVARIANT_ROWS + 1, 2560)]


def _many_rows_agree(run: Callable[[slice], torch.Tensor], rows: int) -> None:
    """``run`` over all ``rows`` operand rows (several row tiles) against it over
    smaller batches that start anywhere, in other tiles: the same bits for every row."""
    full = run(slice(None))
    for count in (1, 3, ROWS_TILE + 1):
        for start in (0, 5, ROWS_TILE - 1, rows - count):
            assert torch.equal(run(slice(start, start + count)), full[start : start + count])


def _rows_operands(n: int, k: int, rows: int, device: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, b


# fp32 through fp32 partials: far under 1e-5 for K <= 600.
@pytest.mark.parametrize("k_split", [128, 256, 640])
def test_the_k_split_matches_and_is_batch_invariant_interpreted(k_split: int) -> None:
    x, w, b = _rows_operands(40, 600, 2 * ROWS_TILE + 5, "cpu", torch.float32)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_split_linear(x, w, b, k_split=k_split)
    assert (full.double() - reference).norm() / reference.norm() < 1e-5
    _many_rows_agree(lambda r: triton_rows_split_linear(x[r], w, b, k_split=k_split), len(x))
    no_bias = triton_rows_split_linear(x, w, None, k_split=k_split)
    assert (no_bias.double() - (reference - b.double())).norm() / reference.norm() < 1e-5
    with pytest.raises(ValueError, match="whole 128-column steps"):
        triton_rows_split_linear(x, w, b, k_split=k_split + 64)
    with pytest.raises(ValueError, match="exceed"):
        triton_rows_split_linear(torch.zeros(INVARIANT_ROWS + 1, 600), w, b)


def test_rows_past_one_tile_are_batch_invariant_interpreted() -> None:
    # A decode step at 32 or 64 requests: the rows in tiles of ROWS_TILE, each row's
    # bits those of the same request decoded alone or in any other batch.
    x, w, b = _rows_operands(48, 208, 2 * ROWS_TILE + 5, "cpu", torch.float32)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_linear(x, w, b)
    assert (full.double() - reference).norm() / reference.norm() < 1e-5
    _fused_rows_agree(x, w, b, 1e-5)
    with pytest.raises(ValueError, match="exceed"):
        triton_rows_linear(torch.zeros(INVARIANT_ROWS + 1, 208), w, b)


def _fused_rows_agree(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> None:
    """The decode layer's fused kernels (the norm's statistic, the residual and the
    partial squares it leaves) give every row the same bits at every batch."""
    squares = group_squares(x)
    residual = torch.randn(len(x), w.shape[0]).to(x.device, x.dtype)
    gate_up = torch.cat([w, w.flip(0)])

    def with_squares(rows: slice) -> torch.Tensor:
        out = torch.empty(len(x[rows]), w.shape[0] // SQUARE_GROUP, device=x.device)
        triton_rows_linear(x[rows], w, b, residual=residual[rows], squares=out)
        return out

    _many_rows_agree(lambda r: triton_rows_linear(x[r], w, b), len(x))
    _many_rows_agree(
        lambda r: triton_rows_linear(
            x[r], w, b, norm=RowStatistic(squares[r], eps), residual=residual[r]
        ),
        len(x),
    )
    _many_rows_agree(with_squares, len(x))
    _many_rows_agree(
        lambda r: triton_rows_gated(x[r], gate_up, RowStatistic(squares[r], eps)), len(x)
    )


def test_the_interpreter_keeps_one_row_tiles_k_step_interpreted() -> None:
    # Interpreted, a dot sums its K step apart and adds it to the accumulator, so the
    # shorter step the GPU takes past one row tile (128 columns to 64 here) would
    # change a row's bits with the row count; the interpreter keeps one tile's step.
    x, w, b = _rows_operands(200, 600, 2 * ROWS_TILE + 8, "cpu", torch.float32)
    assert tile_shape(200, 600, 1, 4, 3, step_fixes_bits=False)[1] < tile_shape(200, 600, 1, 4)[1]
    _many_rows_agree(lambda r: triton_rows_linear(x[r], w, b), len(x))


def test_one_program_takes_every_row_tile_of_a_decode_step() -> None:
    # Each weight tile is read once whatever the row count: a step's rows all go to one
    # program per column tile (at 64 rows in 16-row tiles, four re-reads of every
    # weight made the Qwen3-8B projections 2x slower than at 16 on the H200).
    assert [row_tiles(rows) for rows in (1, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 3, 4]
    assert row_tiles(INVARIANT_ROWS) * ROWS_TILE == INVARIANT_ROWS
    # More row tiles shorten the pipeline; every tile's fits the shared memory at
    # every serving shape (SmolLM2-135M and Qwen3-8B on 132 SMs).
    shapes = [(960, 576), (3072, 576), (49152, 576), (6144, 4096), (24576, 4096), (4096, 12288)]
    for n, k in shapes:
        assert pipeline_stages(1, *tile_shape(n, k, 132), 2) == STAGES
        for tiles in range(1, row_tiles(INVARIANT_ROWS) + 1):
            for fixed in (False, True):
                width, block_k = tile_shape(n, k, 132, 2, tiles, fixed)
                stages = pipeline_stages(tiles, width, block_k, 2)
                assert 2 <= stages <= STAGES
                assert stages * (tiles * ROWS_TILE + width) * block_k * 2 <= PIPELINE_BYTES


def test_past_one_row_tile_the_tile_fills_its_waves_and_steps_shorter() -> None:
    # bench/rows_linear_bench.py --many-rows on the H200 (132 SMs), Qwen3-8B at 32 and
    # 64 rows: qkv's 96 programs of 64 columns fill one wave as well as 192 of 32 fill
    # two and ran faster; o and down keep 32 columns (64 would leave half the SMs
    # idle) and step 256 columns, not 512; gate/up steps 64 at three or four tiles.
    sms = 132
    assert tile_shape(6144, 4096, sms, 2, 2, False) == (64, 256)
    assert tile_shape(4096, 4096, sms, 2, 4, False) == (32, 256)
    assert tile_shape(4096, 12288, sms, 2, 2, False) == (32, 256)
    assert tile_shape(24576, 4096, sms, 2, 2, False) == (64, 128)
    assert tile_shape(24576, 4096, sms, 2, 4, False) == (64, 64)
    # Where the K step fixes the bits (a fused norm's statistic, the interpreter's
    # dot), one row tile's step stays: only the width may change.
    for n, k in [(6144, 4096), (4096, 4096), (4096, 12288), (24576, 4096), (960, 576)]:
        one = tile_shape(n, k, sms)
        for tiles in (2, 3, 4):
            assert tile_shape(n, k, sms, 2, tiles, True)[1] == one[1]
    assert tile_shape(6144, 4096, sms, 2, 4, True) == (64, 256)
    # One tile: unchanged whatever the flag.
    assert tile_shape(4096, 4096, sms, 2, 1, False) == (32, 512)


def test_project_linears_swaps_plain_linears_in_place() -> None:
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    names = [name for name, _ in model.named_parameters()]
    x = torch.randn(3, 64)
    want = model(x)
    assert project_linears(model) == 2
    assert all(type(m) is ProjectedLinear for m in (model[0], model[2]))
    assert [name for name, _ in model.named_parameters()] == names
    assert model[0].in_features == 64
    # Through the fixed-tile kernel (interpreted here): float32 accumulation in
    # another order.
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)
    assert project_linears(model) == 0


# bf16 operands, fp32 partials summed in order, one rounding: ~4e-3 relative.
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(324, 10240), (1409, 2560), (128, 2560)])
def test_the_k_split_matches_and_is_batch_invariant_on_gpu(n: int, k: int) -> None:
    x, w, b = _rows_operands(n, k, 2 * ROWS_TILE + 5, "cuda", torch.bfloat16)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_split_linear(x, w, b)
    assert (full.double() - reference).norm() / reference.norm() < 8e-3
    _many_rows_agree(lambda r: triton_rows_split_linear(x[r], w, b), len(x))


# (4096, 4096) steps 512 columns at one row tile and 256 past two; (960, 576) is 16
# columns wide at one row tile and 32 past it (``many_rows_tile``).
@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(960, 576), (4096, 4096), (6144, 4096)])
def test_rows_past_one_tile_are_batch_invariant_on_gpu(n: int, k: int) -> None:
    x, w, b = _rows_operands(n, k, INVARIANT_ROWS, "cuda", torch.bfloat16)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    full = triton_rows_linear(x, w, b)
    assert (full.double() - reference).norm() / reference.norm() < 8e-3
    _fused_rows_agree(x, w, b, 1e-6)
    gate_up = torch.cat([w, w.flip(0)])
    _many_rows_agree(lambda r: triton_rows_gated(x[r], gate_up), len(x))


# ---------------------------------------------------------------- early weights


def _early_weights_agree(
    device: str, dtype: torch.dtype, n: int, k: int, launch: Callable[[bool], object]
) -> None:
    """Each row projection (plain; with norm, residual and squares; gated) gives the
    same bits with early weights as without, at one and at several row tiles:
    ``launch(early)`` is the context a run takes."""
    x, w, b = _rows_operands(n, k, 2 * ROWS_TILE + 3, device, dtype)
    residual = torch.randn(x.shape[0], n, generator=torch.Generator().manual_seed(1))
    residual = residual.to(device, dtype)
    # The projections that read y (n columns) normalized by its partial squares.
    _, w_y, _ = _rows_operands(n, n, 1, device, dtype)
    gate_up = torch.cat([w_y, w_y.flip(0)])

    def run(rows: int) -> list[torch.Tensor]:
        squares = torch.empty(rows, n // SQUARE_GROUP, device=device)
        y = triton_rows_linear(x[:rows], w, b, residual=residual[:rows], squares=squares)
        norm = RowStatistic(squares, 1e-6)
        return [
            triton_rows_linear(x[:rows], w, b),
            y,
            squares,
            triton_rows_linear(y, w_y, None, norm=norm),
            triton_rows_gated(y, gate_up, norm),
        ]

    for rows in (1, ROWS_TILE + 1, x.shape[0]):
        with launch(False):  # type: ignore[attr-defined]
            late = run(rows)
        with launch(True):  # type: ignore[attr-defined]
            early = run(rows)
        for a, e in zip(late, early, strict=True):
            assert torch.equal(a, e)


def _interpreted_launch(
    monkeypatch: pytest.MonkeyPatch, early_runs: list[int] | None = None
) -> Callable[[bool], object]:
    """The kernels' options under the interpreter as a programmatic launch sets them
    on the GPU (there is no launch to ask for: the interpreter runs every kernel after
    the one before). ``early_runs`` collects the early steps of each launch that
    loads some early."""
    from contextlib import contextmanager

    @contextmanager
    def launch(early: bool) -> Iterator[None]:
        def options(device: torch.device, early_steps: int = 0) -> dict[str, bool | int]:
            if early and early_steps and early_runs is not None:
                early_runs.append(early_steps)
            return {"PDL": True, "EARLY_WEIGHTS": early_steps if early else 0}

        with monkeypatch.context() as patch:
            patch.setattr(linear, "kernel_options", options)
            yield

    return launch


# K a whole number of steps, one step and a masked last step, and K under one step.
@pytest.mark.parametrize(("n", "k"), [(64, 256), (48, 208), (32, 48)])
def test_early_weights_compute_the_same_bits_interpreted(
    monkeypatch: pytest.MonkeyPatch, n: int, k: int
) -> None:
    runs: list[int] = []
    _early_weights_agree("cpu", torch.float32, n, k, _interpreted_launch(monkeypatch, runs))
    # The four launches of one row loaded early; those of 17 and 35 rows, past one
    # row tile, load none (early_steps).
    assert len(runs) == 4, runs


def test_early_weights_take_the_last_k_steps_interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    # The last steps' tiles are the ones loaded early: a weight whose columns are
    # loaded twice (or not at all) would show in the result. 700 columns are 6, 3 and
    # 2 steps of 128, 256 and 512; every count of early steps the kernels take.
    # Three row tiles: the kernels take early steps at any, early_steps gives none
    # past one.
    x, w, b = _rows_operands(32, 700, 2 * ROWS_TILE + 3, "cpu", torch.float32)
    reference = torch.nn.functional.linear(x.double(), w.double(), b.double())
    gate_up = torch.cat([w, w.flip(0)])
    gated = torch.nn.functional.silu(x @ w.T) * (x @ w.flip(0).T)
    runs: list[int] = []
    for steps in range(1, linear.EARLY_STEPS + 1):
        # That many, or as many as there are (linear.early_steps' bounds).
        def forced(
            k: int, block_k: int, size: int, most: int, tiles: int = 1, steps: int = steps
        ) -> int:
            return min(steps, most, -(-k // block_k))

        monkeypatch.setattr(linear, "early_steps", forced)
        launch = _interpreted_launch(monkeypatch, runs)
        with launch(False):  # type: ignore[attr-defined]
            late = [triton_rows_linear(x, w, b, block_k=bk) for bk in (128, 256, 512)]
            late.append(triton_rows_gated(x, gate_up))
        with launch(True):  # type: ignore[attr-defined]
            early = [triton_rows_linear(x, w, b, block_k=bk) for bk in (128, 256, 512)]
            early.append(triton_rows_gated(x, gate_up))
        for y in early[:-1]:
            torch.testing.assert_close(y.double(), reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(early[-1], gated, rtol=1e-5, atol=1e-5)
        for a, e in zip(late, early, strict=True):
            assert torch.equal(a, e), steps
    assert sorted(set(runs)) == [1, 2, 3, 4], runs


def test_early_steps_fill_the_registers_they_may_hold() -> None:
    # Qwen3-8B on the H200 (tile_shape's tiles): o and down one 32x512 step, qkv one
    # 64x256, the vocabulary head two 64x128, gate/up two steps of two 32x128 tiles
    # (the same bytes as the head's).
    assert linear.early_steps(4096, 512, 32 * 512 * 2, linear.EARLY_STEPS) == 1
    assert linear.early_steps(12288, 512, 32 * 512 * 2, linear.EARLY_STEPS) == 1
    assert linear.early_steps(4096, 256, 64 * 256 * 2, linear.EARLY_STEPS) == 1
    assert linear.early_steps(4096, 128, 64 * 128 * 2, linear.EARLY_STEPS) == 2
    assert linear.early_steps(4096, 128, 64 * 128 * 2, linear.EARLY_GATED_STEPS) == 2
    # SmolLM2: 576 columns in five 128-column steps, four early; its gate/up (two
    # 16-column tiles a step) three, the gated kernel's most.
    assert linear.early_steps(576, 128, 32 * 128 * 2, linear.EARLY_STEPS) == 4
    assert linear.early_steps(576, 128, 2 * 16 * 128 * 2, linear.EARLY_GATED_STEPS) == 3
    # Never more than the loop's steps, never none at one row tile, none past it.
    assert linear.early_steps(48, 64, 16 * 64 * 2, linear.EARLY_STEPS) == 1
    assert linear.early_steps(4096, 1024, 64 * 1024 * 2, linear.EARLY_STEPS) == 1
    assert linear.early_steps(576, 128, 32 * 128 * 2, linear.EARLY_STEPS, tiles=2) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(576, 576), (4096, 4096), (4096, 12288)])
def test_early_weights_compute_the_same_bits_on_gpu(n: int, k: int) -> None:
    from ignition.components.programmatic_launch import (
        launches_programmatically,
        programmatic_launch,
    )

    with programmatic_launch():
        if not launches_programmatically(torch.device("cuda")):
            pytest.skip("early weights need programmatic launch (SM90 and later)")

    _early_weights_agree(
        "cuda", torch.bfloat16, n, k, lambda early: programmatic_launch(True, early)
    )
