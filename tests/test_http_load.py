"""Helios under load over real sockets (loopback only, bounded, no GPU).

2,000 requests at concurrency 1,000 against the ``fake_server`` example, mixing
OpenAI and Anthropic routes, streams and non-streams, 30% of them cancelled
mid-stream by the client closing its socket and 10% malformed or out of range. Every
request must end with exactly one terminal event or a typed error envelope, none may
be a 5xx, the server's OS thread count stays under 64 (no thread is held per
request), ``/health`` answers within 50 ms while the load peaks (measured by a
separate prober process, so the client's own event loop does not time it), and once
the load is gone every gauge returns to idle with only prefix-cache pages held, all
of them reclaimable.

The run is bounded: a fixed request count, a deadline for the whole load, and a
timeout on every socket read.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fake_server import FakeServer, build_fake_server

REQUESTS = 2000
CONCURRENCY = 1000
CANCELLED = 0.30
MALFORMED = 0.10
DEADLINE_S = 240.0
READ_TIMEOUT_S = 120.0
MAX_THREADS = 64
HEALTH_BOUND_S = 0.050
MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello there"}]

# Malformed or out-of-range requests, with the status and code each must get (an
# out-of-range sampling value clamps to the core's range: 200).
BAD_REQUESTS: list[tuple[str, bytes, int, str | None]] = [
    ("/v1/chat/completions", b'{"messages": [', 400, "invalid_json"),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": MESSAGES, "temperature": 0}).encode(),
        400,
        "invalid_parameter",
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
        400,
        "invalid_role",
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": "gpt-4o", "messages": MESSAGES}).encode(),
        404,
        "model_not_found",
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 100000}).encode(),
        400,
        "context_length_exceeded",
    ),
    (
        "/v1/chat/completions",
        json.dumps(
            {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "top_p": 7, "seed": 1}
        ).encode(),
        200,
        None,
    ),
]


@dataclass
class Plan:
    """One request of the load: where it goes, its body, and what is expected."""

    path: str
    body: bytes
    stream: bool
    anthropic: bool = False
    cancel_after: int | None = None  # data events read before closing the socket
    status: int = 200
    code: str | None = None


@dataclass
class Outcome:
    status: int
    terminal_events: int = 0
    error_events: int = 0
    code: str | None = None
    cancelled: bool = False


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    in_flight: int = 0
    peak_windows: list[tuple[float, float]] = field(default_factory=list)
    _peak_since: float | None = None

    def enter(self) -> None:
        self.in_flight += 1
        if self.in_flight >= CONCURRENCY * 9 // 10 and self._peak_since is None:
            self._peak_since = time.monotonic()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight < CONCURRENCY * 9 // 10 and self._peak_since is not None:
            self.peak_windows.append((self._peak_since, time.monotonic()))
            self._peak_since = None


def plans(seed: int = 19) -> list[Plan]:
    rng = random.Random(seed)
    out = []
    for index in range(REQUESTS):
        draw = rng.random()
        if draw < MALFORMED:
            path, body, status, code = BAD_REQUESTS[index % len(BAD_REQUESTS)]
            out.append(Plan(path, body, stream=False, status=status, code=code))
            continue
        anthropic = rng.random() < 0.3
        stream = draw < MALFORMED + CANCELLED or rng.random() < 0.5
        cancel_after = rng.randint(1, 3) if draw < MALFORMED + CANCELLED else None
        max_tokens = 48 if cancel_after else rng.randint(2, 16)
        if anthropic:
            payload = {"model": MODEL, "max_tokens": max_tokens, "messages": MESSAGES}
            path = "/v1/messages"
        else:
            payload = {"model": MODEL, "max_tokens": max_tokens, "messages": MESSAGES}
            path = "/v1/chat/completions"
        payload["stream"] = stream
        payload["seed"] = index
        out.append(
            Plan(
                path,
                json.dumps(payload).encode(),
                stream=stream,
                anthropic=anthropic,
                cancel_after=cancel_after,
            )
        )
    return out


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader):
    """Yields the body chunks of a chunked response."""
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_TIMEOUT_S)
        size = int(size_line.strip().split(b";")[0], 16)
        if size == 0:
            await asyncio.wait_for(reader.readuntil(b"\r\n"), READ_TIMEOUT_S)
            return
        data = await asyncio.wait_for(reader.readexactly(size + 2), READ_TIMEOUT_S)
        yield data[:-2]


def _terminal(plan: Plan, event: str | None, data: str) -> tuple[bool, bool]:
    """(is a success terminal, is an error event) for one SSE event."""
    if plan.anthropic:
        return event == "message_stop", event == "error"
    if data == "[DONE]":
        return True, False
    return False, '"error"' in data and '"choices"' not in data


async def run_one(host: str, port: int, plan: Plan, tally: Tally) -> None:
    tally.enter()
    try:
        tally.outcomes.append(await _request(host, port, plan))
    finally:
        tally.leave()


async def _request(host: str, port: int, plan: Plan) -> Outcome:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"POST {plan.path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(plan.body)}\r\n\r\n".encode()
            + plan.body
        )
        await writer.drain()
        status, headers = await _read_head(reader)
        outcome = Outcome(status=status)
        if headers.get("content-type", "").startswith("text/event-stream"):
            await _read_events(reader, plan, outcome)
            return outcome
        if headers.get("transfer-encoding") == "chunked":
            body = b"".join([chunk async for chunk in _read_chunked(reader)])
        else:
            length = int(headers.get("content-length", "0"))
            body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
        parsed = json.loads(body) if body else {}
        if status >= 400:
            error = parsed.get("error", {})
            outcome.code = error.get("code") or error.get("type")
        else:
            finished = (
                parsed.get("stop_reason")
                if plan.anthropic
                else parsed.get("choices", [{}])[0].get("finish_reason")
            )
            outcome.terminal_events = int(finished is not None)
        return outcome
    finally:
        writer.close()


async def _read_events(reader: asyncio.StreamReader, plan: Plan, outcome: Outcome) -> None:
    buffer, data_events, event_name = b"", 0, None
    async for chunk in _read_chunked(reader):
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            data = ""
            for line in block.decode().splitlines():
                if line.startswith("event:"):
                    event_name = line[6:].strip()
                elif line.startswith("data:"):
                    data = line[5:].strip()
            data_events += 1
            success, error = _terminal(plan, event_name, data)
            outcome.terminal_events += success
            outcome.error_events += error
            if plan.cancel_after is not None and data_events >= plan.cancel_after + 1:
                outcome.cancelled = True
                return


PROBER = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
while time.time() < until:
    started = time.time()
    with socket.create_connection((host, port), timeout=5) as conn:
        connected = time.time() - started
        conn.sendall(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
    print(started, time.time() - started, data.split(b" ", 2)[1].decode(), connected, flush=True)
    time.sleep(0.02)
"""


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


async def _load(server: FakeServer, tally: Tally, threads: list[int]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def gated(plan: Plan) -> None:
        async with gate:
            await run_one(server.host, server.port, plan, tally)

    async def watch_threads(done: asyncio.Event) -> None:
        while not done.is_set():
            threads.append(_threads(server.process.pid))
            await asyncio.sleep(0.05)

    done = asyncio.Event()
    watcher = asyncio.create_task(watch_threads(done))
    try:
        await asyncio.wait_for(asyncio.gather(*(gated(p) for p in plans())), DEADLINE_S)
    finally:
        done.set()
        await watcher


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the thread count")
def test_two_thousand_requests_at_concurrency_one_thousand() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 8192)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    server = FakeServer(build_fake_server(), "--launch-ms", "1")
    prober = None
    try:
        prober = subprocess.Popen(
            [sys.executable, "-c", PROBER, server.host, str(server.port), str(time.time() + 600)],
            stdout=subprocess.PIPE,
            text=True,
        )
        tally, threads = Tally(), []
        # The load generator yields the CPU to the server and the prober: on a
        # machine of two cores it would otherwise time its own scheduling.
        os.nice(10)
        started = time.monotonic()
        asyncio.run(_load(server, tally, threads))
        elapsed = time.monotonic() - started
        prober.terminate()
        probes_out, _ = prober.communicate(timeout=30)
        wall_offset = time.time() - time.monotonic()
        probes = [line.split() for line in probes_out.splitlines() if line.strip()]

        outcomes = tally.outcomes
        assert len(outcomes) == REQUESTS
        statuses = Counter(o.status for o in outcomes)
        assert not [s for s in statuses if s >= 500], statuses
        expected = Counter()
        for plan in plans():
            expected[(plan.status, plan.code)] += 1
        seen = Counter((o.status, o.code) for o in outcomes)
        assert seen == expected, (seen, expected)
        for outcome in outcomes:
            if outcome.status >= 400:
                assert outcome.code, outcome
            elif outcome.cancelled:
                assert outcome.terminal_events == 0 and outcome.error_events == 0, outcome
            else:
                assert (outcome.terminal_events, outcome.error_events) == (1, 0), outcome
        assert sum(o.cancelled for o in outcomes) == sum(
            p.cancel_after is not None for p in plans()
        )

        assert max(threads) < MAX_THREADS, max(threads)
        assert tally.peak_windows, "the load never reached its peak"
        peak = [
            (float(latency), status)
            for start, latency, status, _ in probes
            if any(a <= float(start) - wall_offset <= b for a, b in tally.peak_windows)
        ]
        assert peak, "no health probe fell in the peak"
        assert all(status == "200" for _, status in peak), peak
        worst = max(latency for latency, _ in peak)
        assert worst < HEALTH_BOUND_S, (worst, len(peak))

        deadline = time.monotonic() + 30
        while True:
            metrics = server.metrics()
            idle = metrics["flare_running_requests"] == 0 and metrics["flare_queue_depth"] == 0
            held = metrics["flare_prefix_pages_held"]
            if (
                idle
                and metrics["flare_pages_used"] == held
                and metrics["flare_pages_reserved"] == 0
            ):
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
        assert metrics["flare_launches_in_flight"] == 0, metrics
        assert metrics["flare_prefix_pages_reclaimable"] == held, metrics
        assert metrics["flare_requests_failed_total"] == 0, metrics
        print(
            f"\n{REQUESTS} requests in {elapsed:.1f} s; peak threads {max(threads)}; "
            f"health at the peak: worst {worst * 1000:.1f} ms over {len(peak)} probes"
        )
    finally:
        if prober is not None and prober.poll() is None:
            prober.kill()
        assert server.stop() == 0, "".join(server.log)
