"""Per-kernel timeline of the decode graphs: where a decode step's time goes.

Prepares MODEL as ``ignition prepare`` does (compiled, captured), puts ``c`` requests
into the decode state for each capacity ``c``, and replays the decode graph of that
capacity ``--steps`` times under the PyTorch profiler (CUPTI records every kernel a
graph launch runs, with the launch's correlation id). Per capacity it reports:

- kernels per graph launch and per layer;
- the summed kernel time against the graph's span on the GPU (first kernel start to
  last kernel end) and against the wall time between CUDA events around the launch:
  the gaps between them are launch latency inside the graph and host time outside;
- the kernels by total time (name, count per launch, median duration);
- the gaps between kernels by the kernels around them (the kernel before, the one
  after; count per launch, median, total), which add up to the span less the busy
  time;
- the step time without the profiler (median and p99 of ``--steps`` more replays) and,
  with ``--geometry``, that step against the roofline: the bytes the step reads (see
  ``bench/suite/report.py``) over the read bandwidth measured here, in this process:
  the fastest of the synthetic probes (``bench.suite.bandwidth``) and one row through
  the prepared model's own vocabulary head (``vocabulary_head``).

    python bench/kernel_timeline.py MODEL --capacities 1 4 --steps 50 --out timeline.json \\
        [--trace-dir DIR] [--context-limit N] [--prefill-chunk-size N] \\
        [--geometry NAME|config.json] [--no-compile] \\
        [--compile-scope S] [--[no-]compile-sampling] [--decode-fusion F] \\
        [--[no-]programmatic-launch] [--[no-]early-weights] \\
        [--compare-programmatic-launch] [--compare-early-weights]

With ``--compare-programmatic-launch`` the decode graphs are captured a second time
with the other launch (``ignition.components.programmatic_launch``) over the same
storage, and both are profiled and timed in this run, their unprofiled steps in
alternating blocks (``compared`` in the results, by variant: ``programmatic`` or
``plain``). ``--compare-early-weights`` does the same for a programmatic launch with
the other choice of early weights (variant ``early weights`` or ``late weights``);
both may be given.

``summarize`` (the aggregation) is pure and tested on the CPU; the measurement needs
a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.suite.bandwidth import projection_probe, read_bandwidth_probes
from bench.suite.report import resolve_geometry, roofline_step_s
from ignition.preparation.compile_flags import add_compile_options, compile_options

# Measured once per process, on first use: each probe's bytes/s, the fastest the
# roofline's (``bench.suite.bandwidth``).
probes = functools.cache(read_bandwidth_probes)


def bandwidth() -> float:
    return max(probes().values())


def head_weight(model: Any) -> Any:
    """The prepared model's vocabulary head weight (``vocab x hidden``; the embeddings
    where they are tied), or None where no weight has that shape (a rank's shard)."""
    g = model.geometry
    shape = (int(g.vocab), int(g.hidden))
    return next((w for w in model.weights.values() if tuple(w.shape) == shape), None)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _gaps(kernels: Sequence[dict[str, Any]]) -> list[tuple[str, str, float]]:
    """The idle stretches between ``kernels`` (sorted by start), each as (the kernel
    whose end began it, the kernel whose start ended it, its length in us): together
    the span less the busy time. A kernel that starts under another's tail (a
    programmatic launch) leaves no gap."""
    gaps = []
    reach, last = float("inf"), ""
    for kernel in kernels:
        start = float(kernel["ts"])
        end = start + float(kernel["dur"])
        if start > reach:
            gaps.append((last, str(kernel["name"]), start - reach))
        if reach == float("inf") or end > reach:
            reach, last = end, str(kernel["name"])
    return gaps


def _exclusive(kernels: Sequence[dict[str, Any]]) -> list[float]:
    """Each of ``kernels``' (sorted by start) share of the launch's busy time: from its
    start, or the end of the kernels before it where that is later, to its end (none
    if they end after it). The shares sum to the busy time, and a programmatically
    launched kernel's wait under the kernel before is that kernel's, so the shares of
    one launch compare with another's; the durations do not."""
    shares = []
    reach = float("-inf")
    for kernel in kernels:
        start = float(kernel["ts"])
        end = start + float(kernel["dur"])
        shares.append(max(0.0, end - max(start, reach)))
        reach = max(reach, end)
    return shares


def _shape(kernel: dict[str, Any]) -> str:
    """A kernel's grid, as the trace records it (``x,y,z``), or ``-``."""
    grid = (kernel.get("args") or {}).get("grid")
    return ",".join(str(g) for g in grid) if isinstance(grid, list) else "-"


def graph_launches(events: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The kernels (``cat: kernel``) of a Chrome trace's graph launches, by the
    correlation id of the ``cudaGraphLaunch`` runtime event they carry (a launch with
    no kernel maps to an empty list; kernels of no graph launch are dropped)."""
    events = list(events)
    launches: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("ph") != "X":
            continue
        correlation = (event.get("args") or {}).get("correlation")
        if correlation is None:
            continue
        if event.get("cat") == "cuda_runtime" and "GraphLaunch" in str(event.get("name")):
            launches.setdefault(int(correlation), [])
    for event in events:
        correlation = (event.get("args") or {}).get("correlation")
        if event.get("cat") == "kernel" and correlation is not None:
            group = launches.get(int(correlation))
            if group is not None:
                group.append(event)
    return launches


def write_results(out: Path, results: dict[str, Any], markdown: str) -> None:
    """``results`` as JSON to ``out`` and ``markdown`` beside it (``.md``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(f"wrote {out}", file=sys.stderr)


def timeline_parser(description: str) -> argparse.ArgumentParser:
    """A timeline's command line, its first argument the model."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", type=Path, help="checkpoint directory or .gguf")
    return parser


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """A timeline's last options: how to prepare (``ignition prepare``'s compile
    options), where its traces and results go."""
    add_compile_options(parser)
    parser.add_argument("--trace-dir", type=Path, help="keep the Chrome traces here")
    parser.add_argument("--out", type=Path, required=True, help="results JSON (and .md)")


def summarize(
    events: Iterable[dict[str, Any]], *, layers: int, wall_us: Sequence[float] = ()
) -> dict[str, Any]:
    """Aggregates a Chrome trace's events (``ph: X``, times in microseconds) of graph
    launches. Kernels (``cat: kernel``) belong to the ``cudaGraphLaunch`` runtime event
    whose ``args.correlation`` they carry; launches with no kernel are dropped. The
    gaps between a launch's kernels are attributed to the kernels around them
    (``top_gaps``: the kernel before, the kernel after)."""
    launches = graph_launches(events)
    per_launch = []
    by_name: dict[str, list[float]] = defaultdict(list)
    by_pair: dict[tuple[str, str], list[float]] = defaultdict(list)
    # (kernel, grid, the kernel before it) -> each launch's exclusive shares: the
    # decode projections told apart (qkv after the norm, o after attention, down
    # after the gated kernel, the vocabulary head by its grid).
    by_site: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for correlation in sorted(launches):
        kernels = sorted(launches[correlation], key=lambda k: float(k["ts"]))
        if not kernels:
            continue
        summed = sum(float(k["dur"]) for k in kernels)
        start = float(kernels[0]["ts"])
        end = max(float(k["ts"]) + float(k["dur"]) for k in kernels)
        gaps = _gaps(kernels)
        per_launch.append(
            {
                "kernels": len(kernels),
                "kernel_us": summed,
                # The time some kernel ran, overlapping kernels counted once: a
                # programmatically launched kernel starts and waits under the previous
                # one's tail, its duration including that wait, so only this time, not
                # the sum, compares with a plain launch's.
                "busy_us": end - start - sum(gap for _, _, gap in gaps),
                "span_us": end - start,
            }
        )
        for kernel in kernels:
            by_name[str(kernel["name"])].append(float(kernel["dur"]))
        previous = ""
        for kernel, share in zip(kernels, _exclusive(kernels), strict=True):
            name = str(kernel["name"])
            by_site[(name, _shape(kernel), previous)].append(share)
            previous = name
        for before, after, gap in gaps:
            by_pair[(before, after)].append(gap)
    count = len(per_launch)
    kernels = _median([p["kernels"] for p in per_launch])
    kernel_us = _median([p["kernel_us"] for p in per_launch])
    busy_us = _median([p["busy_us"] for p in per_launch])
    span_us = _median([p["span_us"] for p in per_launch])
    wall = _median(list(wall_us))
    top = sorted(
        (
            {
                "name": name,
                "per_launch": len(durations) / count,
                "median_us": statistics.median(durations),
                "total_us_per_launch": sum(durations) / count,
            }
            for name, durations in by_name.items()
        ),
        key=lambda row: -row["total_us_per_launch"],
    )
    top_gaps = sorted(
        (
            {
                "before": before,
                "after": after,
                "per_launch": len(lengths) / count,
                "median_us": statistics.median(lengths),
                "total_us_per_launch": sum(lengths) / count,
            }
            for (before, after), lengths in by_pair.items()
        ),
        key=lambda row: -row["total_us_per_launch"],
    )
    sites = sorted(
        (
            {
                "name": name,
                "grid": grid,
                "after": after,
                "per_launch": len(shares) / count,
                "median_us": statistics.median(shares),
                "total_us_per_launch": sum(shares) / count,
            }
            for (name, grid, after), shares in by_site.items()
        ),
        key=lambda row: -row["total_us_per_launch"],
    )
    return {
        "launches": count,
        "kernels_per_launch": kernels,
        "kernels_per_layer": None if kernels is None else kernels / layers,
        "kernel_us": kernel_us,
        "busy_us": busy_us,
        "span_us": span_us,
        "wall_us": wall,
        "kernel_over_span": None if not span_us or kernel_us is None else kernel_us / span_us,
        "kernel_over_wall": None if not wall or kernel_us is None else kernel_us / wall,
        "top_kernels": top[:25],
        # Gap time a launch (the median, as span and busy; the pairs' totals are means).
        "gap_us": _median([p["span_us"] - p["busy_us"] for p in per_launch]),
        "top_gaps": top_gaps[:15],
        # Busy time by kernel, grid and the kernel before (``_exclusive``).
        "top_sites": sites[:25],
        "per_launch": per_launch,
    }


def fmt(value: float | None, digits: int = 1, grouped: bool = False) -> str:
    """A table cell: ``value`` to ``digits`` places (thousands grouped), or ``-``."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if grouped else f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The summary of every capacity, then each capacity's top kernels."""
    lines = [
        f"# Decode kernel timeline: {results['model']}",
        "",
        "| capacity | kernels/launch | kernels/layer | kernel time (us) | GPU span (us) | "
        "wall (us) | kernel/span | kernel/wall | step, unprofiled (us) | step p99 (us) | "
        "roofline (us) | step/roofline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    for capacity, row in results["capacities"].items():
        lines.append(
            f"| {capacity} | {fmt(row['kernels_per_launch'], 0)} | "
            f"{fmt(row['kernels_per_layer'])} | {fmt(row['kernel_us'])} | "
            f"{fmt(row['span_us'])} | {fmt(row['wall_us'])} | "
            f"{fmt(row['kernel_over_span'], 3)} | {fmt(row['kernel_over_wall'], 3)} | "
            f"{fmt(row.get('step_us'))} | {fmt(row.get('step_p99_us'))} | "
            f"{fmt(row.get('roofline_us'))} | {fmt(row.get('step_over_roofline'), 3)} |"
        )
    if results.get("bandwidth_probes"):
        probes = ", ".join(
            f"{name} {value / 1e12:.2f}" for name, value in results["bandwidth_probes"].items()
        )
        lines += ["", f"Read bandwidth probes (TB/s; the roofline takes the fastest): {probes}."]
    for variant in results.get("compared", {}).values():
        launch = "on" if variant["programmatic_launch"] else "off"
        if variant["programmatic_launch"]:
            launch += ", early weights " + ("on" if variant.get("early_weights") else "off")
        lines += [
            "",
            f"## The same decode graphs captured with programmatic launch {launch}",
            "",
            "Both sets of graphs over the same storage, their unprofiled steps in "
            "alternating blocks.",
            "",
            "Busy time is the time some kernel of the step ran (overlapping kernels counted "
            "once): under programmatic launch a kernel's duration includes its wait for the "
            "one before, so summed kernel times do not compare.",
            "",
            "| capacity | step, as prepared (us) | step, compared (us) | compared / prepared | "
            "p99, as prepared | p99, compared | busy, as prepared (us) | busy, compared (us) "
            "| GPU span, as prepared (us) | GPU span, compared (us) | gaps, as prepared (us) "
            "| gaps, compared (us) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for capacity, other in variant["capacities"].items():
            row = results["capacities"][capacity]
            ratio = other["step_us"] / row["step_us"] if row.get("step_us") else None
            lines.append(
                f"| {capacity} | {fmt(row.get('step_us'))} | {fmt(other.get('step_us'))} | "
                f"{fmt(ratio, 3)} | {fmt(row.get('step_p99_us'))} | "
                f"{fmt(other.get('step_p99_us'))} | {fmt(row.get('busy_us'))} | "
                f"{fmt(other.get('busy_us'))} | {fmt(row['span_us'])} | {fmt(other['span_us'])} | "
                f"{fmt(row.get('gap_us'))} | {fmt(other.get('gap_us'))} |"
            )
    for capacity, row in results["capacities"].items():
        lines += ["", f"## Capacity {capacity}: kernels by time", ""]
        lines += ["| kernel | per launch | median (us) | total/launch (us) |", "|---|---|---|---|"]
        for kernel in row["top_kernels"]:
            name = kernel["name"].replace("|", "/")[:90]
            lines.append(
                f"| `{name}` | {kernel['per_launch']:.1f} | {kernel['median_us']:.2f} | "
                f"{kernel['total_us_per_launch']:.2f} |"
            )
        lines += _site_lines(f"Capacity {capacity}", row)
        lines += _gap_lines(f"Capacity {capacity}", row)
        for name, variant in results.get("compared", {}).items():
            other = variant["capacities"].get(capacity)
            if other is not None:
                lines += _site_lines(f"Capacity {capacity}, {name}", other)
                lines += _gap_lines(f"Capacity {capacity}, {name}", other)
    return "\n".join(lines) + "\n"


def _attribution(title: str, intro: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """One attribution table: its heading, the sentence saying what it counts, then
    ``header`` and ``rows``."""
    lines = ["", f"## {title}", "", intro, "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _name(kernel: str) -> str:
    return "`" + kernel.replace("|", "/")[:60] + "`"


def _site_lines(title: str, row: dict[str, Any]) -> list[str]:
    """The busy time of ``row``'s kernels by grid and the kernel before them."""
    sites = row.get("top_sites")
    if not sites:
        return []
    return _attribution(
        f"{title}: busy time by kernel, grid and the kernel before",
        "Each kernel's share of the busy time: from its start, or the end of the kernels "
        "before it where later, to its end (a programmatic launch's wait is the kernel "
        "before's), so these compare across launches.",
        ["kernel", "grid", "after", "per launch", "median (us)", "total/launch (us)"],
        [
            [
                _name(site["name"]),
                site["grid"],
                _name(site["after"]),
                f"{site['per_launch']:.1f}",
                f"{site['median_us']:.2f}",
                f"{site['total_us_per_launch']:.2f}",
            ]
            for site in sites
        ],
    )


def _gap_lines(title: str, row: dict[str, Any]) -> list[str]:
    """The gap table of one capacity's summary ``row``: none where it has no gaps."""
    if not row.get("top_gaps"):
        return []
    return _attribution(
        f"{title}: gaps between kernels, by the kernels around them",
        f"{fmt(row.get('gap_us'))} us of gaps a launch (the median of the span less the busy "
        "time; the totals below are means per launch).",
        [
            "kernel before the gap",
            "kernel after it",
            "per launch",
            "median (us)",
            "total/launch (us)",
        ],
        [
            [
                _name(gap["before"]),
                _name(gap["after"]),
                f"{gap['per_launch']:.1f}",
                f"{gap['median_us']:.2f}",
                f"{gap['total_us_per_launch']:.2f}",
            ]
            for gap in row["top_gaps"]
        ],
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ignition.components.programmatic_launch import (
        launches_programmatically,
        programmatic_launch,
    )
    from ignition.components.token_state import NULL_SLOT
    from ignition.preparation.catalog import GraphKey, GraphKind
    from ignition.preparation.prepared import PrepareOptions, prepare, recapture
    from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode

    capacities = sorted(set(args.capacities))
    geometry = resolve_geometry(args.geometry) if args.geometry else None
    options = compile_options(args)
    prepared = prepare(
        args.model,
        PrepareOptions(
            max_concurrency=max(capacities),
            prefill_chunk_size=args.prefill_chunk_size,
            context_limit=args.context_limit,
            **options,
        ),
    )
    # The served vocabulary head as a read-bandwidth probe, beside the synthetic ones
    # (``bench.suite.bandwidth``): the roofline takes the fastest of all.
    head = head_weight(prepared.model) if geometry is not None else None
    head_rate = projection_probe(head) if head is not None else 0.0

    def rate() -> float:
        return max(bandwidth(), head_rate)

    catalog = prepared.catalog
    state, staging = prepared.storage.state, prepared.storage.staging
    page = catalog.page_size
    # The decode graphs as prepared (None), and with --compare-programmatic-launch or
    # --compare-early-weights the same graphs captured again with the other launch.
    launches: dict[str, dict[str, bool]] = {}
    if args.compare_programmatic_launch:
        other = not options["programmatic_launch"]
        launches["programmatic" if other else "plain"] = {
            "programmatic_launch": other,
            "early_weights": options["early_weights"],
        }
    if args.compare_early_weights:
        if not options["programmatic_launch"]:
            # The compared graphs would differ in two ways at once.
            raise SystemExit(
                "--compare-early-weights compares two programmatic launches: drop "
                "--no-programmatic-launch (or compare the launches alone)"
            )
        other = not options["early_weights"]
        launches["early weights" if other else "late weights"] = {
            "programmatic_launch": True,
            "early_weights": other,
        }
    variants: dict[str, dict[GraphKey, Any] | None] = {"prepared": None}
    if launches:
        with programmatic_launch(True):
            able = launches_programmatically(torch.device("cuda"))
        if not able:
            raise SystemExit(
                "comparing launches needs a GPU of compute capability 9.0 or later "
                "(Hopper): this one launches every kernel plainly"
            )
        decode = (GraphKey(GraphKind.DECODE, catalog.decode_capacity(c)) for c in capacities)
        keys = list(dict.fromkeys(decode))
        for name, launch in launches.items():
            variants[name] = recapture(
                prepared,
                keys,
                programmatic=launch["programmatic_launch"],
                early_weights=launch["early_weights"],
            )
    # Unprofiled steps come in alternating blocks of --steps, the order reversed in the
    # second round (as prepared, compared, compared, as prepared), so that a slow
    # phase of the machine and the growing context fall on both variants alike.
    rounds = 2 if len(variants) > 1 else 1
    # Each request decodes, per variant, the warm-up, the profiled steps and the
    # unprofiled ones.
    generated = len(variants) * (args.warmup + (1 + rounds) * args.steps)
    pages_each = (args.prompt_tokens + generated + page) // page + 1
    layers = int(prepared.model.geometry.layers)
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)
    results: dict[str, Any] = {
        "model": str(args.model),
        # "auto" as the recipe resolved it for this geometry and rank layout.
        "options": {**options, "decode_fusion": prepared.model.decode_fusion},
        "steps": args.steps,
        # What this preparation cost: its times (load, compile and capture) and bytes.
        "preparation": {
            "max_concurrency": catalog.max_concurrency,
            "decode_capacities": list(catalog.decode),
            "timings_s": dict(prepared.timings),
            "memory_bytes": prepared.memory.as_dict(),
        },
        "capacities": {},
    }
    if launches:
        results["compared"] = {
            name: {**launch, "capacities": {}} for name, launch in launches.items()
        }
    for capacity in capacities:
        prepared.reset()
        graph_capacity = catalog.decode_capacity(capacity)
        slots = list(range(1, capacity + 1))
        prompt = [(7 * i) % 1000 + 3 for i in range(args.prompt_tokens)]
        for slot in slots:
            first = 1 + (slot - 1) * pages_each
            pages = torch.arange(first, first + pages_each, dtype=torch.int32)
            state.page_table[slot, :pages_each] = pages
            budget = generated + 8
            pack_admission(staging, slot, prompt, budget, sampling, seed=slot)
            prepared.execute(GraphKey(GraphKind.ADMIT, 1))
            pack_chunk(staging, slot, prompt, ends_prompt=True)
            prepared.execute(GraphKey(GraphKind.PREFILL, catalog.prefill_capacity(len(prompt))))
        assert NULL_SLOT not in slots
        pack_decode(staging, slots, graph_capacity)
        key = GraphKey(GraphKind.DECODE, graph_capacity)
        context = args.prompt_tokens  # the requests' length before the next step
        summaries: dict[str, dict[str, Any]] = {}
        for name, graphs in variants.items():
            with _graphs(prepared, key, graphs):
                for _ in range(args.warmup):
                    prepared.execute(key)
                torch.cuda.synchronize()
                marks = [
                    (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    for _ in range(args.steps)
                ]
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for begin, end in marks:
                        begin.record()
                        prepared.execute(key)
                        end.record()
                    torch.cuda.synchronize()
            context += args.warmup + args.steps
            wall_us = [begin.elapsed_time(end) * 1e3 for begin, end in marks]
            suffix = "" if name == "prepared" else f".{name}"
            trace = Path(args.trace_dir or "/tmp") / f"decode-c{capacity}{suffix}.trace.json"
            trace.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
            summaries[name] = summarize(events, layers=layers, wall_us=wall_us)
            summaries[name]["graph_capacity"] = graph_capacity
        steps_us: dict[str, list[float]] = {name: [] for name in variants}
        contexts: list[float] = []
        for round_ in range(rounds):
            order = list(variants.items())
            for name, graphs in order if round_ % 2 == 0 else order[::-1]:
                with _graphs(prepared, key, graphs):
                    steps_us[name] += _unprofiled_steps_us(prepared, key, args.steps)
                contexts.append(context + (args.steps - 1) / 2)
                context += args.steps
        for name, summary in summaries.items():
            summary["step_us"] = statistics.median(steps_us[name])
            summary["step_p99_us"] = _p99(steps_us[name])
            # Every request samples one token a step.
            summary["tokens_per_s"] = capacity / (summary["step_us"] * 1e-6)
            if geometry is not None:
                # The mean context of the unprofiled steps (of both variants: they
                # alternate, so their means differ by a block).
                roofline = (
                    roofline_step_s(geometry, rate(), capacity, statistics.mean(contexts)) * 1e6
                )
                summary["roofline_us"] = roofline
                summary["step_over_roofline"] = summary["step_us"] / roofline
        results["capacities"][str(capacity)] = summaries["prepared"]
        for name in launches:
            results["compared"][name]["capacities"][str(capacity)] = summaries[name]
        for name, summary in summaries.items():
            print(
                f"c={capacity}{'' if name == 'prepared' else ' (' + name + ')'}: "
                f"{summary['kernels_per_launch']} kernels, "
                f"kernel {summary['kernel_us']} us, span {summary['span_us']} us, "
                f"wall {summary['wall_us']} us, unprofiled step {summary['step_us']:.1f} us"
                + (
                    f" ({summary['step_over_roofline']:.3f}x the roofline)"
                    if geometry is not None
                    else ""
                ),
                file=sys.stderr,
            )
    results["layers"] = layers
    if geometry is not None:
        results["geometry"] = args.geometry
        results["bandwidth_bytes_per_s"] = rate()
        served = {"vocabulary_head": head_rate} if head is not None else {}
        results["bandwidth_probes"] = {**probes(), **served}
    return results


@contextlib.contextmanager
def _graphs(prepared: Any, key: Any, graphs: dict[Any, Any] | None) -> Iterator[None]:
    """Within the block, ``prepared`` replays ``graphs[key]`` for ``key`` (None: its
    own graph)."""
    if graphs is None:
        yield
        return
    own = prepared.graphs[key]
    prepared.graphs[key] = graphs[key]
    try:
        yield
    finally:
        prepared.graphs[key] = own


def _unprofiled_steps_us(prepared: Any, key: Any, steps: int) -> list[float]:
    """Each of ``steps`` replays of the graph ``key``, between CUDA events, in us."""
    import torch

    marks = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(steps)
    ]
    torch.cuda.synchronize()
    for begin, end in marks:
        begin.record()
        prepared.execute(key)
        end.record()
    torch.cuda.synchronize()
    return [begin.elapsed_time(end) * 1e3 for begin, end in marks]


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = timeline_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--context-limit", type=int, default=4096)
    parser.add_argument(
        "--prefill-chunk-size",
        type=int,
        default=4096,
        help="largest prefill graph (default 4096); at least --prompt-tokens",
    )
    parser.add_argument(
        "--geometry",
        help="bytes per step from this geometry (a name of bench/suite/report.py or a "
        "config.json): the step against the roofline, at bandwidth measured here",
    )
    parser.add_argument(
        "--compare-programmatic-launch",
        action="store_true",
        help="also capture the decode graphs with the other launch (--programmatic-launch "
        "or not) over the same storage and time both, alternating, in this run",
    )
    parser.add_argument(
        "--compare-early-weights",
        action="store_true",
        help="also capture the decode graphs launched programmatically with the other "
        "choice of --early-weights over the same storage and time both, alternating, in "
        "this run",
    )
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    results = measure(args)
    write_results(args.out, results, markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
