"""bench/agent_session.py and bench/constrained_session.py over the fake server
(SmolLM2's frontend, a scripted model that calls the tool, then answers from its
result, with the test executor applying masks): the Responses stream conforms, the
Anthropic tool conversation runs to its answer, and constrained answers validate. The
H200 checks run the same scripts over ``flare run`` (bench/issue20_check.sh,
bench/issue21_check.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

from agent_fixtures import run_bench, scripted_server
from test_agent_protocol import PATCH, SCRIPT


def test_the_agent_session_completes_with_a_tool_round_trip(tmp_path: Path) -> None:
    server = scripted_server("smollm2", SCRIPT, tmp_path)
    try:
        result = run_bench("agent_session.py", server, tmp_path / "session.json")
    finally:
        assert server.stop() == 0
    stream = result["responses_stream"]
    assert stream["event_types"][-1] == "response.completed"
    assert [item["type"] for item in stream["response"]["output"]] == ["function_call"]
    turns = result["anthropic_tool_conversation"]["turns"]
    assert [turn["stop_reason"] for turn in turns] == ["tool_use", "end_turn"]
    assert turns[1]["content"][0]["text"] == "It is sunny in Paris."


def test_constrained_answers_validate_and_their_latency_is_reported(tmp_path: Path) -> None:
    # The fake model would call the tool for the weather and chat otherwise; the
    # masks hold its chat to the yes/no schema (the story schema's free strings need
    # not end for a model that picks tokens at random, so only latency is read there).
    server = scripted_server("smollm2", SCRIPT, tmp_path)
    try:
        result = run_bench(
            "constrained_session.py", server, tmp_path / "constrained.json", "--rounds", "1"
        )
    finally:
        assert server.stop() == 0
    checks = result["checks"]
    assert len(checks) == 17 and all(check["ok"] for check in checks.values()), checks
    # The scripted patch comes through the grammar whole; the regex tool's "maybe"
    # becomes yes or no.
    assert checks["responses_custom_lark_stream"]["inputs"] == [PATCH]
    assert checks["responses_custom_regex"]["inputs"][0] in ("yes", "no")
    # The server timed every constrained request's masks.
    masks = result["served_masks"]
    assert masks["count"] > 0 and masks["mean_us"] > 0, masks
    assert masks["p50_at_most_us"] <= masks["p99_at_most_us"], masks
    assert checks["chat_required"]["calls"] == [["get_weather", '{"city": "Paris"}']]
    assert checks["anthropic_tool_stream"]["finish"] == "tool_use"
    for concurrency in (1, 4):
        row = result[f"latency_c{concurrency}"]
        assert row["unconstrained"]["requests"] == row["constrained"]["requests"] == concurrency
        for mode in ("unconstrained", "constrained"):
            assert row[mode]["gaps"] > 0 and row[mode]["served_tokens"] > 0, row
            assert row[mode]["served_itl_mean_ms"] > 0
        assert row["ratio_served_itl_mean"] > 0


def test_a_call_the_output_limit_cut_is_left_out_only_after_completed_calls() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from constrained_session import calls_judged

    paris = ("get_weather", '{"city": "Paris"}')
    cut = ("get_weather", '{"ci')
    assert calls_judged([paris, cut], "length")["ok"]
    assert calls_judged([paris, ("get_weather", {})], "max_tokens")["ok"]
    assert not calls_judged([paris, cut], "stop")["ok"]
    assert not calls_judged([cut], "length")["ok"]
    assert not calls_judged([("get_time", "{}"), cut], "length")["ok"]
    assert not calls_judged([], "stop")["ok"]
