"""The replay floor's chat prompts are the server's: for a template that renders no
tools, Helios declares the tools itself and writes calls and results out
(``instructed_input``); ``bench/suite/instructed.py`` mirrors it, held to the fixture
Helios's own test reads (``helios/tests/frontend_instructed.rs``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.suite.instructed import ChatRenderer, instructed_messages
from bench.suite.workloads import tool_requests
from ignition.loading.synthetic_tokenizers import char_level_tokenizer

FIXTURE = Path(__file__).resolve().parent.parent / "helios/tests/fixtures/chat/instructed.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[case["name"][:40] for case in CASES])
def test_the_mirror_gives_the_fixture(case: dict) -> None:
    messages = json.loads(json.dumps(case["messages"]))  # the mirror must not change them
    out = instructed_messages(messages, case["tools"], case["call_start"], case["call_end"])
    assert out == case["expected"]
    assert messages == case["messages"]


def test_the_floor_prefills_the_declared_tools() -> None:
    """A tool conversation on a ChatML template (which shows no tools): the floor's
    prompt declares the tools and writes the call and the result out, as the server's
    does; before, it rendered the bare messages (63 tokens of SmolLM2 against the
    server's 479 on the H100, 2026-12-05g)."""
    tokenizer = char_level_tokenizer(256)
    renderer = ChatRenderer(tokenizer)
    assert renderer.markers == ("<tool_call>", "</tool_call>")
    request = tool_requests(seed=0, count=1, max_tokens=8)[0]
    assert request.tools is not None and request.messages is not None
    ids = renderer.ids(request.messages, request.tools)
    assert ChatRenderer(tokenizer).ids(request.messages, request.tools) == ids
    text = tokenizer.decode(ids)
    for tool in request.tools:
        assert json.dumps(tool, ensure_ascii=False) in text
    call = request.messages[2]["tool_calls"][0]["function"]
    assert f'<tool_call>\n{{"name": "{call["name"]}", "arguments": ' in text
    assert "<|im_start|>user\n<tool_response>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    bare = tokenizer.apply_chat_template(
        request.messages, add_generation_prompt=True, tokenize=False
    )
    assert len(ids) > len(tokenizer.encode(str(bare), add_special_tokens=False)) + 100
