"""What the token-mask input costs unconstrained decoding, served: two cores of one
checkpoint, one exported with the mask input (the default) and one without
(``ignition prepare --no-token-masks``), measured in the same run. Rounds alternate
the cores (masked, plain, masked, plain, ...); each round runs ``flare replay
--bench-decode`` at capacities 1 and 4 (the native step, no HTTP), then ``flare run``
and streamed unconstrained chats through the openai SDK at each concurrency (the
server's own inter-token latency from its metrics, and each request's mean chunk gap,
as ``constrained_session.latency`` measures them). Ratios are masked over plain, of
the medians over rounds.

    python bench/mask_input_ab.py --flare FLARE --masked CORE --plain CORE --out F.json \\
        [--rounds 2] [--concurrency 1 4] [--requests-rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from constrained_session import latency

SERVING = re.compile(r"serving on (http://\S+)")


def bench_decode(flare: str, core: Path, capacity: int) -> dict[str, float]:
    """The native decode step at ``capacity``: median and p99 over 256 replays."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [flare, "replay", str(core), "--bench-decode", str(capacity), "--json", out.name],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        step = json.loads(Path(out.name).read_text())["decode_bench"]["step"]
    return {"median_ms": step["median_ms"], "p99_ms": step["p99_ms"]}


def served(
    flare: str, core: Path, log: Path, concurrency: list[int], rounds: int
) -> dict[str, Any]:
    """``flare run CORE``'s unconstrained ITL at each concurrency; SIGTERM after."""
    with log.open("w") as sink:
        server = subprocess.Popen(
            [flare, "run", str(core), "--port", "0"], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"flare run did not start:\n{log.read_text()}")
            match = SERVING.search(log.read_text())
            url = match.group(1) if match else None
            time.sleep(0.1)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        return {
            f"c{c}": latency(client, url, core.name, c, rounds, only=("unconstrained",))[
                "unconstrained"
            ]
            for c in concurrency
        }
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flare", required=True)
    parser.add_argument("--masked", type=Path, required=True, help="core with the mask input")
    parser.add_argument("--plain", type=Path, required=True, help="core without it")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests-rounds", type=int, default=3)
    args = parser.parse_args()
    cores = {"masked": args.masked, "plain": args.plain}
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        for name, core in cores.items():
            row: dict[str, Any] = {"round": index, "core": name}
            for capacity in (1, 4):
                row[f"decode_step_c{capacity}"] = bench_decode(args.flare, core, capacity)
            log = args.out.with_name(f"{args.out.stem}-{name}-{index}.log")
            row["served"] = served(args.flare, core, log, args.concurrency, args.requests_rounds)
            rounds.append(row)
            print(json.dumps(row, default=str)[:400], file=sys.stderr)

    def median(name: str, pick: Any) -> float:
        return statistics.median(pick(row) for row in rounds if row["core"] == name)

    picks: dict[str, Any] = {
        f"decode_step_c{c}_median_ms": lambda row, c=c: row[f"decode_step_c{c}"]["median_ms"]
        for c in (1, 4)
    }
    for c in args.concurrency:
        for key in ("served_itl_mean_ms", "request_itl_median_ms", "request_itl_p99_ms"):
            picks[f"c{c}_{key}"] = lambda row, c=c, key=key: row["served"][f"c{c}"][key]
    summary = {}
    for key, pick in picks.items():
        masked, plain = median("masked", pick), median("plain", pick)
        summary[key] = {"masked": masked, "plain": plain, "ratio": masked / plain}
    args.out.write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2) + "\n")
    for key, row in summary.items():
        print(
            f"{key}: masked {row['masked']:.4f} plain {row['plain']:.4f} x{row['ratio']:.4f}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
