"""bench/agent_session.py over the fake server (SmolLM2's frontend, a scripted model
that calls the tool, then answers from its result): the Responses stream conforms and
the Anthropic tool conversation runs to its answer. The H200 check runs the same
script over ``flare run`` (bench/issue20_check.sh)."""

from __future__ import annotations

from pathlib import Path

from agent_fixtures import run_bench, scripted_server
from test_agent_protocol import SCRIPT


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
