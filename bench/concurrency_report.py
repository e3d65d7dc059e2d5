"""The prepared-concurrency options side by side: what each costs to prepare and what
it serves, from one ``bench/kernel_timeline.py`` result per option (each prepared with
``--max-concurrency`` of that option, measured at capacity 1 and at the option).

    python bench/concurrency_report.py OUT/option-*.json --out OUT/options.md

Per option: the decode graphs captured, the load and the compile-and-capture time,
the scratch and graph pool, the KV pages that fit beside them, the decode step at one
request and at the option (median, p99), the tokens per second at the option (every
request samples one token a step) and, where the timeline had a geometry, the step
against the weight-read roofline. Pure: tested on the CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kernel_timeline import fmt

# Cells with thousands grouped (steps of thousands of microseconds).
cell = functools.partial(fmt, grouped=True)

MIB = 1 << 20


def row(result: dict[str, Any]) -> dict[str, Any]:
    """One option's figures from its timeline result."""
    preparation = result["preparation"]
    option = int(preparation["max_concurrency"])
    capacities = result["capacities"]
    one, full = capacities.get("1", {}), capacities.get(str(option), {})
    memory, timings = preparation["memory_bytes"], preparation["timings_s"]
    return {
        "option": option,
        "decode_graphs": len(preparation["decode_capacities"]),
        "load_s": timings.get("load_s"),
        "compile_capture_s": timings.get("compile_capture_s"),
        "scratch_and_graph_pool_mib": memory["operator_scratch_and_graph_pool"] / MIB,
        "kv_pages": memory["kv_page_count"],
        "step_c1_us": one.get("step_us"),
        "step_us": full.get("step_us"),
        "step_p99_us": full.get("step_p99_us"),
        "tokens_per_s": full.get("tokens_per_s"),
        "step_over_roofline": full.get("step_over_roofline"),
    }


def table(results: Sequence[dict[str, Any]]) -> str:
    """The options in ascending order as a Markdown table."""
    rows = sorted((row(r) for r in results), key=lambda r: r["option"])
    lines = [
        "| option | decode graphs | load (s) | compile + capture (s) | scratch + graph pool "
        "(MiB) | KV pages | step at 1 (us) | step at option (us) | p99 (us) | tokens/s | "
        "step / roofline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['option']} | {r['decode_graphs']} | {cell(r['load_s'])} | "
            f"{cell(r['compile_capture_s'])} | {cell(r['scratch_and_graph_pool_mib'])} | "
            f"{r['kv_pages']} | {cell(r['step_c1_us'])} | {cell(r['step_us'])} | "
            f"{cell(r['step_p99_us'])} | {cell(r['tokens_per_s'], 0)} | "
            f"{cell(r['step_over_roofline'], 3)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="kernel_timeline.py results")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table")
    args = parser.parse_args(argv)
    text = table([json.loads(path.read_text()) for path in args.results])
    args.out.write_text(text)
    print(text, end="", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
