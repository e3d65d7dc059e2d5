"""bench/tool_prefix_reuse.py over the fake server with SmolLM2's frontend and a
scripted model: with ``tool_choice`` ``auto`` every turn restores most of its prompt
from the prefix cache; alternating ``auto`` and ``none`` changes the system message
(where the server declares the tools), so the first switch restores nothing and each
choice reuses only its own earlier turns. The H200 check runs the same script over
``flare run``."""

from __future__ import annotations

from pathlib import Path

from agent_fixtures import run_bench, scripted_server
from test_agent_protocol import SCRIPT


def test_auto_turns_reuse_the_prefix_and_switching_to_none_does_not(tmp_path: Path) -> None:
    server = scripted_server("smollm2", SCRIPT, tmp_path)
    try:
        report = run_bench("tool_prefix_reuse.py", server, tmp_path / "reuse.json", "--turns", "6")
        result = report["schedules"]
    finally:
        assert server.stop() == 0
    auto, alternating = result["auto"], result["alternating"]
    assert [row["tool_calls"] for row in auto["rows"]][:2] == [1, 0]
    assert all(share >= 0.8 for share in auto["summary"]["cached_fraction"][1:]), auto
    # The first switch to `none` restores nothing (the system message changed);
    # later turns of either choice restore that choice's own last checkpoint, so
    # alternating prefills more in all.
    first_none = alternating["rows"][1]
    assert first_none["tool_choice"] == "none" and first_none["cached_tokens"] == 0
    totals = (auto["summary"]["prefilled_total"], alternating["summary"]["prefilled_total"])
    assert totals[1] > totals[0], totals
