"""Decode attention (the split kernel finishing its rows' packed projection, then the
merge) with four and with eight warps in the split kernel, on the H200.

At Qwen3-8B's head_dim of 128 the split kernel compiled for SM90 with four warps
holds 255 registers a thread and spills 248 to 280 bytes of them to the stack; with
eight, none (``cuobjdump --dump-resource-usage``). The 8B's decode attention costs
about 200 us a step over its bytes (``bench/results/issue23/2026-12-05b-h200-head``).
This times one layer's call, per warp count, for the 8B's and SmolLM2-135M's heads,
1 and 4 rows of 128, 1,024 and 4,096 cached tokens each, inside CUDA graphs whose
calls rotate over caches larger than L2 together (``bench/cuda_timing.py``), the
variants' graphs replayed in turn in blocks (medians and p99). The two warp counts
may round differently (a reduction's order follows its layout); each is batch
invariant, which the tests check at four.

    python -m bench.decode_attention_bench --out OUT.json   (PYTHONPATH: the repository)
"""

from __future__ import annotations

import argparse

import torch

from bench.cuda_timing import blocks_us, capture, cold_copies, run_measurement
from ignition.components.programmatic_launch import programmatic_launch
from ignition.components.triton_attention import RopeInputs, triton_paged_decode_attention_rope

PAGE = 64
# (name, query heads, kv heads, head_dim)
SHAPES = (("qwen3-8b", 32, 8, 128), ("smollm2-135m", 9, 3, 64))
WARPS = (4, 8)
# Where the graphs run (the smoke run on the CPU, under the interpreter, sets "cpu").
DEVICE = "cuda"


def _calls(heads: int, kv_heads: int, dim: int, rows: int, context: int) -> list[tuple]:
    """Operand sets of one layer's call, as many as keep their caches out of L2."""
    device = torch.device(DEVICE)
    per_row = -(-context // PAGE)
    pages = 1 + rows * per_row
    cache_bytes = 2 * pages * PAGE * kv_heads * dim * 2
    table = (1 + torch.arange(rows * per_row, dtype=torch.int32, device=device)).view(rows, -1)
    pos = context - 1
    cache_rows = table[:, pos // PAGE].long() * PAGE + pos % PAGE
    seq_lens = torch.full((rows,), context, dtype=torch.int32, device=device)
    angles = torch.rand(rows, dim // 2, device=device) * 6.3
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    calls = []
    for _ in range(cold_copies(cache_bytes)):
        kv = torch.randn(2, pages, PAGE, kv_heads, dim, device=device).bfloat16()
        qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, device=device).bfloat16()
        calls.append((RopeInputs(qkv, None, None, 0.0, cos, sin, cache_rows), kv, table, seq_lens))
    return calls


def measure(args: argparse.Namespace) -> dict:
    results = []
    for name, heads, kv_heads, dim in SHAPES:
        for rows in args.rows:
            for context in args.contexts:
                calls = _calls(heads, kv_heads, dim, rows, context)

                def run(
                    warps: int, calls: list[tuple] = calls, heads: int = heads, dim: int = dim
                ) -> None:
                    with programmatic_launch(True):
                        for rope, kv, table, seq_lens in calls:
                            triton_paged_decode_attention_rope(
                                rope, kv, table, seq_lens, dim**-0.5, heads, split_warps=warps
                            )

                graphs = {str(w): capture(lambda w=w: run(w)) for w in args.warps}
                timed = blocks_us(graphs, args.replays, args.blocks)
                per_call = {w: t["median_us"] / len(calls) for w, t in timed.items()}
                line = ", ".join(f"{w} warps {us:.2f} us" for w, us in per_call.items())
                print(f"{name} rows {rows} context {context}: {line}", flush=True)
                results.append(
                    {
                        "shape": name,
                        "rows": rows,
                        "context": context,
                        "calls": len(calls),
                        "graphs": timed,
                        "per_call_us": per_call,
                    }
                )
    return {
        "device": torch.cuda.get_device_name(),
        "replays": args.replays,
        "blocks": args.blocks,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--warps", type=int, nargs="+", default=list(WARPS))
    return run_measurement(parser, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
