"""Times the batch-invariant decode projection (``ignition.components.linear``) on the
projections of SmolLM2-135M and Qwen3-8B, over tile shapes, against cuBLAS and the
device's copy bandwidth: the data behind the kernel's tile choice.

    python bench/rows_linear_bench.py [--out bench.json]
        [--narrow | --many-rows | --widths | --stages]

For each weight shape and 1 and 4 rows: the time per call inside a CUDA graph, over
weight copies larger than L2 together (``bench/cuda_timing.py``), per (BLOCK_N,
BLOCK_K, num_stages, num_warps), F.linear's, and the weight bytes over the time as
GB/s, beside a device-to-device copy of the same bytes; for gate/up, also the fused
projection with SiLU and the product that serving launches; and the decode layer's
fused variants (``fused_ms``: qkv and gate/up scaled by the RMSNorm's statistic from
the rows' partial squares, o and down with the residual epilogue that also writes
the result's partial squares), whose difference from the plain kernel is what the
fusion costs inside the projection. ``--narrow`` times only the K split of weights too
narrow for the kernel (the hybrid's) against cuBLAS at the same and at 16 padded rows,
and the kernel past one row tile (32 and 64 rows, Qwen3-8B) against cuBLAS;
``--many-rows`` sweeps that kernel's tiles at 16 to 64 rows and tells which change a
row's bits; ``--widths`` times the served projections as the decode layer launches
them at every tile width, one and four rows; ``--stages`` times them over K steps and
pipeline depths. Needs a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from bench.cuda_timing import cold_copies, median_graph_ms
from ignition.components.linear import (
    BLOCK_NS,
    GATED_NARROWEST,
    ROWS_TILE,
    SQUARE_GROUP,
    RowStatistic,
    _rows_linear_kernel,
    gated_tile_shape,
    pipeline_stages,
    row_tile_k,
    row_tiles,
    split_shape,
    tile_shape,
    triton_rows_gated,
    triton_rows_linear,
    triton_rows_split_linear,
)

# (model, projection, out features N, in features K)
SHAPES = [
    ("smollm2-135m", "qkv", 960, 576),
    ("smollm2-135m", "o", 576, 576),
    ("smollm2-135m", "gate_up", 3072, 576),
    ("smollm2-135m", "down", 576, 1536),
    ("smollm2-135m", "lm_head", 49152, 576),
    ("qwen3-8b", "qkv", 6144, 4096),
    ("qwen3-8b", "o", 4096, 4096),
    ("qwen3-8b", "gate_up", 24576, 4096),
    ("qwen3-8b", "down", 4096, 12288),
    ("qwen3-8b", "lm_head", 151936, 4096),
]
# (BLOCK_N, BLOCK_K, num_stages, num_warps); serving launches num_stages 4, 4 warps.
TILES = list(itertools.product([16, 32, 64, 128], [64, 128, 256, 512], [3, 4], [4, 8]))


def tile_name(tile: tuple[int, int, int, int]) -> str:
    block_n, block_k, stages, warps = tile
    return f"{block_n}x{block_k}/s{stages}/w{warps}"


def launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, tile: tuple[int, int, int, int]):
    """The projection kernel over ``tile`` as a call with no arguments (y = x @ w.T)."""
    block_n, block_k, stages, warps = tile
    rows, k = x.shape
    n = w.shape[0]
    tiles = row_tiles(rows)
    grid = (triton.cdiv(rows, tiles * ROWS_TILE), triton.cdiv(n, block_n))
    return lambda: _rows_linear_kernel[grid](
        x, w, w, y, y, y, y, rows, n, k, x.stride(0), w.stride(0), y.stride(0), y.stride(0),
        y.stride(0), y.stride(0), 0.0, HAS_BIAS=False, NORM=False, RESIDUAL=False,
        SQUARES=False, ROW_TILES=tiles, BLOCK_M=ROWS_TILE,
        BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def over(weights: list[torch.Tensor], call: Callable[[torch.Tensor], object]) -> float:
    """Median ms of ``call`` per weight copy, the copies in turn inside a graph."""
    return median_graph_ms([lambda w=w: call(w) for w in weights])


# The hybrid's decode projections too narrow for the fixed-tile kernel (Qwen3.8 Flash
# at the H200 geometry): each hyperconnection's mix-in, the MoE block's merged input
# (the shared expert's gate, up and sigmoid gate, and the router), and those two
# halves as they ran before the merge.
NARROW_SHAPES = [
    ("qwen4-exp-h200", "mix_in", 324, 10240),
    ("qwen4-exp-h200", "shared_in", 1409, 2560),
    ("qwen4-exp-h200", "shared_in-1281", 1281, 2560),
    ("qwen4-exp-h200", "router", 128, 2560),
]


def narrow_and_many_rows(sms: int) -> list[dict[str, object]]:
    """The K split (its default ranges and others) against cuBLAS at the same rows and
    at 16 padded ones, for the narrow shapes at 1 to 32 rows; and the fixed-tile
    kernel past one row tile (a step of 32 or 64 requests) against cuBLAS, for
    Qwen3-8B's projections."""
    device = torch.device("cuda")
    out: list[dict[str, object]] = []
    for model, name, n, k in NARROW_SHAPES:
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        _, block_k, default = split_shape(n, k, sms)
        for rows in (1, 4, 16, 32):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            padded = torch.zeros(max(rows, ROWS_TILE), k, device=device, dtype=torch.bfloat16)
            splits = {
                k_split: over(
                    weights, lambda w, x=x, s=k_split: triton_rows_split_linear(x, w, None, s)
                )
                for k_split in sorted(
                    {default, 2 * block_k, 4 * block_k, 8 * block_k, 16 * block_k}
                )
            }
            cublas = over(weights, lambda w, x=x: F.linear(x, w))
            cublas_padded = over(weights, lambda w, p=padded: F.linear(p, w))
            out.append(dict(model=model, projection=name, n=n, k=k, rows=rows,
                            default_split=default, split_ms=splits, cublas_ms=cublas,
                            cublas_padded_ms=cublas_padded))  # fmt: skip
            print(
                f"{model:14} {name:9} {n:5}x{k:5} rows {rows:2}: split {default} "
                f"{splits[default] * 1e3:6.1f} us (best {min(splits.values()) * 1e3:6.1f}), "
                f"cuBLAS {cublas * 1e3:6.1f} us, padded {cublas_padded * 1e3:6.1f} us"
            )
    for model, name, n, k in SHAPES:
        if model != "qwen3-8b" or name == "lm_head":
            continue
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        for rows in (16, 32, 64):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            kernel = over(weights, lambda w, x=x: triton_rows_linear(x, w, None))
            cublas = over(weights, lambda w, x=x: F.linear(x, w))
            out.append(dict(model=model, projection=name, n=n, k=k, rows=rows,
                            rows_kernel_ms=kernel, cublas_ms=cublas))  # fmt: skip
            gb = w.numel() * w.element_size() / 1e9
            print(
                f"{model:14} {name:9} {n:5}x{k:5} rows {rows:2}: fixed tile {kernel * 1e3:6.1f} us "
                f"({gb / kernel * 1e3:5.0f} GB/s), cuBLAS {cublas * 1e3:6.1f} us"
            )
    return out


# The tiles swept past one row tile (BLOCK_N, BLOCK_K, num_warps; the pipeline's depth
# as serving sets it): ptxas (sm_90a) reports the serving tile of the 8B's qkv (32x256,
# 4 warps) at 64 rows spilling 168 bytes, and none at 8 warps or at K steps of 64;
# whether the K step and the warps change a row's bits is measured here.
MANY_ROWS_TILES = list(itertools.product([32, 64, 128], [64, 128, 256], [4, 8]))


def tile_sweep_past_one_row_tile() -> list[dict[str, object]]:
    """Qwen3-8B's projections at 16, 32 and 64 rows over ``MANY_ROWS_TILES``: each
    tile's time, and whether its output is bitwise the serving tile's at the same rows
    (a tile that changes no bit may serve those rows) and, for the first 16 rows,
    bitwise the serving tile's at 16 rows (batch invariance across row counts)."""
    device = torch.device("cuda")
    out: list[dict[str, object]] = []
    for model, name, n, k in SHAPES:
        if model != "qwen3-8b" or name == "lm_head":
            continue
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        x_all = torch.randn(64, k, device=device, dtype=torch.bfloat16)
        first_tile = triton_rows_linear(x_all[:ROWS_TILE], w, None)
        for rows in (16, 32, 64):
            x = x_all[:rows].contiguous()
            serving = triton_rows_linear(x, w, None)
            serving_ms = over(weights, lambda w, x=x: triton_rows_linear(x, w, None))
            cublas = over(weights, lambda w, x=x: F.linear(x, w))
            for block_n, block_k, warps in MANY_ROWS_TILES:
                stages = pipeline_stages(row_tiles(rows), block_n, block_k, w.element_size())
                tile = (block_n, block_k, stages, warps)
                y = torch.empty(rows, n, device=device, dtype=torch.bfloat16)
                try:
                    launch(x, w, y, tile)()
                except triton.runtime.errors.OutOfResources:
                    print(f"{name:8} rows {rows:2} {tile_name(tile):14} does not fit")
                    continue
                same = torch.equal(y, serving)
                same_first = torch.equal(y[:ROWS_TILE], first_tile)
                ms = over(weights, lambda w, x=x, y=y, t=tile: launch(x, w, y, t)())
                out.append(dict(model=model, projection=name, n=n, k=k, rows=rows,
                                tile=tile_name(tile), ms=ms, serving_ms=serving_ms,
                                cublas_ms=cublas, equal_serving=same,
                                equal_first_tile=same_first))  # fmt: skip
                print(
                    f"{name:8} rows {rows:2} {tile_name(tile):14} {ms * 1e3:6.1f} us "
                    f"(serving {serving_ms * 1e3:6.1f}, cuBLAS {cublas * 1e3:6.1f}) "
                    f"same bits as serving: {same}, as 16 rows: {same_first}"
                )
    return out


def _served(
    name: str, x: torch.Tensor, norm: RowStatistic, residual: torch.Tensor, squares: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """Projection ``name`` as the decode layer launches it, as a call on (weight, width,
    K step[, pipeline depth]); gate/up keeps its default K step unless ``stages`` is
    given."""

    def call(w: torch.Tensor, width: int, block_k: int, stages: int | None = None) -> torch.Tensor:
        if name == "gate_up":
            step = block_k if stages else None
            return triton_rows_gated(x, w, norm, width=width, block_k=step, stages=stages)
        if name == "qkv":
            return triton_rows_linear(x, w, None, width, block_k, norm=norm, stages=stages)
        return triton_rows_linear(
            x, w, None, width, block_k, residual=residual, squares=squares, stages=stages
        )

    return call


def width_sweep(sms: int) -> list[dict[str, object]]:
    """Each served projection (lm_head aside) at 1 and 4 rows, as the decode layer
    launches it (qkv and gate/up scaled by the norm's statistic, o and down with the
    residual and partial squares), at every width of ``BLOCK_NS`` (gate/up's halves at
    least ``DOT_MIN``) with the K step ``tile_shape``'s rule gives that width's program
    count (gate/up: its default's K step, as ``triton_rows_gated``'s ``width`` keeps
    it); beside the width ``tile_shape`` picks, and whether every width gives its bits."""
    device = torch.device("cuda")
    out: list[dict[str, object]] = []
    for model, name, n, k in SHAPES:
        if name == "lm_head":
            continue
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        for rows in (1, 4):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            norm = RowStatistic(torch.rand(rows, k // SQUARE_GROUP, device=device) + 0.5, 1e-6)
            residual = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
            squares = torch.empty(rows, n // SQUARE_GROUP, device=device)

            served = _served(name, x, norm, residual, squares)
            picked = (gated_tile_shape if name == "gate_up" else tile_shape)(n, k, sms)[0]
            times: dict[int, float] = {}
            outputs = []
            for width in BLOCK_NS:
                if name == "gate_up" and width < GATED_NARROWEST:
                    continue
                block_k = row_tile_k(n, k, width, sms)
                outputs.append(served(w, width, block_k).clone())
                times[width] = over(weights, lambda w, c=width, b=block_k, f=served: f(w, c, b))
            same = all(torch.equal(o, outputs[0]) for o in outputs)
            out.append(dict(model=model, projection=name, n=n, k=k, rows=rows, picked=picked,
                            width_ms=times, same_bits=same))  # fmt: skip
            cells = ", ".join(
                f"{width}: {ms * 1e3:6.2f} us ({triton.cdiv(n, width)} programs)"
                for width, ms in times.items()
            )
            print(f"{model:13} {name:8} {n:6}x{k:5} rows {rows}: picked {picked}; {cells}; "
                  f"same bits: {same}", flush=True)  # fmt: skip
    return out


# The pipeline depths swept by ``--stages``: from one below serving's STAGES (4) to as
# many as the shared memory holds (Triton keeps ``num_stages - 1`` tiles in flight).
STAGE_SWEEP = range(3, 12)
# The shared memory one program may take on SM90 (227 KiB).
SHARED_BYTES = 227 << 10


def stage_sweep(sms: int) -> list[dict[str, object]]:
    """Each served projection (lm_head aside) at one row as the decode layer launches
    it, at its served width, over K steps (half, the served and twice the served, 64 to
    512) and pipeline depths (``STAGE_SWEEP``, while the tiles fit the shared memory):
    each one's time and whether it gives the served launch's bits; then the served and
    the fastest at four rows. The served launch takes ``pipeline_stages``' depth."""
    device = torch.device("cuda")
    out: list[dict[str, object]] = []
    for model, name, n, k in SHAPES:
        if name == "lm_head":
            continue
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        width, served_k = (gated_tile_shape if name == "gate_up" else tile_shape)(n, k, sms)
        served_stages = pipeline_stages(1, width, served_k, w.element_size())
        steps = [b for b in (served_k // 2, served_k, 2 * served_k) if 64 <= b <= 512]

        def fits(block_k: int, stages: int, c: int = width, k: int = k) -> bool:
            # The tiles in flight within the shared memory, and no deeper than the loop.
            held = (stages - 1) * (ROWS_TILE + c) * block_k * 2  # bfloat16
            return held <= SHARED_BYTES and stages <= triton.cdiv(k, block_k) + 1

        timed: dict[int, dict[str, object]] = {}
        for rows in (1, 4):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            norm = RowStatistic(torch.rand(rows, k // SQUARE_GROUP, device=device) + 0.5, 1e-6)
            residual = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
            squares = torch.empty(rows, n // SQUARE_GROUP, device=device)
            served = _served(name, x, norm, residual, squares)
            reference = served(w, width, served_k).clone()
            served_ms = over(weights, lambda w, f=served, c=width, b=served_k: f(w, c, b))
            if rows == 1:
                cases = [(b, s) for b in steps for s in STAGE_SWEEP if fits(b, s)]
            elif timed[1]["cases"]:
                best = min(timed[1]["cases"], key=lambda c: c["ms"])  # type: ignore[arg-type]
                cases = [(int(best["block_k"]), int(best["stages"]))]
            else:
                cases = []  # nothing at one row fitted: the served launch alone
            results = []
            for block_k, stages in cases:
                try:
                    y = served(w, width, block_k, stages).clone()
                except triton.runtime.errors.OutOfResources:
                    continue  # this depth's tiles outgrow the shared memory
                ms = over(weights, lambda w, f=served, c=width, b=block_k, s=stages: f(w, c, b, s))
                same = torch.equal(y, reference)
                results.append(dict(block_k=block_k, stages=stages, ms=ms, same_bits=same))
                print(f"{model:13} {name:8} rows {rows} {width}x{block_k}/s{stages}: "
                      f"{ms * 1e3:6.2f} us (served {width}x{served_k}/s{served_stages} "
                      f"{served_ms * 1e3:6.2f}) same bits: {same}", flush=True)  # fmt: skip
            timed[rows] = dict(model=model, projection=name, n=n, k=k, rows=rows, width=width,
                               served_block_k=served_k, served_stages=served_stages,
                               served_ms=served_ms, cases=results)  # fmt: skip
            out.append(timed[rows])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--narrow",
        action="store_true",
        help="only the K split at the narrow shapes and the kernel past one row tile",
    )
    parser.add_argument(
        "--widths",
        action="store_true",
        help="only the served projections as the decode layer launches them, at every "
        "tile width (1 and 4 rows)",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="only the served projections at one row over K steps and pipeline depths, "
        "each against the served launch's time and bits (the fastest also at four rows)",
    )
    parser.add_argument(
        "--many-rows",
        action="store_true",
        help="only the tile sweep past one row tile (Qwen3-8B at 16, 32 and 64 rows), "
        "with each tile's bits against the serving tile's",
    )
    args = parser.parse_args()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    sweep = None
    if args.widths:
        sweep = width_sweep(sms)
    elif args.stages:
        sweep = stage_sweep(sms)
    elif args.narrow:
        sweep = narrow_and_many_rows(sms)
    elif args.many_rows:
        sweep = tile_sweep_past_one_row_tile()
    if sweep is not None:
        rows_out = sweep
        if args.out:
            args.out.write_text(
                json.dumps({"device": torch.cuda.get_device_name(), "rows": rows_out})
            )
        return
    rows_out = []
    for model, name, n, k in SHAPES:
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        weights = [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]
        copies = [torch.empty_like(w) for w in weights]
        copy_ms = median_graph_ms(
            [lambda w=w, c=c: c.copy_(w) for w, c in zip(weights, copies, strict=True)]
        )
        del copies
        gbs = 2 * w.numel() * w.element_size() / 1e6 / copy_ms  # read + write
        for rows in (1, 4):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            y = torch.empty(rows, n, device=device, dtype=torch.bfloat16)
            tiles: dict[str, float] = {}
            for tile in TILES:
                try:
                    tiles[tile_name(tile)] = median_graph_ms(
                        [launch(x, w, y, tile) for w in weights]
                    )
                except triton.runtime.errors.OutOfResources:
                    continue  # the tile's pipeline does not fit in shared memory
            cublas = median_graph_ms([lambda x=x, w=w: F.linear(x, w) for w in weights])
            gated = None  # the serving MLP's fused kernel: both projections and SiLU
            # The decode layer's variant: qkv and gate/up scaled by the norm's statistic
            # (x's partial squares), o and down with the residual and their result's
            # partial squares in the epilogue.
            squares = torch.rand(rows, k // SQUARE_GROUP, device=device) + 0.5
            norm = RowStatistic(squares, 1e-6)
            residual = torch.randn(rows, n, device=device, dtype=torch.bfloat16)
            out_squares = torch.empty(rows, n // SQUARE_GROUP, device=device)
            fused = None
            if name == "gate_up":
                gated = over(weights, lambda w, x=x: triton_rows_gated(x, w))
                fused = over(weights, lambda w, x=x, g=norm: triton_rows_gated(x, w, g))
            elif name == "qkv":
                fused = over(weights, lambda w, x=x, g=norm: triton_rows_linear(x, w, None, norm=g))
            elif name in ("o", "down"):
                fused = over(
                    weights,
                    lambda w, x=x, r=residual, q=out_squares: triton_rows_linear(
                        x, w, None, residual=r, squares=q
                    ),
                )
            best = min(tiles, key=lambda t: tiles[t])
            current = tile_name((*tile_shape(n, k, sms), 4, 4))  # what serving launches
            weight_gb = w.numel() * w.element_size() / 1e9
            row = dict(model=model, projection=name, n=n, k=k, rows=rows, tiles_ms=tiles,
                       cublas_ms=cublas, copy_gbs=gbs, current_tile=current,
                       current=tiles[current], gated_ms=gated, fused_ms=fused)  # fmt: skip
            rows_out.append(row)
            print(
                f"{model:13} {name:8} {n:6}x{k:5} rows {rows}: current {current} "
                f"{tiles[current] * 1e3:7.1f} us ({weight_gb / tiles[current] * 1e3:6.0f}"
                f" GB/s), best {best} {tiles[best] * 1e3:7.1f} us "
                f"({weight_gb / tiles[best] * 1e3:6.0f} GB/s), cuBLAS {cublas * 1e3:7.1f} us; "
                f"copy {gbs:6.0f} GB/s"
                + (f"; gated {gated * 1e3:7.1f} us" if gated is not None else "")
                + (f"; fused {fused * 1e3:7.1f} us" if fused is not None else "")
            )
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows_out}))


if __name__ == "__main__":
    main()
