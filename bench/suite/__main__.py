"""Runs the design's minimum measurement set against one engine and writes every raw
sample as JSON (rewritten after each measurement, so a run cut short keeps what it
measured).

    python -m bench.suite --url http://127.0.0.1:8080 --engine flare --out flare.json \\
        --tokenizer PATH [--workloads long decode prefix agent tools clients]
        [--concurrency 1 2 4] [--client-threads]
        [--api-key KEY] [--dialect openai|transformers] [--context-limit N]
        [--geometry smollm2-135m|qwen3-8b|config.json] [--bandwidth-gbs X | --measure-bandwidth]
        [--launch "flare run CORE --port 8080"]

    python -m bench.suite --replay [MODEL] --engine python-floor --out floor.json

    python -m bench.suite --generate MODEL_DIR --engine transformers-static --out gen.json

``--url`` measures any OpenAI-compatible server (``--launch CMD`` starts it first and
records the time until it answers; concurrent streams run in one forked client
process each, or as threads with ``--client-threads``); ``--replay`` prepares MODEL (default: the
embedded SmolLM2) and measures Ignition's replay harness in this process;
``--generate`` measures Transformers' static-cache generate loop on a Transformers
checkpoint directory in this process (one request at a time). The ``clients``
workload (HTTP servers only) times the same chat requests through the suite's own
client and the official ``openai`` SDK, which must then be importable. Prompt
lengths are exact under ``--tokenizer`` (a ``tokenizer.json``, a Transformers
directory or hub name, a ``.gguf`` file, or ``words`` for whitespace word-level
tokenizers); the replay floor uses its own. Then ``python -m bench.suite.report``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.suite.client import (
    DIALECTS,
    Endpoint,
    Engine,
    HttpEngine,
    Sample,
    client_ttft_rows,
    client_ttft_summary,
)
from bench.suite.report import GEOMETRIES, resolve_geometry
from bench.suite.server_metrics import difference
from bench.suite.workloads import (
    HTTP_WORKLOADS,
    WORKLOADS,
    BenchRequest,
    Encode,
    Measurement,
    SuiteSettings,
    minimum_set,
    write_jsonl,
)
from ignition.preparation.compile_flags import add_compile_options, compile_options

ROOT = Path(__file__).resolve().parents[2]
CONTEXT_EXCEEDED = "context_length_exceeded"
# How servers name their context limit in a rejection: Flare's own envelope, vLLM's.
_LIMIT_PATTERNS = (
    re.compile(r"context limit (\d+)"),
    re.compile(r"maximum context length is (\d+)"),
)


def load_encode(spec: str) -> Encode:
    """The tokenizer of ``spec``: ``words``, a ``tokenizer.json``, a ``.gguf`` file, or a
    Transformers directory or hub name. Special tokens are added, as a server does for
    a completion prompt."""
    if spec == "words":
        return str.split
    path = Path(spec)
    if path.is_file() and path.suffix == ".json":
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        return lambda text: tokenizer.encode(text).ids
    from transformers import AutoTokenizer

    if path.is_file() and path.suffix == ".gguf":
        auto = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    else:
        auto = AutoTokenizer.from_pretrained(spec)
    return lambda text: auto.encode(text)


def torch_dtype(name: str) -> Any:
    """A torch dtype by name (torch is imported only by the in-process engines)."""
    import torch

    return getattr(torch, name)


def _get(endpoint: Endpoint, path: str) -> tuple[int, bytes]:
    connection = endpoint.connection()
    try:
        connection.request("GET", path, headers=endpoint.headers())
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def server_models(endpoint: Endpoint) -> dict[str, Any] | None:
    """``GET /v1/models``, or None."""
    try:
        status, body = _get(endpoint, endpoint.path("models"))
        return json.loads(body) if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None


def advertised_context(models: dict[str, Any] | None) -> int | None:
    """A context limit the models list declares (vLLM's ``max_model_len`` and kin)."""
    for model in (models or {}).get("data") or []:
        for key in ("max_model_len", "context_length", "context_window"):
            if isinstance(model.get(key), int):
                return int(model[key])
    return None


class Launched:
    """A server this run started (its own process group), stopped at the end."""

    def __init__(self, command: str, log: Path) -> None:
        self.log = log.open("w")
        self.process = subprocess.Popen(
            ["bash", "-c", command],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, endpoint: Endpoint, timeout_s: float) -> float:
        """Seconds from start until ``/health`` (else ``/v1/models``) answers 200."""
        started = time.monotonic()
        base = urlsplit(endpoint.url).path.rstrip("/").removesuffix("/v1")
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            for path in (f"{base}/health", endpoint.path("models")):
                try:
                    if _get(endpoint, path)[0] == 200:
                        return time.monotonic() - started
                except (OSError, http.client.HTTPException):
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer within {timeout_s:.0f} s")

    def stop(self) -> int | None:
        """SIGTERM to the group it leads, then SIGKILL after 60 s; its exit status."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        return self.process.returncode


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,clocks.max.memory"
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        )
        env["gpus"] = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return env


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for package in ("torch", "transformers", "flare-ignition", "openai", "httpx", "httpx2"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if commit.returncode == 0:
        found["bench_commit"] = commit.stdout.strip()
    return found


class Suite:
    """Runs measurements on one engine, learning the context limit as it goes, and
    keeps the results document up to date."""

    def __init__(
        self,
        engine: Engine,
        results: dict[str, Any],
        write: Callable[[], None],
        context_limit: int | None,
        dump_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self.results = results
        self.write = write
        self.context_limit = context_limit
        self.dump_dir = dump_dir

    def _fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.context_limit is None or prompt_tokens + max_tokens <= self.context_limit

    def _skip(self, measurement: str, reason: str) -> None:
        print(f"  skipped: {reason}", file=sys.stderr)
        self.results["skipped"].append({"measurement": measurement, "reason": reason})

    def _learn(self, samples: Sequence[Sample]) -> str | None:
        """The first context rejection's message; the limit it names is remembered."""
        for sample in samples:
            if sample.error and sample.error.get("code") == CONTEXT_EXCEEDED:
                message = str(sample.error.get("message", ""))
                for pattern in _LIMIT_PATTERNS:
                    if match := pattern.search(message):
                        self.context_limit = int(match.group(1))
                        self.results["context_limit"] = self.context_limit
                return message or CONTEXT_EXCEEDED
        return None

    def _runnable(self, requests: list[BenchRequest]) -> list[BenchRequest]:
        def tokens(r: BenchRequest) -> int:
            return int(r.meta.get("target_prompt_tokens", r.meta.get("history_tokens", 0)))

        return [r for r in requests if self._fits(tokens(r), r.max_tokens)]

    def run(self, measurement: Measurement) -> None:
        m = measurement
        print(f"{m.name} (concurrency {m.concurrency})", file=sys.stderr)
        if not self._fits(m.prompt_tokens, m.max_tokens):
            self._skip(
                m.name,
                f"{m.prompt_tokens} prompt tokens plus {m.max_tokens} output tokens exceed "
                f"the context limit {self.context_limit}",
            )
            return
        warmup, requests = m.build()
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            write_jsonl(warmup + requests, self.dump_dir / f"{m.name}.jsonl")
        runnable = self._runnable(requests)
        if len(runnable) < len(requests):
            self._skip(
                m.name,
                f"{len(requests) - len(runnable)} of {len(requests)} requests exceed the "
                f"context limit {self.context_limit}",
            )
        started = time.perf_counter()
        if warmup:
            self.engine.run(self._runnable(warmup), m.concurrency)
        counters = getattr(self.engine, "server_counters", lambda: None)
        before = counters()
        samples = self.engine.run(runnable, m.concurrency)
        delta = difference(before, counters())
        if delta is not None:
            self.results.setdefault("server_metrics", {})[m.name] = {
                "requests": len(runnable),
                "delta": delta,
            }
        wall = time.perf_counter() - started
        for sample in samples:
            sample.measurement = m.name
        self.results["samples"] += [s.to_json() for s in samples]
        rejected = self._learn(samples)
        ok = sum(s.ok for s in samples)
        if rejected and ok == 0:
            self._skip(m.name, f"the server rejected every request: {rejected}")
        self.results["measurements"].append(
            {
                "name": m.name,
                "kind": m.kind,
                "concurrency": m.concurrency,
                "requests": len(runnable),
                "succeeded": ok,
                "wall_s": wall,
            }
        )
        errors = {str((s.error or {}).get("code")) for s in samples if s.error}
        print(f"  {ok}/{len(samples)} ok in {wall:.1f} s {sorted(errors) or ''}", file=sys.stderr)
        if m.kind == "clients":
            self._compare_clients(samples)
        self.write()

    def _compare_clients(self, samples: Sequence[Sample]) -> None:
        """The ``clients`` measurement's rows, per prompt both clients answered, and
        their medians: ``results["client_ttft"]``."""
        rows = client_ttft_rows(samples)
        summary = client_ttft_summary(rows)
        self.results["client_ttft"] = {"summary": summary, "rows": rows}

        def ms(key: str) -> str:
            value = summary[key]
            return "–" if value is None else f"{value:.3f}"

        print(
            f"  TTFT median over {summary['pairs']} prompts: suite client {ms('ttft_ms')} ms "
            f"(first event to content {ms('first_event_to_content_ms')}), openai SDK "
            f"{ms('ttft_sdk_ms')} ms ({ms('first_event_to_content_sdk_ms')})",
            file=sys.stderr,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="base URL of an OpenAI-compatible server")
    target.add_argument(
        "--replay",
        nargs="?",
        const="",
        metavar="MODEL",
        help="measure Ignition's replay harness on MODEL (default: the embedded SmolLM2)",
    )
    target.add_argument(
        "--generate",
        type=Path,
        metavar="MODEL_DIR",
        help="measure Transformers' static-cache generate loop on a checkpoint directory",
    )
    parser.add_argument("--engine", required=True, help="name of the engine in the results")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument(
        "--workloads",
        nargs="*",
        choices=WORKLOADS,
        help="which measurements (default: all the engine answers, clients only over "
        "HTTP; none: only startup with --launch)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[512, 4096, 32768, 65536], help="prompt tokens"
    )
    parser.add_argument("--repeats", type=int, default=3, help="requests per long prompt size")
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--decode-rounds", type=int, default=3, help="requests per stream")
    parser.add_argument("--prefix-tokens", type=int, default=4096)
    parser.add_argument("--tail-tokens", type=int, default=11)
    parser.add_argument("--agent-tokens", type=int, default=32768)
    parser.add_argument(
        "--tool-conversations",
        type=int,
        default=8,
        help="tools workload's requests (its TTFT is their median)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", help="words | tokenizer.json | DIR | hub name | .gguf")
    parser.add_argument("--context-limit", type=int, help="the server's context limit")
    parser.add_argument("--api-key", default=os.environ.get("FLARE_API_KEY"))
    parser.add_argument("--model", help="the request's model field (default: none)")
    parser.add_argument("--dialect", choices=DIALECTS, default="openai")
    parser.add_argument(
        "--extra-body", type=json.loads, default={}, help="JSON merged into every request"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument(
        "--client-threads",
        action="store_true",
        help="run concurrent streams of the suite's client as threads of this process "
        "(default: one forked process a stream, so no stream waits on another's parsing)",
    )
    parser.add_argument("--launch", help="start this server command first (bash -c)")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument(
        "--geometry", help=f"{' | '.join(GEOMETRIES)} | config.json, for the roofline"
    )
    parser.add_argument("--bandwidth-gbs", type=float, help="measured read bandwidth, GB/s")
    parser.add_argument(
        "--measure-bandwidth",
        action="store_true",
        help="measure it here (CUDA: the faster of bench/suite/bandwidth.py's probes)",
    )
    parser.add_argument(
        "--replay-eager", action="store_true", help="CPU replay or generate loop (tests)"
    )
    # The replay floor's preparation, as ignition prepare's options.
    add_compile_options(parser, "replay-")
    parser.add_argument("--dump-requests", type=Path, help="also write the requests here")
    parser.add_argument("--note", default="", help="free text kept in the results")
    return parser


def _settings(args: argparse.Namespace) -> SuiteSettings:
    return SuiteSettings(
        seed=args.seed,
        lengths=tuple(args.lengths),
        long_repeats=args.repeats,
        concurrency=tuple(args.concurrency),
        decode_tokens=args.decode_tokens,
        decode_rounds=args.decode_rounds,
        prefix_tokens=args.prefix_tokens,
        tail_tokens=args.tail_tokens,
        agent_tokens=args.agent_tokens,
        tool_conversations=args.tool_conversations,
        warmup=args.warmup,
    )


def resolve_workloads(args: argparse.Namespace) -> str | None:
    """Sets ``args.workloads`` when not given (every workload the target answers);
    the reason the run cannot go on, or None. The ``clients`` workload needs an HTTP
    server and the openai SDK: without either it stops the run before it starts,
    rather than leaving its rows out."""
    over_http = args.url is not None
    if args.workloads is None:
        args.workloads = [w for w in WORKLOADS if over_http or w not in HTTP_WORKLOADS]
    if not over_http and (http_only := sorted(set(args.workloads) & set(HTTP_WORKLOADS))):
        return f"--workloads {' '.join(http_only)}: only an HTTP server (--url) answers it"
    if "clients" in args.workloads:
        from bench.suite.sdk_client import require_openai

        try:
            require_openai()
        except RuntimeError as error:
            return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if (refused := resolve_workloads(args)) is not None:
        print(f"python -m bench.suite: {refused}", file=sys.stderr)
        return 2
    settings = _settings(args)
    results: dict[str, Any] = {
        "schema": "flare-bench-suite/1",
        "engine": args.engine,
        "command": " ".join([sys.executable, "-m", "bench.suite", *(argv or sys.argv[1:])]),
        "note": args.note,
        "started_at": datetime.now(UTC).isoformat(),
        "environment": environment(),
        "versions": versions(),
        "settings": asdict(settings),
        "tokenizer": args.tokenizer,
        "geometry": asdict(resolve_geometry(args.geometry)) if args.geometry else None,
        "bandwidth_bytes_per_s": args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None,
        "context_limit": args.context_limit,
        "startup_s": None,
        "measurements": [],
        "skipped": [],
        "samples": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    if args.measure_bandwidth:
        from bench.suite.bandwidth import read_bandwidth_probes

        results["bandwidth_probes"] = read_bandwidth_probes()
        results["bandwidth_bytes_per_s"] = max(results["bandwidth_probes"].values())
    launched: Launched | None = None
    engine: Engine
    if args.url is not None:
        endpoint = Endpoint(
            args.url, args.model, args.api_key, args.dialect, args.timeout, args.extra_body
        )
        results["target"] = args.url
        results["dialect"] = args.dialect
        if args.launch:
            launched = Launched(args.launch, args.out.with_suffix(".server.log"))
            results["launch"] = args.launch
            results["startup_s"] = launched.wait_ready(endpoint, args.ready_timeout)
            print(f"server ready after {results['startup_s']:.2f} s", file=sys.stderr)
        models = server_models(endpoint)
        results["versions"]["server_models"] = models
        results["context_limit"] = args.context_limit or advertised_context(models)
        engine = HttpEngine(endpoint, processes=not args.client_threads)
        # What concurrent suite-client streams run in (a measurement at concurrency 1
        # or with SDK requests runs in threads either way: ``HttpEngine``).
        results["client_workers"] = "threads" if args.client_threads else "processes"
        encode = load_encode(args.tokenizer) if args.tokenizer else None
    elif args.generate is not None:
        from bench.suite.generate_loop import GenerateLoopEngine

        started = time.perf_counter()
        loop = GenerateLoopEngine(
            args.generate,
            device="cpu" if args.replay_eager else "cuda",
            dtype=torch_dtype("float32" if args.replay_eager else "bfloat16"),
            context_limit=args.context_limit,
        )
        results["startup_s"] = time.perf_counter() - started
        results["target"] = str(args.generate)
        results["compiled_decode"] = loop.compiles
        results["context_limit"] = loop.context_limit
        engine = loop
        encode = load_encode(args.tokenizer) if args.tokenizer else loop.tokenizer.encode
    else:
        from bench.suite.replay_floor import ReplayFloorEngine, prepare_floor
        from ignition.loading.default_model import default_model_path

        model = Path(args.replay) if args.replay else default_model_path()
        started = time.perf_counter()
        prepared = prepare_floor(
            model,
            max_concurrency=max(args.concurrency),
            context_limit=args.context_limit,
            eager=args.replay_eager,
            **compile_options(args, "replay-"),
        )
        results["startup_s"] = time.perf_counter() - started
        results["target"] = str(model)
        results["prepare_timings"] = prepared.timings
        floor = ReplayFloorEngine(prepared)
        results["context_limit"] = floor.context_limit
        engine = floor
        encode = load_encode(args.tokenizer) if args.tokenizer else floor.encode
    write()
    needs_counts = {"long", "prefix", "agent"} & set(args.workloads)
    if encode is None and needs_counts:
        print(
            f"--tokenizer is needed for {', '.join(sorted(needs_counts))} (exact prompt "
            "lengths); e.g. the model's tokenizer.json or Transformers directory",
            file=sys.stderr,
        )
        return 2
    suite = Suite(engine, results, write, results["context_limit"], args.dump_requests)
    try:
        for measurement in minimum_set(encode or str.split, settings, args.workloads):
            suite.run(measurement)
    finally:
        if launched is not None:
            results["server_exit_status"] = launched.stop()
        results["finished_at"] = datetime.now(UTC).isoformat()
        write()
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
