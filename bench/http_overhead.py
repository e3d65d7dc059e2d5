"""The serving path's own share of the time to first token, measured on the CPU.

The suite's cold TTFT of Flare includes what the Python replay floor has not: the
client and the loopback, HTTP parsing, prompt preparation (rendering and
tokenization), the hand-offs between the HTTP threads and the model thread, and SSE
writing. Flare's ``/metrics`` give two of these per request (prompt preparation, and
the model thread's own TTFT from submission to the first token handed back). This
bench times the rest with no GPU:

- ``fake``: Helios's real server (the ``fake_server`` example: router, frontend,
  scheduler worker, socket) over the test executor, whose launches take no time, so
  the client's TTFT is the serving path alone; its ``/metrics`` split off prompt
  preparation and the model thread;
- ``null``: a raw socket that answers each request with one canned SSE event as soon
  as it has read the request, so the client's TTFT is the client and the loopback
  alone.

Both are timed by the suite's own streaming client (``stream_request``), one request
at a time, on the same prompts: distinct (so every request is cold, a prefill) and
made of the fixture tokenizer's words (``w0`` to ``w99``, one token each).

    python bench/http_overhead.py [--binary PATH] [--tokens 512] [--requests 200]
        [--out overhead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The fake server's launcher is the tests' (tests/fake_server.py).
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_server import FakeServer  # noqa: E402

from bench.suite.client import Endpoint, Sample, median, p99, stream_request  # noqa: E402
from bench.suite.server_metrics import difference, per_request, scrape  # noqa: E402
from bench.suite.workloads import BenchRequest, Sampling, derive_seed  # noqa: E402

DEFAULT_BINARY = ROOT / "target" / "release" / "examples" / "fake_server"


def word_requests(tokens: int, count: int, seed: int) -> list[BenchRequest]:
    """``count`` distinct completion prompts of ``tokens`` of the fixture tokenizer's
    words (one token each), one output token each."""
    requests = []
    for index in range(count):
        rng = random.Random(derive_seed(seed, index))
        prompt = " ".join(f"w{rng.randrange(100)}" for _ in range(tokens))
        name = f"words-{tokens}/{index}"
        requests.append(
            BenchRequest(
                name=name,
                workload="overhead",
                max_tokens=1,
                sampling=Sampling(seed=derive_seed(seed, name)),
                prompt=prompt,
            )
        )
    return requests


def _canned(prompt_tokens: int) -> bytes:
    event = {
        "id": "null",
        "object": "text_completion",
        "choices": [{"index": 0, "text": " w", "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": 0},
    }
    body = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return head + body


def _read_request(conn: socket.socket) -> None:
    """Reads one HTTP request with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def null_server(prompt_tokens: int) -> Iterator[str]:
    """A socket answering every request at once with one canned SSE event."""
    listener = socket.create_server(("127.0.0.1", 0))
    reply = _canned(prompt_tokens)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _read_request(conn)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def measure(url: str, requests: Sequence[BenchRequest], warmup: int) -> dict[str, Any]:
    """Streams ``requests`` one at a time, the first ``warmup`` untimed; the client's
    TTFT and, where the server has them, its per-request counters."""
    endpoint = Endpoint(url)
    for request in requests[:warmup]:
        stream_request(endpoint, request)
    before = scrape(endpoint)
    samples: list[Sample] = [stream_request(endpoint, r) for r in requests[warmup:]]
    after = scrape(endpoint)
    failed = [s.error for s in samples if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0]}")
    ttft_ms = [s.ttft_s * 1e3 for s in samples if s.ttft_s is not None]
    delta = difference(before, after)
    return {
        "url": url,
        "requests": len(samples),
        "ttft_ms": ttft_ms,
        "ttft_median_ms": median(ttft_ms),
        "ttft_p99_ms": p99(ttft_ms),
        "server": per_request(delta, len(samples)) if delta else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=DEFAULT_BINARY, help="fake_server")
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="fake and null alternate")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.binary.is_file():
        parser.error(
            f"{args.binary} not found: cargo build --release -p flare-helios --example fake_server"
        )
    requests = word_requests(args.tokens, args.requests + args.warmup, seed=0)
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        server = FakeServer(args.binary)
        try:
            fake = measure(server.url, requests, args.warmup)
        finally:
            server.stop()
        with null_server(args.tokens) as url:
            null = measure(url, requests, args.warmup)
        rounds.append({"round": index, "fake": fake, "null": null})
        counters = fake["server"] or {}
        print(
            f"round {index}: fake TTFT {fake['ttft_median_ms']:.3f} ms "
            f"(p99 {fake['ttft_p99_ms']:.3f}; server: preparation "
            f"{counters.get('preparation_ms', float('nan')):.3f}, model thread "
            f"{counters.get('server_ttft_ms', float('nan')):.3f} ms, means), "
            f"null TTFT {null['ttft_median_ms']:.3f} ms (p99 {null['ttft_p99_ms']:.3f})"
        )
    if args.out:
        result = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "prompt_tokens": args.tokens,
            "rounds": rounds,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
