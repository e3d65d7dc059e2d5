"""Prepared concurrency as an option: what each costs and what it serves.

For each option N, ``bench/issue23_chain.sh concurrency`` (SmolLM2's stand-in) or
``concurrency-8b`` prepares a core with ``--max-concurrency N`` and has ``flare replay
--bench-decode N`` time the decode graph at capacity N, into ``DIR/cN/`` (``prepare.log``
ending with the export report, ``replay.json``). This summarizes them:

    python3 bench/concurrency_options.py summarize DIR --model NAME

writes ``DIR/summary.json`` and prints a table, per option: graphs captured, whether
the compile caches were cold or held an earlier option's kernels (``cN/caches.txt``),
the time preparation took to warm up, compile and capture them (and the whole export),
the device memory each region backs (weights, KV pages, snapshot rows, scratch with
the graph pool, the rest), and the decode step at full capacity: median and p99, and
tokens per second (N tokens a step). An option whose preparation or bench did not
finish (a run that ran out of time: no export report, or no ``replay.json``) is
listed as unfinished, with what it lacks, below the options that did.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

GIB = 1 << 30


def export_report(log: Path) -> dict[str, Any]:
    """The export report that ends ``ignition prepare --out``'s output: the last
    top-level JSON object of the log."""
    text = log.read_text()
    starts = [m.start() for m in re.finditer(r"^\{$", text, flags=re.MULTILINE)]
    if not starts:
        raise ValueError(f"{log} holds no export report")
    return json.loads(text[starts[-1] :])


def option(directory: Path) -> dict[str, Any]:
    """One option's row from ``directory`` (``cN``)."""
    capacity = int(directory.name.removeprefix("c"))
    report = export_report(directory / "prepare.log")
    replay = json.loads((directory / "replay.json").read_text())
    bench = replay["decode_bench"]
    if bench["capacity"] != capacity:
        raise ValueError(f"{directory}: the bench ran capacity {bench['capacity']}")
    regions = {name: usage["backed"] for name, usage in report["regions"].items()}
    # The compile caches' state before this option's preparation (cold, or warm with
    # an earlier option's kernels), where the chain recorded it.
    caches_file = directory / "caches.txt"
    caches = caches_file.read_text().strip() if caches_file.exists() else None
    named = ("weights", "kv_pages", "snapshot_rows", "scratch")
    median = bench["step"]["median_ms"]
    return {
        "max_concurrency": capacity,
        "graphs": report["graphs"],
        "nodes": report["nodes"],
        "compile_capture_s": report["timings"].get("compile_capture_s"),
        "caches": caches,
        "prepare_s": report["timings"]["prepare_s"],
        "export_s": report["timings"]["export_s"],
        "backed_gib": {
            **{name: regions.get(name, 0) / GIB for name in named},
            "other": sum(v for k, v in regions.items() if k not in named) / GIB,
            "total": sum(regions.values()) / GIB,
        },
        "kv_pages": replay["load"]["kv_pages"],
        "step_median_ms": median,
        "step_p99_ms": bench["step"]["p99_ms"],
        "device_ms_per_replay": bench["device_ms_per_replay"],
        "tokens_per_s": capacity * 1000.0 / median,
        "allocation_free": bench["allocation_free"],
    }


def unfinished(directory: Path) -> str | None:
    """What option ``directory`` lacks to be summarized, or ``None``: a preparation
    cut off before its export report, or a bench that wrote no report."""
    log = directory / "prepare.log"
    if not log.exists() or not re.search(r"^\{$", log.read_text(), flags=re.MULTILINE):
        return "preparation did not finish (no export report in prepare.log)"
    if not (directory / "replay.json").exists():
        return "the decode bench did not finish (no replay.json)"
    return None


def summarize(directory: Path, model: str) -> dict[str, Any]:
    folders = sorted(
        (d for d in directory.iterdir() if d.is_dir() and re.fullmatch(r"c\d+", d.name)),
        key=lambda d: int(d.name.removeprefix("c")),
    )
    if not folders:
        raise ValueError(f"{directory} holds no option (cN folders)")
    missing = {d: unfinished(d) for d in folders}
    return {
        "model": model,
        "options": [option(d) for d in folders if missing[d] is None],
        "unfinished": [
            {"max_concurrency": int(d.name.removeprefix("c")), "reason": reason}
            for d, reason in missing.items()
            if reason is not None
        ],
    }


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['model']}: prepared concurrency options",
        "| N | graphs | caches | capture s | export s | weights GiB | KV GiB | snapshots GiB "
        "| scratch GiB | total GiB | step ms (p99) | tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["options"]:
        backed = row["backed_gib"]
        capture = row["compile_capture_s"]
        lines.append(
            f"| {row['max_concurrency']} | {row['graphs']} | {row['caches'] or '-'} | "
            f"{'-' if capture is None else f'{capture:.1f}'} | {row['export_s']:.1f} | "
            f"{backed['weights']:.2f} | {backed['kv_pages']:.2f} | "
            f"{backed['snapshot_rows']:.2f} | {backed['scratch']:.2f} | {backed['total']:.2f} | "
            f"{row['step_median_ms']:.3f} ({row['step_p99_ms']:.3f}) | "
            f"{row['tokens_per_s']:.0f} |"
        )
    lines += [
        f"- {row['max_concurrency']}: unfinished, {row['reason']}"
        for row in summary.get("unfinished", [])
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    summarize_cmd = sub.add_parser("summarize", help="the options' table from DIR/cN/")
    summarize_cmd.add_argument("directory", type=Path)
    summarize_cmd.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    summary = summarize(args.directory, args.model)
    (args.directory / "summary.json").write_text(json.dumps(summary, indent=1))
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
