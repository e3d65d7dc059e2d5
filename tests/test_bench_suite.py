"""The benchmark suite on the CPU: deterministic workloads at exact token counts, the
statistics on hand-computed samples, the streaming client's SSE parsing and timing
against Helios's real server over the test executor (the ``fake_server`` example, as
in ``test_http_clients.py``), the whole CLI against it, the replay floor on a tiny
checkpoint, and the report's ratio table and roofline."""

from __future__ import annotations

import http.server
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoints import write_tiny
from fake_server import FakeServer, build_fake_server

from bench.suite.__main__ import main as suite_main
from bench.suite.client import (
    Endpoint,
    HttpEngine,
    Sample,
    Summary,
    client_ttft_rows,
    client_ttft_summary,
    decode_tokens_per_s,
    median,
    p99,
    prefill_tokens_per_s,
    request_body,
    run_requests,
    stream_request,
    throughput_tokens_per_s,
)
from bench.suite.report import (
    GEOMETRIES,
    Geometry,
    agent_ttft_ms,
    agent_turns,
    agent_turns_of,
    decode_bench_metrics,
    engine_metrics,
    prefilled_tokens,
    repeat_checks,
    roofline_step_s,
    summary_table,
)
from bench.suite.server_metrics import bound_label, difference, metrics_path, per_request
from bench.suite.server_metrics import parse as parse_metrics
from bench.suite.workloads import (
    SDK_CLIENT,
    SUITE_CLIENT,
    BenchRequest,
    Sampling,
    SuiteSettings,
    agent_trace,
    chat_requests,
    client_requests,
    fit_to_tokens,
    long_prompt,
    long_requests,
    minimum_set,
    prefix_requests,
    tool_requests,
)
from ignition.preparation.compile_flags import compile_options
from ignition.preparation.prepared import PrepareOptions


def words(text: str) -> list[str]:
    return text.split()


def trigrams(text: str) -> list[str]:
    """A toy tokenizer that ignores word boundaries: one token per 3 characters."""
    return [text[i : i + 3] for i in range(0, len(text), 3)]


# ---------------------------------------------------------------- workloads


@pytest.mark.parametrize("encode", [words, trigrams])
@pytest.mark.parametrize("tokens", [512, 4096, 32768, 65536])
def test_long_prompts_hit_their_token_count_exactly(
    encode: Callable[[str], list[str]], tokens: int
) -> None:
    prompt = long_prompt(encode, tokens, key=7)
    assert len(encode(prompt)) == tokens
    assert long_prompt(encode, tokens, key=7) == prompt
    assert long_prompt(encode, tokens, key=8) != prompt


def test_fitting_keeps_head_and_tail_and_refuses_what_cannot_fit() -> None:
    text = fit_to_tokens(trigrams, 100, lambda n: ["word"] * n, head="HEAD ", tail=" TAIL")
    assert text.startswith("HEAD ") and text.endswith(" TAIL")
    assert len(trigrams(text)) == 100
    with pytest.raises(ValueError, match="exceed"):
        fit_to_tokens(words, 2, lambda n: ["w"] * n, head="one two three")


def _json(requests: list[BenchRequest]) -> str:
    return json.dumps([r.to_json() for r in requests])


def test_generators_are_deterministic_given_a_seed() -> None:
    def everything(seed: int) -> str:
        settings = SuiteSettings(seed=seed, prefix_tokens=256, prefix_repeats=2)
        return _json(
            long_requests(words, 512, 3, seed, 1)
            + chat_requests(seed, 5, 16)
            + chat_requests(seed, 5, 16, long_answers=True)
            + tool_requests(seed, 6, 32)
            + agent_trace(words, seed=seed, target_tokens=3000)
            + prefix_requests(words, settings)
        )

    assert everything(1) == everything(1)
    assert everything(1) != everything(2)


def test_requests_carry_the_design_sampling_and_distinct_seeds() -> None:
    requests = long_requests(words, 64, 4, seed=0, max_tokens=1) + chat_requests(0, 4, 8)
    assert {(r.sampling.temperature, r.sampling.top_k, r.sampling.top_p) for r in requests} == {
        (1.0, 20, 0.95)
    }
    assert len({r.sampling.seed for r in requests}) == len(requests)
    # Each long prompt is different, so each one is cold.
    assert len({r.prompt for r in requests if r.prompt}) == 4


def test_a_request_round_trips_through_json_and_has_one_input() -> None:
    request = tool_requests(3, 1, 32)[0]
    assert BenchRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    assert request.endpoint == "chat"
    with pytest.raises(ValueError, match="exactly one"):
        BenchRequest("x", "chat", 4, Sampling(), messages=[], prompt="both")


def test_tool_conversations_are_in_openais_shape() -> None:
    for request in tool_requests(0, 6, 32):
        assert request.tools and request.tools[0]["type"] == "function"
        assert request.messages is not None
        call, result = request.messages[-2], request.messages[-1]
        assert call["role"] == "assistant"
        (tool_call,) = call["tool_calls"]
        json.loads(tool_call["function"]["arguments"])
        assert result == {
            "role": "tool",
            "tool_call_id": tool_call["id"],
            "content": result["content"],
        }


def test_agent_trace_grows_to_its_target_and_forks_an_earlier_turn() -> None:
    trace = agent_trace(words, seed=4, target_tokens=8000, result_tokens=(200, 400))
    main = [r for r in trace if r.meta["branch"] == "main"]
    fork = [r for r in trace if r.meta["branch"] == "fork"]
    assert [r.meta["turn"] for r in main] == list(range(len(main)))
    assert len(fork) == 2
    history = [r.meta["history_tokens"] for r in main]
    steps = [b - a for a, b in pairwise(history)]
    # Each turn appends one tool call (a few tokens) and a 200-400 token result.
    assert all(200 < step < 440 for step in steps)
    assert history[-1] <= 8000 < history[-1] + 440
    for request in main:
        counted = sum(
            len(words(str(m.get("content") or "")))
            + sum(
                len(words(c["function"]["name"] + c["function"]["arguments"]))
                for c in m.get("tool_calls", [])
            )
            for m in request.messages or []
        )
        assert counted == request.meta["history_tokens"]
    at = fork[0].meta["fork_of"]
    base = main[at].messages or []
    for request in fork:
        messages = request.messages or []
        assert messages[: len(base)] == base
        assert messages[len(base)] != main[at + 1].messages[len(base)]  # type: ignore[index]
        assert request.meta["history_tokens"] > main[at].meta["history_tokens"]
    # Last, the fork's first turn and the main line's turn after the fork point again,
    # the very requests: an exact prefix cache answers each as the first time.
    repeats = [r for r in trace if r.meta["branch"] == "repeat"]
    assert trace[-2:] == repeats
    by_name = {r.name: r for r in trace}
    assert [r.meta["repeat_of"] for r in repeats] == ["agent/fork-0", f"agent/turn-{at + 1}"]
    for repeat in repeats:
        first = by_name[repeat.meta["repeat_of"]]
        assert repeat.name != first.name
        assert (repeat.messages, repeat.sampling, repeat.tools, repeat.max_tokens) == (
            first.messages,
            first.sampling,
            first.tools,
            first.max_tokens,
        )


def test_prefix_pairs_share_the_prefix_and_add_the_tail() -> None:
    settings = SuiteSettings(prefix_tokens=4096, tail_tokens=11, prefix_repeats=2)
    for encode in (words, trigrams):
        requests = prefix_requests(encode, settings)
        assert [r.meta["role"] for r in requests] == ["prefix", "hit"] * 2
        for prefix, hit in zip(requests[::2], requests[1::2], strict=True):
            assert len(encode(str(prefix.prompt))) == 4096
            assert len(encode(str(hit.prompt))) == 4107
            assert str(hit.prompt).startswith(str(prefix.prompt))
            # Whether the prefix's tokens begin the hit's is recorded, not assumed: a
            # tokenizer may merge across the boundary (trigrams can).
            shared = encode(str(hit.prompt))[:4096] == encode(str(prefix.prompt))
            assert hit.meta["prefix_tokens_shared"] == shared
            assert shared or encode is trigrams


def test_the_minimum_set_runs_in_order_and_builds_lazily() -> None:
    built: list[str] = []

    def encode(text: str) -> list[str]:
        built.append(text[:10])
        return words(text)

    settings = SuiteSettings(lengths=(4096, 512), agent_tokens=2000)
    plan = list(minimum_set(encode, settings))
    assert not built
    assert [m.name for m in plan] == [
        "long-512",
        "long-4096",
        "decode-c1",
        "decode-c2",
        "decode-c4",
        "prefix-4096+11",
        "agent-2000",
        "tools",
        "clients",
    ]
    warmup, requests = plan[3].build()
    assert len(warmup) == 2 and len(requests) == 2 * settings.decode_rounds
    assert {r.max_tokens for r in requests} == {256}
    with pytest.raises(ValueError, match="unknown"):
        list(minimum_set(encode, settings, ["bogus"]))


def test_both_clients_send_each_chat_with_one_seed_after_a_warmup() -> None:
    warmup, requests = client_requests(seed=3, count=4, max_tokens=16)
    assert [r.meta["client"] for r in warmup] == [SUITE_CLIENT, SDK_CLIENT] * 2
    assert [r.meta["client"] for r in requests] == [
        SUITE_CLIENT, SDK_CLIENT, SDK_CLIENT, SUITE_CLIENT,
    ] * 2  # fmt: skip
    for index, first in enumerate(warmup):
        pair = requests[2 * index : 2 * index + 2]
        assert {r.meta["prompt"] for r in pair} == {first.meta["prompt"]}
        assert {r.sampling.seed for r in pair} == {first.sampling.seed}
        assert all(r.messages == first.messages for r in pair)
    assert len({r.sampling.seed for r in warmup}) == 4
    assert len({str(r.messages) for r in warmup}) == 4  # distinct prompts: each cold once
    assert len({r.name for r in warmup + requests}) == 12


# ---------------------------------------------------------------- statistics


def _sample(**fields: Any) -> Sample:
    return Sample(request="r", workload="w", status=200, **fields)


def test_median_and_p99_match_the_native_definition() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    # floor(0.99 * 200) = 198, floor(0.99 * 50) = 49 (as helios/src/replay/bench.rs).
    assert p99([float(v) for v in range(200)]) == 198.0
    assert p99([float(v) for v in reversed(range(50))]) == 49.0
    assert p99([5.0]) == 5.0
    assert Summary.of([1.0, 2.0, 3.0, 10.0]) == Summary(4, 2.5, 10.0, 4.0, 1.0, 10.0)
    assert Summary.of([]) is None
    with pytest.raises(ValueError):
        median([])


def test_rates_on_hand_computed_samples() -> None:
    one = _sample(ttft_s=0.1, e2e_s=1.1, output_tokens=11, prompt_tokens=4096, start_s=0.0)
    assert decode_tokens_per_s(one) == pytest.approx(10.0)
    assert prefill_tokens_per_s(one) == pytest.approx(40960.0)
    two = _sample(ttft_s=0.2, e2e_s=1.0, output_tokens=20, prompt_tokens=8, start_s=0.5)
    # 31 tokens from t=0 to t=1.5.
    assert throughput_tokens_per_s([one, two]) == pytest.approx(31 / 1.5)
    assert decode_tokens_per_s(_sample(ttft_s=0.1, e2e_s=0.1, output_tokens=1)) is None
    failed = _sample(error={"code": "x"}, output_tokens=5, e2e_s=1.0)
    assert throughput_tokens_per_s([failed]) is None


def test_request_bodies_spell_sampling_in_each_dialect() -> None:
    request = chat_requests(0, 1, 32)[0]
    openai = request_body(Endpoint("http://h:1", api_key="k"), request)
    assert openai["top_k"] == 20 and openai["top_p"] == 0.95 and openai["temperature"] == 1.0
    assert openai["seed"] == request.sampling.seed and openai["max_tokens"] == 32
    assert openai["stream"] and openai["stream_options"] == {"include_usage": True}
    assert "model" not in openai
    hf = request_body(Endpoint("http://h:1", model="m", dialect="transformers"), request)
    assert "top_k" not in hf and "stream_options" not in hf and hf["model"] == "m"
    assert json.loads(hf["generation_config"]) == {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
        "max_new_tokens": 32,
    }
    assert Endpoint("http://h:1", api_key="k").headers()["Authorization"] == "Bearer k"
    assert Endpoint("http://h:1/v1/").path("chat") == "/v1/chat/completions"
    assert Endpoint("http://h:1").path("completions") == "/v1/completions"
    with pytest.raises(ValueError, match="dialect"):
        Endpoint("http://h:1", dialect="nope")


def test_an_answer_that_stops_on_its_first_token_has_a_ttft() -> None:
    """A stop token sampled first streams no text: the finishing event times it."""
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
    ]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    body += b"data: [DONE]\n\n"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            (request,) = chat_requests(3, 1, 4)
            sample = stream_request(Endpoint(f"http://127.0.0.1:{httpd.server_port}"), request)
        finally:
            httpd.shutdown()
    assert sample.ok and sample.stopped_first and sample.text == ""
    assert sample.ttft_s is not None and 0 < sample.ttft_s <= sample.e2e_s
    assert sample.gaps_s == [] and sample.output_tokens == 1
    assert sample.finish_reason == "stop"


# ---------------------------------------------------------------- against a real server


@pytest.fixture(scope="module")
def fake_server_binary() -> Path:
    return build_fake_server()


@pytest.fixture(scope="module")
def server(fake_server_binary: Path) -> Iterator[FakeServer]:
    running = FakeServer(fake_server_binary, "--launch-ms", "2")
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def instant_server(fake_server_binary: Path) -> Iterator[FakeServer]:
    """The fake server with launches that take no time: what is left of a TTFT is
    the serving path, the loopback and the client."""
    running = FakeServer(fake_server_binary)
    yield running
    assert running.stop() == 0


@pytest.mark.serial
def test_the_openai_sdk_and_the_suite_client_time_the_same_chats(
    instant_server: FakeServer,
) -> None:
    warmup, requests = client_requests(seed=0, count=8, max_tokens=16)
    engine = HttpEngine(Endpoint(instant_server.url))
    samples = run_requests(engine, requests, 1, warmup=warmup)
    assert [s.meta["client"] for s in samples] == [r.meta["client"] for r in requests]
    for sample in samples:
        assert sample.ok and sample.status == 200, sample.error
        assert sample.ttft_s is not None and sample.first_event_s is not None
        assert 0 < sample.first_event_s <= sample.ttft_s <= sample.e2e_s
        assert sample.output_tokens == 16 and sample.output_tokens_source == "usage"
        assert sample.finish_reason == "length" and sample.prompt_tokens
    for suite, sdk in zip(samples[::2], samples[1::2], strict=True):
        # One request, two clients: the same seeded answer and usage.
        assert suite.meta["prompt"] == sdk.meta["prompt"]
        assert suite.text == sdk.text and suite.text
        assert suite.prompt_tokens == sdk.prompt_tokens
        assert len(suite.gaps_s) == len(sdk.gaps_s)
    rows = client_ttft_rows(samples)
    assert [row["prompt"] for row in rows] == [f"clients/{i}" for i in range(8)]
    for row in rows:
        assert row["ttft_ms"] > 0 and row["ttft_sdk_ms"] > 0
        assert row["first_event_to_content_ms"] >= 0
        assert row["first_event_to_content_sdk_ms"] >= 0
        assert row["sdk_less_suite_ms"] == pytest.approx(row["ttft_sdk_ms"] - row["ttft_ms"])
    summary = client_ttft_summary(rows)
    assert summary["pairs"] == 8
    # The first content delta follows the first event (the role delta) at once
    # through either client: Nagle's algorithm held it about 40 ms for httpx.
    assert summary["first_event_to_content_sdk_ms"] < 5, rows
    assert summary["first_event_to_content_ms"] < 5, rows
    assert 0 < summary["ttft_sdk_ms"] < 50, rows


def test_a_missing_openai_sdk_fails_the_clients_measurement_loudly(
    instant_server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # import openai raises ImportError
    (request,) = client_requests(seed=0, count=1, max_tokens=4)[1][1:]
    assert request.meta["client"] == SDK_CLIENT
    with pytest.raises(RuntimeError, match="openai SDK"):
        HttpEngine(Endpoint(instant_server.url)).run([request], 1)
    out = tmp_path / "r.json"
    args = ["--url", instant_server.url, "--engine", "flare", "--out", str(out)]
    assert suite_main([*args, "--workloads", "clients"]) == 2
    assert not out.exists()
    # Without the clients workload the SDK is not needed.
    assert suite_main([*args, "--workloads", "tools"]) == 0


def test_in_process_engines_refuse_the_clients_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "floor.json"
    args = ["--replay", "--engine", "floor", "--out", str(out), "--workloads", "clients"]
    assert suite_main(args) == 2
    assert "only an HTTP server" in capsys.readouterr().err
    assert not out.exists()


def test_streamed_chat_is_timed_chunk_by_chunk(server: FakeServer) -> None:
    engine = HttpEngine(Endpoint(server.url))
    samples = engine.run(chat_requests(0, 8, 24, long_answers=True), 1)
    exact = 0
    for sample in samples:
        assert sample.ok and sample.status == 200
        assert sample.ttft_s is not None and 0 < sample.ttft_s <= sample.e2e_s
        assert sample.finish_reason == "length"
        assert sample.output_tokens == 24 and sample.output_tokens_source == "usage"
        assert sample.prompt_tokens and sample.prompt_tokens > 0
        # The fake model's tokens are words ("w17"): one chunk per word, so one gap
        # between successive words; a special token has no text and sends no chunk.
        chunks = len(sample.text.split())
        assert len(sample.gaps_s) == chunks - 1
        assert all(gap >= 0 for gap in sample.gaps_s)
        assert sample.ttft_s + sum(sample.gaps_s) <= sample.e2e_s
        if chunks == sample.output_tokens:
            exact += 1
            assert len(sample.gaps_s) == sample.output_tokens - 1
            # Each step sleeps 2 ms in the fake executor.
            assert median(sample.gaps_s) >= 0.0015
    assert exact > 0


def test_a_repeated_chat_reports_its_prompt_cached(server: FakeServer) -> None:
    engine = HttpEngine(Endpoint(server.url))
    (request,) = chat_requests(7, 1, 4)
    first, second = engine.run([request, request], 1)
    assert first.ok and second.ok
    assert first.cached_tokens == 0
    # The fake server runs the prefix cache: the repeat restores the whole prompt.
    assert second.cached_tokens == second.prompt_tokens == first.prompt_tokens
    assert prefilled_tokens(second) == 0 and prefilled_tokens(first) == first.prompt_tokens


def test_completions_report_the_fitted_prompt_length(server: FakeServer) -> None:
    (request,) = long_requests(words, 300, 1, seed=0, max_tokens=5)
    sample = stream_request(Endpoint(server.url), request)
    assert sample.ok and sample.prompt_tokens == 300 and sample.output_tokens == 5


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_concurrent_requests_overlap_and_keep_their_order(
    server: FakeServer, processes: bool
) -> None:
    requests = chat_requests(1, 8, 32, long_answers=True)
    warm = chat_requests(2, 2, 4)
    engine = HttpEngine(Endpoint(server.url), processes=processes)
    samples = run_requests(engine, requests, 4, warmup=warm, repeats=2)
    assert [s.request for s in samples] == [r.name for r in requests] * 2
    assert [s.repeat for s in samples] == [0] * 8 + [1] * 8
    assert all(s.ok and s.concurrency == 4 for s in samples)
    first = samples[:4]
    assert max(s.start_s for s in first) < min(s.start_s + s.e2e_s for s in first)
    # Every stream timed whole, on the engine's epoch, in either kind of worker.
    for sample in samples:
        assert sample.output_tokens == 32 and sample.ttft_s is not None
        assert 0 < sample.start_s < time.perf_counter() - engine.epoch


def test_a_rejected_request_is_a_sample_with_the_servers_error(server: FakeServer) -> None:
    (request,) = long_requests(words, 1100, 1, seed=0, max_tokens=1)
    sample = stream_request(Endpoint(server.url), request)
    assert not sample.ok and sample.status == 400 and sample.ttft_s is None
    assert sample.error is not None and sample.error["code"] == "context_length_exceeded"
    assert "context limit 1024" in sample.error["message"]


def test_api_key_and_stops(fake_server_binary: Path) -> None:
    keyed = FakeServer(fake_server_binary, "--api-key", "sk-bench", "--stop-every", "3")
    try:
        requests = chat_requests(0, 4, 64)
        refused = stream_request(Endpoint(keyed.url), requests[0])
        assert refused.status == 401 and refused.error is not None
        samples = HttpEngine(Endpoint(keyed.url, api_key="sk-bench")).run(requests, 2)
        assert all(s.ok for s in samples)
        stopped = [s for s in samples if s.finish_reason == "stop"]
        assert stopped and all((s.output_tokens or 0) < 64 for s in stopped)
    finally:
        assert keyed.stop() == 0


def test_the_suite_cli_measures_a_server_and_the_report_compares_engines(
    server: FakeServer, tmp_path: Path
) -> None:
    out = tmp_path / "flare.json"
    args = (
        f"--url {server.url} --engine flare --out {out} --tokenizer words "
        "--lengths 64 512 2048 --repeats 2 --decode-tokens 16 --decode-rounds 1 "
        "--concurrency 1 2 --prefix-tokens 256 --agent-tokens 1500 --warmup 1 "
        "--tool-conversations 5 --geometry smollm2-135m --bandwidth-gbs 4000"
    )
    assert suite_main(args.split()) == 0
    results = json.loads(out.read_text())
    assert results["context_limit"] == 1024
    assert Geometry(**results["geometry"]) == GEOMETRIES["smollm2-135m"]
    assert results["bandwidth_bytes_per_s"] == 4e12
    by = {}
    for data in results["samples"]:
        by.setdefault(data["measurement"], []).append(Sample.from_json(data))
    assert [s.prompt_tokens for s in by["long-512"]] == [512, 512]
    # /v1/models advertises the limit (max_model_len): the 2048-token prompts are
    # skipped before any is sent.
    assert results["versions"]["server_models"]["data"][0]["max_model_len"] == 1024
    assert "long-2048" not in by
    skipped = {s["measurement"]: s["reason"] for s in results["skipped"]}
    assert "exceed the context limit 1024" in skipped["long-2048"]
    assert "agent-1500" in skipped  # its last turns pass the fake server's 1024 tokens
    hits = [s for s in by["prefix-256+11"] if s.meta["role"] == "hit"]
    assert [s.prompt_tokens for s in hits] == [267, 267, 267]
    turns = [s for s in by["agent-1500"] if s.meta["branch"] == "main"]
    assert [s.prompt_tokens or 0 for s in turns] == sorted(s.prompt_tokens or 0 for s in turns)
    # The fake server runs the prefix cache: each turn restores the whole previous
    # prompt (its generation header included) and prefills only what was appended.
    answered = [s for s in turns if s.ok]
    assert len(answered) >= 3 and answered[0].cached_tokens == 0
    for earlier, later in pairwise(answered):
        assert later.cached_tokens == earlier.prompt_tokens
        assert prefilled_tokens(later) == (later.prompt_tokens or 0) - (earlier.prompt_tokens or 0)
    assert len(by["decode-c2"]) == 2 and len(by["tools"]) == 5
    # The clients measurement: 12 chats through each client, paired per prompt.
    assert sorted(s.meta["client"] for s in by["clients"]) == ["openai-sdk"] * 12 + ["suite"] * 12
    compared = results["client_ttft"]
    assert compared["summary"]["pairs"] == len(compared["rows"]) == 12
    for pair in compared["rows"]:
        assert pair["ttft_ms"] > 0 and pair["ttft_sdk_ms"] > 0
        assert pair["first_event_to_content_sdk_ms"] is not None
    assert "openai" in results["versions"]
    metrics = {row.key: value for row, value in engine_metrics(results).items()}
    assert metrics["agent-last-tokens"] == turns[-1].prompt_tokens
    turns_table = agent_turns([results])
    second = answered[1]
    row = (
        f"| {second.meta['turn']} | main | {second.prompt_tokens} | {second.cached_tokens} | "
        f"{prefilled_tokens(second)} | {second.prompt_tokens - answered[0].prompt_tokens} |"
    )
    assert row in turns_table, turns_table
    table = summary_table([results], "flare", GEOMETRIES["smollm2-135m"], 4e12)
    # The fake server's word-level tokenizer knows none of the suite's words (each is
    # <unk>), so its cold prompts of one length are one token sequence and its prefix
    # cache serves the repeats: the cold rows keep only the first 64-token request.
    assert "| long-64 | cold TTFT, 64 tokens (ms) |" in table
    assert "| long-512 | cold TTFT, 512 tokens (ms) |" not in table
    assert "flare: long-512: 2 of 2 requests meant to be cold were served" in table
    assert "long-2048 skipped" in table
    # The server's own counters around each measurement: the two measured 512-token
    # prompts were prepared once each and each prefilled in one chunk (completions
    # have no message endpoints) or, the second, restored the first's whole prompt
    # when its prompt-end checkpoint was still cached (which checkpoints the two
    # snapshot rows keep depends on when each capture's copy completes: the full
    # suite under load once saw one prefill);
    # each agent turn restored the previous prompt.
    server = results["server_metrics"]
    long_512 = server["long-512"]
    assert long_512["requests"] == 2
    assert long_512["delta"]["flare_prompt_preparation_seconds_count"] == 2
    prefills = long_512["delta"]["flare_launches_prefill_total"]
    assert prefills in (1, 2)
    assert long_512["delta"]["flare_launches_admit_total"] == 2
    assert server["agent-1500"]["delta"]["flare_launches_restore_total"] >= len(answered) - 1
    assert metrics["server-prefill_launches-long-512"] == prefills / 2
    assert metrics["server-preparation_ms-long-512"] > 0
    # The model thread's time to first token: within the client's, above zero.
    assert long_512["delta"]["flare_time_to_first_token_seconds_count"] == 2
    client_ttft_ms = [s.ttft_s * 1e3 for s in by["long-512"] if s.ttft_s is not None]
    assert 0 < metrics["server-server_ttft_ms-long-512"] <= max(client_ttft_ms)
    # Its two parts, split at each request's first launch, inside it.
    parts = [metrics[f"server-{key}-long-512"] for key in ("first_launch_ms", "first_record_ms")]
    assert all(part > 0 for part in parts)
    assert sum(parts) <= metrics["server-server_ttft_ms-long-512"]
    # The second part split again at the first sampling launch's submission.
    halves = [metrics[f"server-{key}-long-512"]
              for key in ("to_sampling_launch_ms", "sampling_record_ms")]  # fmt: skip
    assert all(half >= 0 for half in halves) and halves[1] > 0
    assert sum(halves) <= parts[1] * 1.001 + 1e-6
    assert "| long-512 | server: submission to first launch, mean (ms) |" in table
    assert "| long-512 | server: prefill chunks per request |" in table
    for label in ("chat TTFT, suite client (ms)", "chat TTFT, openai SDK (ms)"):
        assert f"| clients | {label} |" in table
    assert "| clients | first SSE event to first content, openai SDK (ms) |" in table
    assert metrics["clients-ttft_sdk_ms"] == pytest.approx(compared["summary"]["ttft_sdk_ms"])


def test_the_suite_cli_launches_a_server_and_times_its_startup(
    fake_server_binary: Path, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "startup.json"
    args = [
        "--url", f"http://127.0.0.1:{port}", "--engine", "flare", "--out", str(out),
        "--launch", f"exec {fake_server_binary} --port {port}", "--workloads",
    ]  # fmt: skip
    assert suite_main(args) == 0
    results = json.loads(out.read_text())
    assert 0 < results["startup_s"] < 60
    assert results["server_exit_status"] == 0
    assert results["versions"]["server_models"]["data"][0]["id"] == "tiny"
    assert "serving on" in out.with_suffix(".server.log").read_text()


# ---------------------------------------------------------------- replay floor


def test_the_replay_floor_answers_suite_requests(tmp_path: Path) -> None:
    from bench.suite.replay_floor import ReplayFloorEngine, prepare_floor

    path = write_tiny(tmp_path / "llama", "llama")
    prepared = prepare_floor(path, max_concurrency=2, context_limit=512, eager=True)
    floor = ReplayFloorEngine(prepared)
    requests = long_requests(floor.encode, 40, 2, seed=0, max_tokens=5)
    too_long = long_requests(floor.encode, 510, 1, seed=0, max_tokens=5)
    samples = floor.run(requests + too_long, 2)
    for sample in samples[:2]:
        assert sample.ok and sample.prompt_tokens == 40 and sample.concurrency == 2
        assert sample.ttft_s is not None and sample.ttft_s <= sample.e2e_s
        assert sample.finish_reason in ("stop", "length")
        assert len(sample.gaps_s) == (sample.output_tokens or 0) - 1
    assert samples[2].error is not None
    assert samples[2].error["code"] == "context_length_exceeded"
    # A tool chat: the tools declared as the server declares them for a template that
    # shows none (the tiny checkpoint's ChatML), so the floor prefills its prompt.
    from bench.suite.instructed import ChatRenderer

    (chat,) = tool_requests(seed=0, count=1, max_tokens=4)
    assert chat.messages is not None
    renderer = ChatRenderer(prepared.tokenizer)
    assert "<tools>" in renderer.text(chat.messages, chat.tools)
    ids = floor.prompt_ids(chat)
    assert ids == renderer.ids(chat.messages, chat.tools)
    bare = prepared.tokenizer.apply_chat_template(
        chat.messages, add_generation_prompt=True, tokenize=False
    )
    assert len(ids) > len(prepared.tokenizer.encode(str(bare), add_special_tokens=False))


def test_the_replay_floor_prepares_with_every_option_the_suite_parses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The suite hands the floor every --replay-* compile option; each reaches the
    # preparation (--replay-decode-fusion once failed with a TypeError on the GPU).
    from bench.suite import replay_floor
    from bench.suite.__main__ import build_parser

    args = build_parser().parse_args(
        [
            "--replay",
            "m",
            "--engine",
            "floor",
            "--out",
            "o.json",
            "--replay-decode-fusion=norms",
            "--replay-compile-scope=layer",
            "--replay-early-weights",
        ]
    )
    seen: list[PrepareOptions] = []
    monkeypatch.setattr(replay_floor, "prepare", lambda _model, options: seen.append(options))
    replay_floor.prepare_floor(
        tmp_path,
        max_concurrency=2,
        context_limit=512,
        eager=False,
        **compile_options(args, "replay-"),
    )
    (options,) = seen
    assert options.decode_fusion == "norms" and options.compile_scope == "layer"
    assert options.early_weights


# ---------------------------------------------------------------- report


def test_the_streaming_read_probe_sums_its_buffer() -> None:
    # Program p reads blocks p, p + P, p + 2P, ... (P programs); the last is partial.
    from bench.suite.bandwidth import stream_read

    x = torch.arange(10_000, dtype=torch.float32) / 7
    partial = stream_read(x, programs=3, block=256)
    blocks = x.double().split(256)
    expected = [sum(block.sum().item() for block in blocks[p::3]) for p in range(3)]
    assert partial.tolist() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="float32"):
        stream_read(x.half(), programs=3)


def test_geometry_bytes_match_the_documented_table() -> None:
    small, large = GEOMETRIES["smollm2-135m"], GEOMETRIES["qwen3-8b"]
    assert small.parameters() == 134_515_008
    assert small.weight_bytes_read() == small.weight_bytes() == 269_030_016
    assert small.kv_bytes_per_position() == 23_040
    assert small.bytes_per_step(1, 4096) == 363_401_856
    assert large.parameters() == 8_190_735_360
    assert large.weight_bytes() == 16_381_470_720
    assert large.weight_bytes_read() == 15_136_819_200
    assert large.kv_bytes_per_position() == 147_456
    assert large.bytes_per_step(1, 4096) == 15_740_798_976
    assert roofline_step_s(large, 4.0e12) == pytest.approx(3.784e-3, rel=1e-3)
    config = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
    }
    assert Geometry.from_config(config) == small


def _synthetic(engine: str, gap_s: float, ttft_s: float) -> dict[str, object]:
    samples = []
    for c in (1, 4):
        for i in range(c):
            sample = _sample(
                measurement=f"decode-c{c}",
                concurrency=c,
                ttft_s=ttft_s,
                start_s=0.0,
                gaps_s=[gap_s] * 10,
                e2e_s=ttft_s + 10 * gap_s,
                output_tokens=11,
                prompt_tokens=90,
                meta={"repeat": i},
            )
            samples.append(sample.to_json())
    long = _sample(measurement="long-4096", ttft_s=ttft_s * 8, e2e_s=ttft_s * 8, prompt_tokens=4096)
    samples.append(long.to_json())
    return {"engine": engine, "samples": samples, "skipped": []}


def test_the_summary_table_gives_flare_over_each_baseline_and_the_roofline() -> None:
    flare = _synthetic("flare", gap_s=0.004, ttft_s=0.02)
    baseline = _synthetic("transformers", gap_s=0.008, ttft_s=0.05)
    geometry = GEOMETRIES["qwen3-8b"]
    table = summary_table([baseline, flare], "flare", geometry, 4.0e12)
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    header = lines["metric"].strip("| ").split(" | ")
    assert header == [
        "workload",
        "metric",
        "better",
        "flare",
        "transformers",
        "roofline",
        "flare / transformers",
        "flare / roofline",
    ]
    itl = lines["ITL p50, c=1 (ms)"].strip("| ").split(" | ")
    assert itl[2:5] == ["lower", "4.00", "8.00"] and itl[6] == "0.50"
    # Context 90 + 11 / 2 = 95.5 -> 96 positions at batch 1.
    roof = geometry.bytes_per_step(1, 96) / 4.0e12
    assert float(itl[5]) == pytest.approx(roof * 1e3, rel=1e-2)
    assert float(itl[7]) == pytest.approx(4.0 / (roof * 1e3), rel=1e-2)
    rate = lines["decode per request, c=4 (tok/s)"].strip("| ").split(" | ")
    assert rate[2] == "higher" and rate[6] == "2.00"
    ttft = lines["cold TTFT, 4096 tokens (ms)"].strip("| ").split(" | ")
    assert ttft[3:5] == ["160", "400"] and ttft[6] == "0.40" and ttft[7] == "–"
    with pytest.raises(ValueError, match="no results"):
        summary_table([baseline], "flare")


def test_cold_rows_leave_out_requests_the_prefix_cache_served() -> None:
    flare = _synthetic("flare", gap_s=0.004, ttft_s=0.02)
    # A repeat of the cold prompt answered from the cache: 4 ms, not 160.
    warm = _sample(measurement="long-4096", ttft_s=0.004, e2e_s=0.004, prompt_tokens=4096)
    warm.cached_tokens = 4096
    flare["samples"].append(warm.to_json())
    table = summary_table([flare], "flare")
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    assert lines["cold TTFT, 4096 tokens (ms)"].strip("| ").split(" | ")[3] == "160"
    assert "flare: long-4096: 1 of 2 requests meant to be cold were served from the" in table
    assert "text chunks" not in table


def test_itl_rows_say_when_chunks_carried_several_tokens() -> None:
    flare = _synthetic("flare", gap_s=0.004, ttft_s=0.02)
    for sample in flare["samples"]:
        if sample["measurement"] == "decode-c1":
            sample["output_tokens"] = 21  # 20 tokens after the first, in 10 gaps
    table = summary_table([flare], "flare")
    assert "flare: decode-c1: 20 tokens after the first arrived in 10 gaps" in table
    assert "text chunks of 2.00 tokens on average" in table


def test_startup_and_the_native_decode_bench_are_rows_of_the_summary() -> None:
    flare = {**_synthetic("flare", gap_s=0.004, ttft_s=0.02), "startup_s": 1.5}
    baseline = {**_synthetic("transformers", gap_s=0.008, ttft_s=0.05), "startup_s": 6.0}
    bench = {
        "decode_bench": {
            "capacity": 4,
            "step": {"median_ms": 1.25, "p99_ms": 1.5},
            "submission_gap": {"median_ms": 0.01, "p99_ms": 0.03},
        }
    }
    extra = decode_bench_metrics(bench)
    geometry = GEOMETRIES["qwen3-8b"]
    table = summary_table([baseline, flare], "flare", geometry, 4.0e12, extra)
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    startup = lines["startup to ready (s)"].strip("| ").split(" | ")
    assert startup[2:5] == ["lower", "1.50", "6.00"] and startup[6] == "0.25"
    step = lines["native decode step, c=4 (ms)"].strip("| ").split(" | ")
    assert step[0] == "decode-c4" and step[3:5] == ["1.25", "–"]
    # Against the same roofline as the ITL at c=4.
    itl_roof = lines["ITL p50, c=4 (ms)"].strip("| ").split(" | ")[5]
    assert step[5] == itl_roof
    gap = lines["host submission gap p99, c=4 (ms)"].strip("| ").split(" | ")
    assert gap[3] == "0.0300"


def _client_pair(prompt: str, suite_ms: float, sdk_ms: float) -> list[dict[str, Any]]:
    """One prompt's samples through both clients: first events 1 ms in."""
    return [
        _sample(
            measurement="clients",
            ttft_s=ms / 1e3,
            first_event_s=1e-3,
            e2e_s=ms / 1e3 + 0.01,
            meta={"prompt": prompt, "client": client},
        ).to_json()
        for client, ms in ((SUITE_CLIENT, suite_ms), (SDK_CLIENT, sdk_ms))
    ]


def test_client_rows_compare_the_sdk_with_the_suite_client_and_flag_a_stall() -> None:
    flare = _synthetic("flare", gap_s=0.004, ttft_s=0.02)
    flare["samples"] += _client_pair("clients/0", 3.0, 43.0) + _client_pair("clients/1", 5.0, 45.0)
    # A prompt only one client answered has no pair.
    flare["samples"] += _client_pair("clients/2", 4.0, 44.0)[:1]
    baseline = _synthetic("transformers", gap_s=0.008, ttft_s=0.05)
    baseline["samples"] += _client_pair("clients/0", 10.0, 11.0)
    rows = client_ttft_rows([Sample.from_json(d) for d in flare["samples"]])
    assert [row["prompt"] for row in rows] == ["clients/0", "clients/1"]
    assert rows[0]["ttft_ms"] == pytest.approx(3.0) and rows[0]["ttft_sdk_ms"] == pytest.approx(43)
    assert rows[0]["first_event_to_content_ms"] == pytest.approx(2.0)
    assert rows[0]["first_event_to_content_sdk_ms"] == pytest.approx(42.0)
    table = summary_table([flare, baseline], "flare")
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    suite = lines["chat TTFT, suite client (ms)"].strip("| ").split(" | ")
    sdk = lines["chat TTFT, openai SDK (ms)"].strip("| ").split(" | ")
    gap = lines["first SSE event to first content, openai SDK (ms)"].strip("| ").split(" | ")
    assert suite[0] == "clients" and suite[3:5] == ["4.00", "10.0"]
    assert sdk[3:5] == ["44.0", "11.0"] and sdk[5] == "4.00"
    assert [float(cell) for cell in gap[3:5]] == pytest.approx([43.0, 10.0])
    assert "flare: clients: the openai SDK's TTFT is 40.0 ms above the suite client's" in table
    assert "transformers: clients: the openai SDK" not in table
    assert "client (http.client) and the openai SDK (httpx)" in table


# ---------------------------------------------------------------- generate loop


def test_the_generate_loop_sizes_its_static_cache_to_the_request() -> None:
    from bench.suite.generate_loop import MIN_CACHE_LEN, cache_len

    assert cache_len(346, 66560) == MIN_CACHE_LEN == 1024
    assert cache_len(1025, 66560) == 2048
    assert cache_len(33216, 66560) == 65536
    assert cache_len(65600, 66560) == 66560
    assert cache_len(46, 256) == 256


def test_the_generate_loop_answers_one_request_at_a_time(tmp_path: Path) -> None:
    from bench.suite.generate_loop import GenerateLoopEngine

    path = write_tiny(tmp_path / "llama", "llama")
    loop = GenerateLoopEngine(path, device="cpu", dtype=torch.float32, context_limit=256)
    requests = long_requests(loop.tokenizer.encode, 40, 3, seed=0, max_tokens=6)
    too_long = long_requests(loop.tokenizer.encode, 254, 1, seed=0, max_tokens=6)
    samples = loop.run(requests + too_long, 2)
    for sample in samples[:3]:
        assert sample.ok and sample.prompt_tokens == 40 and sample.concurrency == 2
        assert sample.ttft_s is not None and sample.ttft_s <= sample.e2e_s
        assert sample.finish_reason in ("stop", "length")
        assert 1 <= (sample.output_tokens or 0) <= 6
        assert len(sample.gaps_s) == (sample.output_tokens or 0) - 1
    # The second of a group of two waits for the first: its TTFT includes that wait.
    first, second = samples[0], samples[1]
    assert first.start_s == second.start_s
    assert second.ttft_s is not None and first.e2e_s <= second.ttft_s
    assert samples[3].error is not None and samples[3].error["code"] == "context_length_exceeded"
    # Same seed, same answer: the cache is reset between requests.
    again = loop.run(requests[:1], 1)[0]
    assert again.text == first.text


def test_agent_turns_without_a_ttft_break_the_plotted_line() -> None:
    def turn(n: int, ttft: float | None, branch: str = "main") -> Sample:
        return Sample(
            request=f"agent/turn-{n}",
            workload="agent",
            ttft_s=ttft,
            meta={"turn": n, "branch": branch},
        )

    trace = [turn(2, 0.003), turn(0, 0.001), turn(1, None), turn(1, 0.5, "fork")]
    turns = agent_turns_of(trace, "main")
    assert [t for t, _ in turns] == [0, 1, 2]
    ms = agent_ttft_ms(turns)
    assert ms[0] == pytest.approx(1.0) and ms[2] == pytest.approx(3.0)
    assert math.isnan(ms[1])
    assert [t for t, _ in agent_turns_of(trace, "fork")] == [1]


def test_a_repeat_is_the_same_answer_only_in_text_finish_and_length() -> None:
    def sample(name: str, text: str, branch: str = "main", **meta: str) -> Sample:
        return Sample(
            request=name, workload="agent", text=text, finish_reason="length",
            output_tokens=len(text.split()), prompt_tokens=900, cached_tokens=899,
            meta={"branch": branch, **meta},
        )  # fmt: skip

    trace = [
        sample("agent/turn-5", "a b c"),
        sample("agent/fork-0", "d e"),
        sample("agent/repeat-agent/fork-0", "d e", "repeat", repeat_of="agent/fork-0"),
        sample("agent/repeat-agent/turn-5", "a b x", "repeat", repeat_of="agent/turn-5"),
    ]
    checks = repeat_checks(trace)
    assert [(c["request"], c["same"]) for c in checks] == [
        ("agent/fork-0", True),
        ("agent/turn-5", False),
    ]
    assert checks[0]["cached_tokens"] == 899
    # A repeat whose first answer is missing (it failed) is not checked at all.
    assert repeat_checks(trace[2:3]) == []


def test_server_counters_parse_and_difference_per_request() -> None:
    text = (
        "# HELP flare_launches_prefill_total Prefill chunks\n"
        "# TYPE flare_launches_prefill_total counter\n"
        "flare_launches_prefill_total 7\n"
        'flare_prompt_preparation_seconds_bucket{le="0.001"} 1\n'
        "flare_prompt_preparation_seconds_sum 0.004\n"
        "flare_prompt_preparation_seconds_count 2\n"
        "flare_time_to_first_token_seconds_sum 0.05\n"
        "flare_time_to_first_token_seconds_count 4\n"
        "flare_launches_snapshot_total 3\n"
    )
    after = parse_metrics(text)
    assert after['flare_prompt_preparation_seconds_bucket{le="0.001"}'] == 1
    before = {
        "flare_launches_prefill_total": 1.0,
        "flare_prompt_preparation_seconds_sum": 0.001,
        "flare_prompt_preparation_seconds_count": 1.0,
        "flare_time_to_first_token_seconds_sum": 0.01,
        "flare_time_to_first_token_seconds_count": 2.0,
        "flare_launches_snapshot_total": 1.0,
    }
    delta = difference(before, after)
    assert delta == pytest.approx(
        {
            "flare_launches_prefill_total": 6,
            "flare_prompt_preparation_seconds_sum": 0.003,
            "flare_prompt_preparation_seconds_count": 1,
            "flare_time_to_first_token_seconds_sum": 0.04,
            "flare_time_to_first_token_seconds_count": 2,
            "flare_launches_snapshot_total": 2,
        }
    )
    per = per_request(delta, 2)
    assert per == pytest.approx(
        {
            "preparation_ms": 3.0,
            "server_ttft_ms": 20.0,
            "prefill_launches": 3.0,
            "snapshot_launches": 1.0,
        }
    )
    assert difference(None, after) is None
    assert metrics_path(Endpoint("http://127.0.0.1:8080/v1")) == "/metrics"
    assert metrics_path(Endpoint("http://host/flare/")) == "/flare/metrics"


def test_server_inter_token_shares_over_each_bound() -> None:
    """The model thread's and the HTTP tasks' inter-token gaps above 1 and 2 ms, from
    the histograms' cumulative buckets as Helios writes them (`le` as Rust prints the
    bound)."""
    text = ""
    for name, within in (
        ("flare_inter_token_latency_seconds", (90, 98)),
        ("flare_delivered_inter_token_seconds", (80, 96)),
    ):
        text += "".join(
            f'{name}_bucket{{le="{le}"}} {count}\n'
            for le, count in (("0.00075", 10), ("0.001", within[0]), ("0.002", within[1]))
        )
        text += f'{name}_bucket{{le="+Inf"}} 100\n{name}_count 100\n'
    before = {name: 0.0 for name in parse_metrics(text)}
    delta = difference(before, parse_metrics(text))
    assert delta is not None
    per = per_request(delta, 4)
    assert per["itl_over_1ms"] == pytest.approx(0.10)
    assert per["itl_over_2ms"] == pytest.approx(0.02)
    assert per["delivered_itl_over_1ms"] == pytest.approx(0.20)
    assert per["delivered_itl_over_2ms"] == pytest.approx(0.04)
    # Labels as Rust prints a bound: its shortest digits, never an exponent.
    assert [bound_label(x) for x in (0.001, 0.00025, 5e-05, 2.5, 1.0)] == [
        "0.001",
        "0.00025",
        "0.00005",
        "2.5",
        "1",
    ]
    # A server without the histogram gives no share.
    assert "itl_over_1ms" not in per_request({"flare_launches_prefill_total": 1.0}, 1)
