"""``bench/http_overhead.py``: the serving path's share of TTFT, timed on the CPU
against Helios's real server over the test executor and a null socket server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fake_server import ROOT, FakeServer, build_fake_server

from bench import http_overhead


def test_the_overhead_bench_times_both_servers(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    args = ["--binary", str(build_fake_server()), "--tokens", "64", "--requests", "4"]
    assert http_overhead.main([*args, "--warmup", "1", "--rounds", "1", "--out", str(out)]) == 0
    (measured,) = json.loads(out.read_text())["rounds"]
    fake, null = measured["fake"], measured["null"]
    for server in (fake, null):
        assert server["requests"] == 4 and len(server["ttft_ms"]) == 4
        assert all(ttft > 0 for ttft in server["ttft_ms"])
        assert server["ttft_median_ms"] <= server["ttft_p99_ms"]
    # Flare's own counters split the fake server's TTFT; the null server has none.
    assert fake["server"]["preparation_ms"] > 0 and fake["server"]["server_ttft_ms"] > 0
    # Every prompt is new: one prefill each, nothing restored.
    assert fake["server"]["prefill_launches"] == 1 and fake["server"]["restore_launches"] == 0
    assert null["server"] is None


def test_the_overhead_bench_times_tool_chats_over_smollm2s_frontend(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    args = ["--binary", str(build_fake_server()), "--tool-chats", "--requests", "4"]
    assert http_overhead.main([*args, "--warmup", "1", "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["prompts"] == "tool chats"
    (measured,) = result["rounds"]
    fake, null = measured["fake"], measured["null"]
    # SmolLM2's template shows no tools: the server declares them in the system
    # message, about 480 tokens a conversation (the suite's tool-use prompts).
    assert all(400 < tokens < 600 for tokens in fake["prompt_tokens"])
    assert null["prompt_tokens"] == [fake["prompt_tokens"][0]] * 4
    for server in (fake, null):
        assert server["requests"] == 4 and all(ttft > 0 for ttft in server["ttft_ms"])
    assert fake["server"]["preparation_ms"] > 0 and fake["server"]["server_ttft_ms"] > 0


def test_the_null_server_answers_with_one_event_at_once() -> None:
    from bench.suite.client import Endpoint, stream_request

    (request,) = http_overhead.word_requests(32, 1, seed=1)
    with http_overhead.null_server(32) as url:
        sample = stream_request(Endpoint(url), request)
    assert sample.ok and sample.text == " w" and sample.output_tokens == 1
    assert sample.prompt_tokens == 32 and sample.finish_reason == "length"


def test_the_null_server_answers_a_chat_with_one_chunk() -> None:
    from bench.suite.client import Endpoint, stream_request

    (request,) = http_overhead.tool_chats(1, seed=1)
    with http_overhead.null_server(480, chat=True) as url:
        sample = stream_request(Endpoint(url), request)
    assert sample.ok and sample.text == " w" and sample.prompt_tokens == 480


def test_a_baseline_binary_is_timed_in_every_round(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    binary = str(build_fake_server())
    args = ["--binary", binary, "--baseline", binary, "--tokens", "64", "--requests", "3"]
    assert http_overhead.main([*args, "--warmup", "1", "--rounds", "2", "--out", str(out)]) == 0
    rounds = json.loads(out.read_text())["rounds"]
    assert len(rounds) == 2
    for measured in rounds:
        for server in (measured["fake"], measured["baseline"]):
            assert server["requests"] == 3 and all(t > 0 for t in server["ttft_ms"])
            assert server["server"]["prefill_launches"] == 1


def test_the_fake_server_loads_the_core_named_by_core(tmp_path: Path) -> None:
    # A binary run away from the tree it was built in (the GPU machine's copy) finds
    # the tiny core where --core says, and only there.
    binary = build_fake_server()
    core = tmp_path / "core"
    shutil.copytree(ROOT / "helios" / "tests" / "fixtures" / "tiny-core", core)
    server = FakeServer(binary, "--core", str(core))
    try:
        assert server.metrics()["flare_requests_failed_total"] == 0
    finally:
        assert server.stop() == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AssertionError, match="did not start"):
        FakeServer(binary, "--core", str(empty))


def test_one_binary_is_timed_against_itself_under_other_options(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    binary = str(build_fake_server())
    args = ["--binary", binary, "--tokens", "64", "--requests", "3", "--warmup", "1"]
    settings = ["--server-args", "--idle-spin-ms 50", "--baseline-args", "--idle-spin-ms 0"]
    assert http_overhead.main([*args, *settings, "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["server_args"], result["baseline_args"]) == (
        "--idle-spin-ms 50",
        "--idle-spin-ms 0",
    )
    (measured,) = result["rounds"]
    for server in (measured["fake"], measured["baseline"]):
        assert server["requests"] == 3 and all(t > 0 for t in server["ttft_ms"])
    # The options reach the server: one it does not know stops it from starting.
    with pytest.raises(AssertionError, match="did not start"):
        http_overhead.main([*args, "--baseline-args=--no-such-option", "--rounds", "1"])
