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

With ``--tool-chats`` the prompts are the suite's tool conversations instead (its
``tools`` workload: tools, a call and its result, about 480 tokens), served as chats
over SmolLM2's fixture frontend (tokenizer, template and the output protocol derived
from it, ``tests/agent_fixtures.py``): rendering with the tools declared, message
marks and the chat stream's events, as the suite's tool-use TTFT pays them. They
share their system message and tools, so the fake server's prefix cache restores that
prefix as Flare's does (its launches still take no time); the null server answers
with one chat chunk.

With ``--baseline PATH`` each round also times a second fake server binary on the
same requests right after the first (an A/B of two builds in one run), and reports
their TTFTs' ratio. ``--server-args`` and ``--baseline-args`` add fake server options
(one shell-quoted string each) to the first and to the baseline; with
``--baseline-args`` and no ``--baseline``, the baseline is the first binary itself (an
A/B of two settings of one build, e.g. ``--idle-spin-ms 50`` against ``0``).

With ``--pause-ms MS`` the client waits MS milliseconds before each timed request, as
a real client waits while the previous answer is generated: the server's threads have
gone idle (parked, their cores maybe asleep) when the request arrives, which
back-to-back requests never show.

With ``--launch-us US`` every launch of the fake server's executor holds its model
thread US microseconds, so the model thread takes about as long as a device would
(hand-offs that overlap it then leave the path, as they would on a GPU).

    python bench/http_overhead.py [--binary PATH] [--baseline PATH]
        [--server-args ARGS] [--baseline-args ARGS]
        [--tokens 512 | --tool-chats] [--requests 200] [--pause-ms 0] [--launch-us 0]
        [--out overhead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shlex
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The fake server's launcher is the tests' (tests/fake_server.py).
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from agent_fixtures import write_frontend  # noqa: E402
from fake_server import FakeServer  # noqa: E402

from bench.suite.client import Endpoint, Sample, median, p99, stream_request  # noqa: E402
from bench.suite.server_metrics import difference, per_request, scrape  # noqa: E402
from bench.suite.workloads import (  # noqa: E402
    BenchRequest,
    Sampling,
    derive_seed,
    tool_requests,
)

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


def tool_chats(count: int, seed: int) -> list[BenchRequest]:
    """``count`` of the suite's tool conversations, one output token each."""
    return tool_requests(seed, count, max_tokens=1)


def _canned(prompt_tokens: int, chat: bool = False) -> bytes:
    choice: dict[str, Any] = (
        {"index": 0, "delta": {"role": "assistant", "content": " w"}, "finish_reason": "length"}
        if chat
        else {"index": 0, "text": " w", "finish_reason": "length"}
    )
    event = {
        "id": "null",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "choices": [choice],
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
def null_server(prompt_tokens: int, chat: bool = False) -> Iterator[str]:
    """A socket answering every request at once with one canned SSE event (a chat
    chunk when ``chat``)."""
    listener = socket.create_server(("127.0.0.1", 0))
    reply = _canned(prompt_tokens, chat)
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


def measure(
    url: str, requests: Sequence[BenchRequest], warmup: int, pause_s: float = 0.0
) -> dict[str, Any]:
    """Streams ``requests`` one at a time, the first ``warmup`` untimed, each timed
    one ``pause_s`` after the last ended; the client's TTFT and, where the server has
    them, its per-request counters."""
    endpoint = Endpoint(url)
    for request in requests[:warmup]:
        stream_request(endpoint, request)
    before = scrape(endpoint)
    samples: list[Sample] = []
    for request in requests[warmup:]:
        if pause_s:
            time.sleep(pause_s)
        samples.append(stream_request(endpoint, request))
    after = scrape(endpoint)
    failed = [s.error for s in samples if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0]}")
    ttft_ms = [s.ttft_s * 1e3 for s in samples if s.ttft_s is not None]
    delta = difference(before, after)
    return {
        "url": url,
        "requests": len(samples),
        "prompt_tokens": [s.prompt_tokens for s in samples],
        "ttft_ms": ttft_ms,
        "ttft_median_ms": median(ttft_ms),
        "ttft_p99_ms": p99(ttft_ms),
        "server": per_request(delta, len(samples)) if delta else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", type=Path, default=DEFAULT_BINARY, help="fake_server")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a second fake_server binary, timed on the same requests right after "
        "--binary in every round (an A/B of two builds in one run)",
    )
    parser.add_argument(
        "--server-args",
        default="",
        help="more fake_server options for --binary, one shell-quoted string "
        "(--server-args=--flag where it is a single option)",
    )
    parser.add_argument(
        "--baseline-args",
        help="fake_server options for the baseline, one shell-quoted string; without "
        "--baseline, the baseline is --binary with these",
    )
    parser.add_argument("--tokens", type=int, default=512, help="prompt tokens")
    parser.add_argument(
        "--tool-chats",
        action="store_true",
        help="the suite's tool conversations as chats over SmolLM2's fixture frontend",
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="fake and null alternate")
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="the client's wait before each timed request (the server idles meanwhile)",
    )
    parser.add_argument(
        "--launch-us",
        type=int,
        default=0,
        help="how long each of the fake server's launches holds its model thread",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.baseline is None and args.baseline_args is not None:
        args.baseline = args.binary
    if args.baseline is not None and not args.baseline.is_file():
        parser.error(f"--baseline {args.baseline} not found")
    if not args.binary.is_file():
        parser.error(
            f"{args.binary} not found: cargo build --release -p flare-helios --example fake_server"
        )
    count = args.requests + args.warmup
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        if args.tool_chats:
            requests = tool_chats(count, seed=0)
            frontend = write_frontend("smollm2", Path(folder) / "smollm2.frontend.pb")
            options = ["--frontend", str(frontend)]
        else:
            requests = word_requests(args.tokens, count, seed=0)
            options = []
        if args.launch_us:
            options += ["--launch-us", str(args.launch_us)]
        for index in range(args.rounds):
            rounds.append(measure_round(args, requests, options, index))
    if args.out:
        result = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "prompts": "tool chats" if args.tool_chats else f"{args.tokens}-token completions",
            "pause_ms": args.pause_ms,
            "launch_us": args.launch_us,
            "server_args": args.server_args,
            "baseline_args": args.baseline_args,
            "rounds": rounds,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


def measure_fake(
    binary: Path,
    requests: Sequence[BenchRequest],
    options: list[str],
    warmup: int,
    pause_s: float = 0.0,
) -> dict[str, Any]:
    """The fake server ``binary`` (with ``options``) over ``requests``."""
    server = FakeServer(binary, *options)
    try:
        return measure(server.url, requests, warmup, pause_s)
    finally:
        server.stop()


def _fake_line(label: str, fake: dict[str, Any]) -> str:
    counters = fake["server"] or {}
    return (
        f"{label} TTFT {fake['ttft_median_ms']:.3f} ms "
        f"(p99 {fake['ttft_p99_ms']:.3f}; server: preparation "
        f"{counters.get('preparation_ms', float('nan')):.3f}, model thread "
        f"{counters.get('server_ttft_ms', float('nan')):.3f} ms, means)"
    )


def measure_round(
    args: argparse.Namespace, requests: Sequence[BenchRequest], options: list[str], index: int
) -> dict[str, Any]:
    """One round: the fake server (with ``options``), the ``--baseline`` binary's if
    given, then the null server."""
    pause_s = args.pause_ms / 1e3
    own = [*options, *shlex.split(args.server_args)]
    fake = measure_fake(args.binary, requests, own, args.warmup, pause_s)
    measured: dict[str, Any] = {"round": index, "fake": fake}
    line = f"round {index}: " + _fake_line("fake", fake)
    if args.baseline is not None:
        theirs = [*options, *shlex.split(args.baseline_args or "")]
        baseline = measure_fake(args.baseline, requests, theirs, args.warmup, pause_s)
        measured["baseline"] = baseline
        ratio = fake["ttft_median_ms"] / baseline["ttft_median_ms"]
        line += f", {_fake_line('baseline', baseline)}, fake / baseline {ratio:.2f}"
    prompt_tokens = next((s for s in fake["prompt_tokens"] if s), args.tokens)
    with null_server(prompt_tokens, chat=args.tool_chats) as url:
        null = measure(url, requests, args.warmup, pause_s)
    measured["null"] = null
    print(f"{line}, null TTFT {null['ttft_median_ms']:.3f} ms (p99 {null['ttft_p99_ms']:.3f})")
    return measured


if __name__ == "__main__":
    raise SystemExit(main())
