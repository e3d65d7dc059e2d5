"""Picks the decode fusion whose kernel timeline has the fastest batch-1 step.

    python -m bench.fastest_fusion TIMELINE.json... [--capacity 1] [--out FILE]

Each TIMELINE.json is a ``bench/kernel_timeline.py`` result of the same model prepared
with a different ``--decode-fusion`` (its ``options`` name it). Prints a table of every
capacity's unprofiled step (median, p99) and its ratio to the roofline where measured,
and writes the fusion with the lowest median step at ``--capacity`` to ``--out``.
Pure: runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kernel_timeline import fmt


def fastest(results: Sequence[dict[str, Any]], capacity: int = 1) -> str:
    """The decode fusion of the result with the lowest median step at ``capacity``."""
    timed = [r for r in results if r["capacities"].get(str(capacity), {}).get("step_us")]
    if not timed:
        raise ValueError(f"no timeline has an unprofiled step at capacity {capacity}")
    best = min(timed, key=lambda r: r["capacities"][str(capacity)]["step_us"])
    return str(best["options"]["decode_fusion"])


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| decode fusion | capacity | kernels/launch | step (us) | step p99 (us) | "
        "roofline (us) | step/roofline |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for capacity, row in result["capacities"].items():
            lines.append(
                f"| {result['options']['decode_fusion']} | {capacity} | "
                f"{fmt(row.get('kernels_per_launch'), 0)} | {fmt(row.get('step_us'))} | "
                f"{fmt(row.get('step_p99_us'))} | {fmt(row.get('roofline_us'))} | "
                f"{fmt(row.get('step_over_roofline'), 3)} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timelines", type=Path, nargs="+")
    parser.add_argument("--capacity", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the fastest fusion's name here")
    args = parser.parse_args(argv)
    results = [json.loads(path.read_text()) for path in args.timelines]
    choice = fastest(results, args.capacity)
    print(table(results))
    print(f"fastest at capacity {args.capacity}: {choice}")
    if args.out:
        args.out.write_text(choice + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
