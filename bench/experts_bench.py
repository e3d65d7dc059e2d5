"""The decode experts' kernels against Transformers' ``grouped_mm`` path, on the GPU.

At the hybrid's H200 expert geometry (128 experts of 640, hidden 2560, top-10), for
each token count: the median per call over ``--iters`` replays of a CUDA graph of
calls with ``ROUTINGS`` different random routings (``bench.cuda_timing``: launches
as serving makes them, and consecutive calls read other experts, as layers do), the
bytes of expert weights a call must read (the distinct experts of its routing, on
average) over that time, and the bandwidth probed in the same run. The Triton kernels
run at every ``--blocks`` pair of output-column blocks (gate/up, down; ``,slots``
runs the down projection one program per slot and sums the slots in a second kernel),
so the fastest can be chosen; each records its relative L2 against the reference.

    PYTHONPATH=. python bench/experts_bench.py --tokens 1 4 --out e.json [--blocks 8,8 8,16,slots]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from bench.cuda_timing import median_graph_ms
from bench.suite.bandwidth import measure_read_bandwidth
from ignition.components import triton_experts
from ignition.components.experts import routed_experts_ref


class GroupedMmExperts(torch.nn.Module):
    """What Transformers' ``grouped_mm_experts_forward`` reads of its experts module
    (SiLU-GLU ``gate_up_proj [experts, 2 * inter, hidden]``, ``down_proj``, no bias)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up, down
        self.num_experts = gate_up.shape[0]
        self.has_gate, self.has_bias, self.is_transposed = True, False, False
        self.act_fn = torch.nn.functional.silu

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


ROUTINGS = 8


def _routings(tokens: int, experts: int, k: int, device: str, gen: torch.Generator) -> list[Any]:
    """``ROUTINGS`` random routings (index, renormalized bf16 weights) of ``tokens``:
    consecutive calls of a graph read other experts, as consecutive layers do."""
    out = []
    for _ in range(ROUTINGS):
        scores = torch.rand(tokens, experts, generator=gen, device=device)
        weights, index = torch.softmax(scores, -1).topk(k, dim=-1)
        out.append((index, (weights / weights.sum(-1, keepdim=True)).bfloat16()))
    return out


def _timed(run: Any, routings: list[Any], nbytes: float, iters: int) -> dict[str, float]:
    """``run(index, weights)`` over ``routings`` in one graph: median per call."""
    calls = [functools.partial(run, index, weights) for index, weights in routings]
    us = median_graph_ms(calls, launches=iters) * 1e3
    return {"median_us": us, "bandwidth_bytes_per_s": nbytes / (us * 1e-6)}


def main(argv: list[str] | None = None) -> int:
    from transformers.integrations.moe import grouped_mm_experts_forward

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--inter", type=int, default=640)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument(
        "--blocks",
        nargs="+",
        default=["8,8", "16,16", "8,8,slots", "8,16,slots", "8,32,slots"],
        help="GATE_UP,DOWN output-column blocks, ',slots' for the down projection by slot",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(0)
    e, h, i, k = args.experts, args.hidden, args.inter, args.top_k
    gate_up = (torch.randn(e, 2 * i, h, generator=gen, device=device) * 0.02).bfloat16()
    down = (torch.randn(e, h, i, generator=gen, device=device) * 0.02).bfloat16()
    expert_bytes = 3 * h * i * 2

    canonical = GroupedMmExperts(gate_up, down)
    results: dict[str, Any] = {
        "shape": {"experts": e, "hidden": h, "inter": i, "top_k": k},
        "bandwidth_bytes_per_s": measure_read_bandwidth(),
        "tokens": {},
    }
    for tokens in args.tokens:
        x = torch.randn(tokens, h, generator=gen, device=device).bfloat16()
        routings = _routings(tokens, e, k, device, gen)
        distinct = statistics.mean(int(index.unique().numel()) for index, _ in routings)
        nbytes = distinct * expert_bytes
        row: dict[str, Any] = {"distinct_experts": distinct, "bytes": nbytes}
        grouped = functools.partial(grouped_mm_experts_forward, canonical, x)
        row["grouped_mm"] = _timed(grouped, routings, nbytes, args.iters)
        index, weights = routings[0]
        want = routed_experts_ref(x, gate_up, down, index, weights)
        for blocks in args.blocks:
            gate_up_n, down_n, *by_slot = blocks.split(",")
            triton_experts.GATE_UP_BLOCK_N = int(gate_up_n)
            triton_experts.DOWN_BLOCK_N = int(down_n)
            triton_experts.DOWN_BY_SLOT = by_slot == ["slots"]
            got = triton_experts.triton_routed_experts(x, gate_up, down, index, weights)
            error = float((got.float() - want.float()).norm() / want.float().norm())
            run = functools.partial(triton_experts.triton_routed_experts, x, gate_up, down)
            fused = _timed(run, routings, nbytes, args.iters)
            name = "_".join(["triton", gate_up_n, down_n, *by_slot])
            row[name] = {**fused, "relative_l2": error}
        results["tokens"][str(tokens)] = row
        best = min(
            (key for key in row if key.startswith("triton_")), key=lambda n: row[n]["median_us"]
        )
        print(
            f"{tokens} tokens: grouped_mm {row['grouped_mm']['median_us']:.1f} us, "
            f"{best} {row[best]['median_us']:.1f} us "
            f"({row[best]['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s)",
            file=sys.stderr,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
