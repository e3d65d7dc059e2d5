"""Helios under load over real sockets (loopback only, bounded, no GPU).

``bench/http_load.py``'s load against the ``fake_server`` example: 2,000 requests at
concurrency 1,000, mixing OpenAI and Anthropic routes, streams and non-streams, 30% of
them cancelled mid-stream by the client closing its socket and 10% malformed or out
of range. Every request must end with exactly one terminal event or a typed error
envelope, none may be a 5xx, the server's OS thread count stays under 64 (no thread
is held per request), ``/health`` answers within 50 ms at the 99th percentile while the
load peaks with no probe past a second, and once the load is gone every gauge returns
to idle with only prefix-cache pages held, all of them reclaimable.
"""

from __future__ import annotations

import sys
import time

import pytest
from fake_server import FakeServer, build_fake_server

from bench import http_load


def _peak(latencies_ms: list[float], status: str = "200") -> list[http_load.Probe]:
    probes = [http_load.Probe(0.0, ms / 1000, status, 0.0001, 0.0) for ms in latencies_ms]
    return sorted(probes, key=lambda probe: probe.latency)


def test_health_at_the_peak_is_bounded_at_its_99th_percentile_and_at_a_second() -> None:
    # CI's failing run: one probe of about 400 at 235 ms, the rest a few ms.
    assert http_load.health_problems(_peak([2.0] * 399 + [235.0])) == []
    # Five slow probes of 400 put the 99th percentile past 50 ms.
    (p99,) = http_load.health_problems(_peak([2.0] * 395 + [60.0] * 5))
    assert "99th percentile at the peak is 60.0 ms" in p99
    # One probe past a second fails however fast the rest are.
    (worst,) = http_load.health_problems(_peak([2.0] * 399 + [1200.0]))
    assert "took 1200.0 ms" in worst
    # Of 100 probes or fewer the 99th percentile is the worst.
    (few,) = http_load.health_problems(_peak([2.0] * 49 + [60.0]))
    assert "99th percentile at the peak is 60.0 ms" in few
    assert http_load.health_problems(_peak([2.0] * 50)) == []
    assert http_load.health_problems([]) == ["no health probe fell in the peak"]
    (bad,) = http_load.health_problems(_peak([2.0] * 20, status="503"))
    assert "answered" in bad


def test_a_probe_line_cut_by_the_probers_end_is_left_out() -> None:
    # A full-suite run's failure: the prober, terminated when the load ended, had
    # written its last line up to the wait field.
    out = "10.5 0.002 200 0.0001 0.0\n11.0 0.003 503 0.0002 0.001\n11.5 0.0009 200 0.0001 "
    probes = http_load.parse_probes(out)
    assert [(p.started, p.status, p.prober_wait) for p in probes] == [
        (10.5, "200", 0.0),
        (11.0, "503", 0.001),
    ]
    assert http_load.parse_probes(out[: out.rfind("\n") + 1]) == probes
    assert http_load.parse_probes("") == []


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for the thread count")
@pytest.mark.serial
def test_two_thousand_requests_at_concurrency_one_thousand() -> None:
    server = FakeServer(build_fake_server(), "--launch-ms", "1")
    try:
        report = http_load.run(server.host, server.port, server.process.pid, "tiny")
        assert report.problems == [], report
        assert report.requests == http_load.REQUESTS
        assert report.peak_threads is not None and report.peak_threads < http_load.MAX_THREADS
        deadline = time.monotonic() + 30
        while True:
            metrics = server.metrics()
            held = metrics["flare_prefix_pages_held"]
            idle = (
                metrics["flare_running_requests"] == 0
                and metrics["flare_queue_depth"] == 0
                and metrics["flare_pages_used"] == held
                and metrics["flare_pages_reserved"] == 0
            )
            if idle:
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.05)
        assert metrics["flare_launches_in_flight"] == 0, metrics
        assert metrics["flare_prefix_pages_reclaimable"] == held, metrics
        assert metrics["flare_requests_failed_total"] == 0, metrics
        print(f"\n{report}")
    finally:
        assert server.stop() == 0, "".join(server.log)
