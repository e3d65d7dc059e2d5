"""Per-kernel timeline of a cold prefill chunk: where a long prompt's first token goes.

Prepares MODEL as ``ignition prepare`` does (compiled, captured), then for each prompt
length L of ``--prompt-tokens`` admits one request with an L-token prompt into empty
pages and replays the prefill graph that holds it, ``--repeats`` times under the
PyTorch profiler and ``--repeats`` times more without it (each time from a reset
state, as a cold prompt). Per length it reports:

- the chunk's time without the profiler (median and p99 between CUDA events);
- busy time and gaps, and the kernels by time, by grid and the kernel before, and the
  gaps by the kernels around them (``bench.kernel_timeline.summarize``);
- busy time by class (``kernel_class``: the GEMMs, prefill attention, everything else)
  and, with ``--geometry``, each class's arithmetic rate: the projections' FLOPs
  (2 x the layers' projection parameters x L) over the GEMMs' busy time, causal
  attention's (4 x heads x head_dim x layers x L(L+1)/2) over attention's, and both
  over the chunk's time.

    python bench/prefill_timeline.py MODEL --prompt-tokens 512 4096 --repeats 5 \\
        --geometry qwen3-8b --out prefill.json [--trace-dir DIR] [--context-limit N] \\
        [--compile-scope S] [...compile options of ignition prepare]

``classify`` and ``prefill_flops`` are pure and tested on the CPU; the measurement
needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.kernel_timeline import (
    _exclusive,
    _gap_lines,
    _gaps,
    _p99,
    _site_lines,
    add_output_arguments,
    fmt,
    graph_launches,
    summarize,
    timeline_parser,
    write_results,
)
from bench.suite.report import Geometry, resolve_geometry
from ignition.preparation.compile_flags import compile_options

# Substrings of the kernel names of matrix products: cuBLAS's (``nvjet``, ``xmma``,
# ``gemm``), CUTLASS's, and Triton matmuls that Inductor names ``mm``.
GEMM_MARKS = ("nvjet", "gemm", "xmma", "cutlass", "triton_tem_fused_mm", "_mm_")
# The prefill attention kernels: Flare's, and PyTorch's flash kernel, which a long
# chunk's two parts launch (``triton_attention.triton_paged_prefill_attention_rope``).
ATTENTION_MARKS = (
    "_prefill_kernel",
    "_prefill_split_kernel",
    "_prefill_combine_kernel",
    "_prefill_history_kernel",
    "flash_fwd",
)
CLASSES = ("gemm", "attention", "other")


def kernel_class(name: str) -> str:
    """``gemm``, ``attention`` (the prefill attention kernels) or ``other``."""
    if any(mark in name for mark in ATTENTION_MARKS):
        return "attention"
    lowered = name.lower()
    if any(mark in lowered for mark in GEMM_MARKS):
        return "gemm"
    return "other"


def prefill_flops(geometry: Geometry, tokens: int) -> dict[str, float]:
    """A cold chunk of ``tokens``' arithmetic: the layers' projections
    (2 x parameters x tokens) and causal attention (QK and PV, each 2 x head_dim per
    visible pair, tokens(tokens+1)/2 pairs a head), every layer; the vocabulary head
    projects one row and is left out."""
    g = geometry
    projections = g.layers * (
        g.hidden * (g.heads + 2 * g.kv_heads) * g.head_dim
        + g.heads * g.head_dim * g.hidden
        + 3 * g.hidden * g.intermediate
    )
    pairs = tokens * (tokens + 1) / 2
    return {
        "gemm": 2.0 * projections * tokens,
        "attention": 4.0 * g.heads * g.head_dim * g.layers * pairs,
    }


def classify(events: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Busy time (us) a graph launch by ``kernel_class``, each kernel's exclusive share
    (``bench.kernel_timeline._exclusive``), the median over the launches in
    ``events``; and ``gaps``, the median of their gap time."""
    per_class: dict[str, list[float]] = defaultdict(list)
    for kernels in graph_launches(events).values():
        if not kernels:
            continue
        kernels = sorted(kernels, key=lambda k: float(k["ts"]))
        totals = dict.fromkeys(CLASSES, 0.0)
        for kernel, share in zip(kernels, _exclusive(kernels), strict=True):
            totals[kernel_class(str(kernel["name"]))] += share
        totals["gaps"] = sum(gap for _, _, gap in _gaps(kernels))
        for name, value in totals.items():
            per_class[name].append(value)
    return {name: statistics.median(values) for name, values in per_class.items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ignition.preparation.catalog import GraphKey, GraphKind
    from ignition.preparation.prepared import PrepareOptions, prepare
    from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk

    lengths = sorted(set(args.prompt_tokens))
    geometry = resolve_geometry(args.geometry) if args.geometry else None
    if geometry is not None and not isinstance(geometry, Geometry):
        raise SystemExit("--geometry: a dense geometry (its FLOPs are counted here)")
    options = compile_options(args)
    prepared = prepare(
        args.model,
        PrepareOptions(
            max_concurrency=1,
            prefill_chunk_size=max(lengths),
            context_limit=max(args.context_limit, max(lengths) + 64),
            **options,
        ),
    )
    catalog = prepared.catalog
    state, staging = prepared.storage.state, prepared.storage.staging
    page = catalog.page_size
    layers = int(prepared.model.geometry.layers)
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)
    results: dict[str, Any] = {
        "model": str(args.model),
        "options": {**options, "decode_fusion": prepared.model.decode_fusion},
        "repeats": args.repeats,
        "preparation": {
            "prefill_capacities": list(catalog.prefill),
            "timings_s": dict(prepared.timings),
        },
        "lengths": {},
    }

    def admit(prompt: list[int]) -> GraphKey:
        """A cold request of ``prompt`` in slot 1, its chunk staged: the prefill key."""
        prepared.reset()
        pages = (len(prompt) + 8) // page + 1
        state.page_table[1, :pages] = torch.arange(1, 1 + pages, dtype=torch.int32)
        pack_admission(staging, 1, prompt, 8, sampling, seed=1)
        prepared.execute(GraphKey(GraphKind.ADMIT, 1))
        pack_chunk(staging, 1, prompt, ends_prompt=True)
        torch.cuda.synchronize()
        return GraphKey(GraphKind.PREFILL, catalog.prefill_capacity(len(prompt)))

    def timed(key: GraphKey) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        prepared.execute(key)
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) * 1e3

    for length in lengths:
        prompt = [(7 * i) % 1000 + 3 for i in range(length)]
        for _ in range(args.warmup):
            timed(admit(prompt))
        events: list[dict[str, Any]] = []
        profiled_us = []
        for repeat in range(args.repeats):
            key = admit(prompt)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                profiled_us.append(timed(key))
            trace = Path(args.trace_dir or "/tmp") / f"prefill-{length}-{repeat}.trace.json"
            trace.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
            # Correlation ids restart in each profiling session: keep them apart.
            for event in json.loads(trace.read_text())["traceEvents"]:
                ids = event.get("args") or {}
                if "correlation" in ids:
                    event["args"] = {**ids, "correlation": repeat * 10**9 + int(ids["correlation"])}
                events.append(event)
            if args.trace_dir is None:
                trace.unlink()
        chunk_us = [timed(admit(prompt)) for _ in range(args.repeats)]
        summary = summarize(events, layers=layers, wall_us=profiled_us)
        summary.pop("per_launch")
        summary["capacity"] = catalog.prefill_capacity(length)
        summary["chunk_us"] = statistics.median(chunk_us)
        summary["chunk_p99_us"] = _p99(chunk_us)
        summary["chunk_us_all"] = chunk_us
        busy = classify(events)
        summary["busy_by_class_us"] = busy
        if geometry is not None:
            flops = prefill_flops(geometry, length)
            summary["flops"] = flops
            summary["tflops"] = {
                "gemm (of its busy time)": flops["gemm"] / busy["gemm"] / 1e6
                if busy.get("gemm")
                else None,
                "attention (of its busy time)": flops["attention"] / busy["attention"] / 1e6
                if busy.get("attention")
                else None,
                "both (of the chunk's time)": (flops["gemm"] + flops["attention"])
                / summary["chunk_us"]
                / 1e6,
            }
        results["lengths"][str(length)] = summary
        print(
            f"L={length}: chunk {summary['chunk_us']:.1f} us (p99 {summary['chunk_p99_us']:.1f}), "
            + ", ".join(f"{name} {value:.1f}" for name, value in busy.items()),
            file=sys.stderr,
        )
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Prefill kernel timeline: {results['model']}",
        "",
        "A cold prompt of each length in the prefill graph that holds it. Busy time by "
        "class is each kernel's exclusive share (overlaps counted once).",
        "",
        "| prompt | graph | chunk (us) | p99 | kernels | GEMMs (us) | attention (us) | "
        "other (us) | gaps (us) | GEMM TFLOP/s | attention TFLOP/s | chunk TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    for length, row in results["lengths"].items():
        busy = row["busy_by_class_us"]
        rates = list((row.get("tflops") or {}).values()) or [None, None, None]
        lines.append(
            f"| {length} | {row['capacity']} | {fmt(row['chunk_us'])} | "
            f"{fmt(row['chunk_p99_us'])} | {fmt(row['kernels_per_launch'], 0)} | "
            f"{fmt(busy.get('gemm'))} | {fmt(busy.get('attention'))} | "
            f"{fmt(busy.get('other'))} | {fmt(busy.get('gaps'))} | "
            + " | ".join(fmt(rate, 0) for rate in rates)
            + " |"
        )
    for length, row in results["lengths"].items():
        lines += ["", f"## {length} tokens: kernels by time", ""]
        lines += ["| kernel | class | per launch | median (us) | total/launch (us) |"]
        lines += ["|---|---|---|---|---|"]
        for kernel in row["top_kernels"]:
            name = kernel["name"].replace("|", "/")[:90]
            lines.append(
                f"| `{name}` | {kernel_class(kernel['name'])} | {kernel['per_launch']:.1f} | "
                f"{kernel['median_us']:.2f} | {kernel['total_us_per_launch']:.2f} |"
            )
        lines += _site_lines(f"{length} tokens", row)
        lines += _gap_lines(f"{length} tokens", row)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = timeline_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--context-limit",
        type=int,
        default=8192,
        help="prepared context (at least the longest prompt plus 64)",
    )
    parser.add_argument(
        "--geometry",
        help="count FLOPs from this dense geometry (a name of bench/suite/report.py or a "
        "config.json): each class's arithmetic rate",
    )
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    results = measure(args)
    write_results(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
