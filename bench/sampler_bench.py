"""The compiled sampler with its thresholds by radix selection (as served) against the
same sampler reading them off a sort of each row (``sorted_thresholds``: the sort,
scan and gathers the served sampler used before), each captured in a CUDA graph and
replayed, in alternating blocks, at the served vocabularies and row counts.

    python bench/sampler_bench.py [--vocabs 49152 151936] [--rows 1 4] \\
        [--replays 200] [--chunks 1024 2048 4096] [--digits 4 5] --out sampler.json

Then the thresholds alone at each chunk of columns a program histograms and each
digit's bits a pass decides.

Three cases: sampling parameters as agents send them (temperature 0.7, top-k 20,
top-p 0.95, peaked rows), flat rows (temperature 1, top-k off, top-p 0.95: a nucleus
of most of the vocabulary), and a request's defaults (temperature 1, neither filter:
rows the selection skips). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

CASES = {
    # name: (temperature, top_k, top_p, logit scale)
    "agent": (0.7, 20, 0.95, 4.0),
    "flat": (1.0, 0, 0.95, 1.0),
    "defaults": (1.0, 0, 1.0, 1.0),
}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from bench.cuda_timing import replay_ms
    from ignition.components import sampling
    from ignition.components.programmatic_launch import programmatic_launch
    from ignition.components.sampling_thresholds import (
        sampling_thresholds,
        sorted_thresholds,
        triton_sampling_thresholds,
    )
    from ignition.components.token_state import RequestState

    results: dict[str, Any] = {"runs": []}
    for vocab in args.vocabs:
        for rows in args.rows:
            # One compilation and capture a variant per shape; the cases change the
            # state and logits the graphs read in place.
            cuda = torch.device("cuda")
            state = RequestState.allocate(rows + 1, vocab, 1, 1, torch.float32, cuda)
            gen = torch.Generator().manual_seed(vocab + rows)
            noise = torch.randn(rows, vocab, generator=gen).cuda()
            logits = noise.clone()
            slots = torch.arange(1, rows + 1, device="cuda")
            graphs, tokens = {}, {}
            variants = (("radix", sampling_thresholds), ("sort", sorted_thresholds))
            for name, thresholds in variants:
                sampling.sampling_thresholds = thresholds  # type: ignore[assignment]
                torch._dynamo.reset()
                sample = torch.compile(sampling.sample_padded, fullgraph=True, dynamic=False)
                for _ in range(3):
                    sample(logits, state, slots)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                # As preparation captures: launched programmatically where the GPU can
                # (the radix passes; the sort's kernels launch plainly).
                with programmatic_launch(), torch.cuda.graph(graph):
                    tokens[name] = sample(logits, state, slots)
                graphs[name] = graph
            sampling.sampling_thresholds = sampling_thresholds  # type: ignore[assignment]
            for case, (temperature, top_k, top_p, scale) in CASES.items():
                state.temperature.fill_(temperature)
                state.top_k.fill_(top_k)
                state.top_p.fill_(top_p)
                logits.copy_(scale * noise)
                for graph in graphs.values():
                    graph.replay()
                torch.cuda.synchronize()
                run = {
                    "vocab": vocab,
                    "rows": rows,
                    "case": case,
                    # The same inputs, both thresholds' draws (a sort's nucleus sums
                    # in another order: a token at the edge may differ).
                    "same_tokens": bool(torch.equal(tokens["radix"], tokens["sort"])),
                }
                times: dict[str, list[float]] = {name: [] for name in graphs}
                for block in range(4):
                    order = list(graphs) if block % 2 == 0 else list(graphs)[::-1]
                    for name in order:
                        replays = replay_ms(graphs[name], args.replays // 4)
                        times[name] += [ms * 1e3 for ms in replays]
                for name, values in times.items():
                    run[f"{name}_median_us"] = statistics.median(values)
                    run[f"{name}_p99_us"] = sorted(values)[int(0.99 * (len(values) - 1))]
                run["radix_over_sort"] = run["radix_median_us"] / run["sort_median_us"]
                results["runs"].append(run)
                print(json.dumps(run), file=sys.stderr)
    # The thresholds alone at each chunk a program histograms (more programs a row,
    # or fewer histograms each re-reads), captured as the sampler captures them.
    results["chunks"] = []
    for vocab in args.vocabs:
        for rows in args.rows:
            gen = torch.Generator().manual_seed(vocab)
            probs = torch.softmax(torch.randn(rows, vocab, generator=gen), dim=-1).cuda()
            top_k = torch.full((rows,), 20, dtype=torch.int32, device="cuda")
            top_p = torch.full((rows,), 0.95, device="cuda")
            for chunk in args.chunks:
                for digit in args.digits or [None]:
                    # No --digits: the function's own digit, not passed (a tree before
                    # digits were a parameter times the same way).
                    digits = {} if digit is None else {"digit": digit}
                    for _ in range(2):
                        triton_sampling_thresholds(probs, top_k, top_p, chunk, **digits)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with programmatic_launch(), torch.cuda.graph(graph):
                        triton_sampling_thresholds(probs, top_k, top_p, chunk, **digits)
                    values = [ms * 1e3 for ms in replay_ms(graph, args.replays)]
                    row = {"vocab": vocab, "rows": rows, "chunk": chunk, "digit": digit}
                    row["median_us"] = statistics.median(values)
                    results["chunks"].append(row)
                    print(json.dumps(row), file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096],
        help="columns a thresholds program histograms, each timed alone",
    )
    parser.add_argument(
        "--digits",
        type=int,
        nargs="+",
        default=None,
        help="bits a thresholds pass decides, each timed alone at each chunk "
        "(default: the sampler's own, not passed)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    results = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
