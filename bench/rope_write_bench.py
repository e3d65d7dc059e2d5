"""The rotary and KV write that finishes a layer's QKV projection
(``triton_rope_write_kv``) at each tile (tokens a program, warps), captured in CUDA
graphs and replayed in alternating blocks over operands that do not stay in L2, at
the served geometries' heads and at decode's and prefill's token counts. Each tile's
queries and cache bytes are compared with one token a program's (they must be equal).

    python bench/rope_write_bench.py [--tokens 1 4 512 4096] --out rope.json

Prints one line per geometry, token count and tile: microseconds (median, p99), the
bytes moved over that time, and whether the bits are one token a program's. Needs a
GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

# name: (query heads, kv heads, head_dim, q/k norms)
GEOMETRIES = {
    "qwen3-8b": (32, 8, 128, True),
    "smollm2-135m": (9, 3, 64, False),
}
TILES = ((1, 1), (4, 1), (8, 2), (16, 4), (32, 4), (64, 8))
PAGE = 64


def _call_all(calls: list[Callable[[], Any]], results: list[Any]) -> None:
    """``calls`` in turn, their results (the queries) in ``results``."""
    results[:] = [call() for call in calls]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from bench.cuda_timing import blocks_us, capture, cold_copies
    from ignition.components.triton_kv_write import rope_tile, triton_rope_write_kv

    runs = []
    for name in args.geometries:
        heads, kv_heads, dim, norms = GEOMETRIES[name]
        for tokens in args.tokens:
            gen = torch.Generator().manual_seed(tokens)
            to = {"device": "cuda", "dtype": torch.bfloat16}
            width = (heads + 2 * kv_heads) * dim
            # Bytes a call moves: the projection, cos and sin read; the queries, keys
            # and values written.
            moved = 2 * tokens * (width + 2 * dim + heads * dim + 2 * kv_heads * dim)
            copies = cold_copies(moved)
            qkvs = [(torch.randn(tokens, width, generator=gen) * 3).to(**to) for _ in range(copies)]
            angles = torch.rand(tokens, dim // 2, generator=gen) * 6.3
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos().to(**to), angles.sin().to(**to)
            weights = [(1 + torch.randn(dim, generator=gen) / 4).to(**to) for _ in range(2)]
            q_weight, k_weight = weights if norms else (None, None)
            pages = tokens // PAGE + 2
            rows = torch.randperm(tokens, generator=gen).cuda() + PAGE
            graphs, outputs = {}, {}
            for tile in TILES:
                caches = [torch.zeros(2, pages, PAGE, kv_heads, dim, **to) for _ in qkvs]
                queries: list[torch.Tensor] = []
                rest = (q_weight, k_weight, 1e-6, cos, sin, rows, heads, tile)
                calls = [
                    partial(triton_rope_write_kv, kv, qkv, *rest)
                    for qkv, kv in zip(qkvs, caches, strict=True)
                ]
                graphs[tile] = capture(partial(_call_all, calls, queries))
                outputs[tile] = (queries, caches)
            timed = blocks_us({str(t): g for t, g in graphs.items()}, args.replays, args.blocks)
            torch.cuda.synchronize()
            base_q, base_kv = outputs[TILES[0]]
            for tile in TILES:
                q, kv = outputs[tile]
                same = all(torch.equal(a, b) for a, b in zip(q + kv, base_q + base_kv, strict=True))
                us = {k: v / copies for k, v in timed[str(tile)].items()}
                run = {
                    "geometry": name,
                    "tokens": tokens,
                    "tile": list(tile),
                    "default": tile == rope_tile(tokens),
                    "median_us": us["median_us"],
                    "p99_us": us["p99_us"],
                    "gb_per_s": moved / us["median_us"] / 1e3,
                    "same_bits": same,
                }
                runs.append(run)
                mark = " (default)" if run["default"] else ""
                print(
                    f"{name:13s} tokens {tokens:5d} tile {tile[0]:2d}x{tile[1]}{mark:10s} "
                    f"{us['median_us']:9.2f} us (p99 {us['p99_us']:9.2f}) "
                    f"{run['gb_per_s']:7.0f} GB/s bits {'same' if same else 'DIFFER'}",
                    flush=True,
                )
    return {"runs": runs}


def main(argv: list[str] | None = None) -> int:
    from bench.cuda_timing import run_measurement

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--geometries", nargs="+", default=list(GEOMETRIES), choices=GEOMETRIES)
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 512, 4096])
    return run_measurement(parser, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
