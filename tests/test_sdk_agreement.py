"""bench/sdk_agreement.py against Helios's real HTTP server over the test executor:
one prompt under one seed gives chat's answer on every route and stock client,
streamed and not (the check ``bench/serve_clients.py --sdks`` runs on a GPU server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_server import FakeServer, build_fake_server

from bench.sdk_agreement import disagreements, sdk_agreement


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    running = FakeServer(build_fake_server())
    yield running
    assert running.stop() == 0, "".join(running.log)


def test_every_route_and_client_answers_as_chat_under_one_seed(server: FakeServer) -> None:
    messages = [
        {"role": "system", "content": "w5 w6"},
        {"role": "user", "content": "hello there"},
    ]
    sampling = {"temperature": 0.8, "top_p": 0.9, "seed": 1234, "max_tokens": 12}
    report = sdk_agreement(server.url, "tiny", messages, sampling)
    answers = report["answers"]
    assert set(answers) == {
        "chat",
        "chat_stream",
        "responses",
        "responses_stream",
        "messages",
        "messages_stream",
        "agents",
        "agents_stream",
    }
    assert report["agree"], report
    # Another seed is another answer: the agreement is not the fake model's constancy.
    other = sdk_agreement(server.url, "tiny", messages, {**sampling, "seed": 1235})
    assert other["agree"] and other["answers"]["chat"] != answers["chat"]


def test_a_route_that_differs_is_named() -> None:
    answers = {"chat": "a b", "chat_stream": "a b", "messages": "a c", "agents": "a b"}
    assert disagreements(answers) == ["messages"]
    assert disagreements({"chat": "x", "responses": "x"}) == []
