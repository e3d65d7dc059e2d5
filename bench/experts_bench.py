"""The decode experts' kernels against Transformers' ``grouped_mm`` path, on the GPU.

At the hybrid's H200 expert geometry (128 experts of 640, hidden 2560, top-10) with
random routing, for each token count: the median and p99 of ``--iters`` CUDA-graph
replays of each implementation (one graph per implementation and shape, so launch
overhead is what serving sees), the bytes of expert weights the step must read (the
distinct experts its routing selects) over that time, and the bandwidth probed in the
same run. The Triton kernels run at every ``--blocks`` pair of output-column blocks
(gate/up, down), so the fastest can be chosen; each result is checked against the
reference first.

    PYTHONPATH=. python bench/experts_bench.py --tokens 1 4 --out experts.json [--blocks 16,8 32,16]
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


def _graph_times(fn: Any, iters: int) -> list[float]:
    """Microseconds of each of ``iters`` replays of ``fn`` captured as a CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    marks = [(torch.cuda.Event(True), torch.cuda.Event(True)) for _ in range(iters)]
    for begin, end in marks:
        begin.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [begin.elapsed_time(end) * 1e3 for begin, end in marks]


def _summary(times: list[float], nbytes: int) -> dict[str, float]:
    ordered = sorted(times)
    median = statistics.median(times)
    return {
        "median_us": median,
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "bandwidth_bytes_per_s": nbytes / (median * 1e-6),
    }


def main(argv: list[str] | None = None) -> int:
    from transformers.integrations.moe import grouped_mm_experts_forward

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2560)
    parser.add_argument("--inter", type=int, default=640)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--blocks", nargs="+", default=["16,8", "32,16", "8,8", "16,16"])
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
        scores = torch.rand(tokens, e, generator=gen, device=device)
        weights, index = torch.softmax(scores, -1).topk(k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).bfloat16()
        nbytes = int(index.unique().numel()) * expert_bytes
        want = routed_experts_ref(x, gate_up, down, index, weights)
        row: dict[str, Any] = {"distinct_experts": int(index.unique().numel()), "bytes": nbytes}
        operands = (x, index, weights)
        grouped = functools.partial(grouped_mm_experts_forward, canonical, *operands)
        row["grouped_mm"] = _summary(_graph_times(grouped, args.iters), nbytes)
        fused = functools.partial(
            triton_experts.triton_routed_experts, x, gate_up, down, index, weights
        )
        for blocks in args.blocks:
            gate_up_n, down_n = (int(v) for v in blocks.split(","))
            triton_experts.GATE_UP_BLOCK_N, triton_experts.DOWN_BLOCK_N = gate_up_n, down_n
            got = fused()
            error = float((got.float() - want.float()).norm() / want.float().norm())
            times = _graph_times(fused, args.iters)
            row[f"triton_{gate_up_n}_{down_n}"] = {**_summary(times, nbytes), "relative_l2": error}
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
