"""bench/first_delta.py over the fake server: the SDK's first content delta follows
the stream's first event at once, at two prompt lengths (the GPU check runs it over
``flare run`` at 100 and 4,000 tokens)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_server import FakeServer, build_fake_server

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.serial
def test_the_first_delta_check_passes_and_reports_both_lengths(tmp_path: Path) -> None:
    server = FakeServer(build_fake_server(), "--launch-ms", "1")
    try:
        out = tmp_path / "first-delta.json"
        command = [sys.executable, str(ROOT / "bench/first_delta.py"), "--url", server.url]
        command += ["--model", "tiny", "--out", str(out), "--lengths", "40", "400"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(out.read_text())
        summary = result["summary"]
        assert set(summary) == {"40", "400"}
        assert summary["400"]["prompt_tokens"] > summary["40"]["prompt_tokens"] > 0
        for length in summary.values():
            assert 0 <= length["gap_ms_median"] < result["gap_bound_ms"]
            assert length["ttft_ms_median"] > 0
        assert len(result["rows"]) == 16
    finally:
        assert server.stop() == 0
