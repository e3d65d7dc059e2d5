"""The real HTTP server over sockets, driven by the real ``openai``, ``anthropic`` and
OpenAI Agents clients and by raw SSE clients (no GPU).

The server is Helios's own (router, scheduler worker, socket, graceful shutdown) over
the deterministic test executor: the ``fake_server`` example of ``flare-helios``,
built here with cargo. Outputs are the fake model's, so the tests check protocol
behaviour (streaming and not, usage, finish reasons, errors, cancellation), and that
seeded requests are reproducible whichever way they are read.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from fake_server import FakeServer as Server
from fake_server import build_fake_server

MODEL = "tiny"
KEY = "sk-flare-test"
TINY_CORE = Path(__file__).resolve().parents[1] / "helios/tests/fixtures/tiny-core/manifest.pb"


@pytest.fixture(scope="module")
def fake_server_binary() -> Path:
    return build_fake_server()


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture(scope="module")
def server(fake_server_binary: Path) -> Iterator[Server]:
    running = Server(fake_server_binary)
    yield running
    assert running.stop() == 0, "".join(running.log)


def _openai(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def _anthropic(server: Server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


MESSAGES = [{"role": "user", "content": "hello there"}]


def test_models_lists_the_served_model(server: Server) -> None:
    models = _openai(server).models.list()
    assert [model.id for model in models.data] == [MODEL]


def test_openai_chat_streamed_and_not_agree_under_a_seed(server: Server) -> None:
    client = _openai(server)
    whole = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, temperature=1.0
    )
    choice = whole.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert isinstance(choice.message.content, str) and choice.message.content
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    assert 0 < whole.usage.completion_tokens <= 12
    again = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, temperature=1.0
    )
    assert again.choices[0].message.content == choice.message.content
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        seed=7,
        temperature=1.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for delta in chunk.choices:
            text += delta.delta.content or ""
            finish = delta.finish_reason or finish
    assert text == choice.message.content
    assert finish == choice.finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.serial
def test_the_first_content_delta_follows_the_first_event_at_once(server: Server) -> None:
    """Through httpx (the ``openai`` SDK's transport), as stock clients read a stream:
    each SSE event is a small write, and without TCP_NODELAY the second one waited for
    the client's delayed ACK (about 40 ms after the role event)."""
    client = _openai(server)
    gaps = []
    for seed in range(5):
        first_event = first_content = None
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, seed=seed, stream=True
        )
        for chunk in stream:
            now = time.perf_counter()
            first_event = first_event or now
            if any(choice.delta.content for choice in chunk.choices):
                first_content = now
                break
        stream.close()
        assert first_event is not None and first_content is not None
        gaps.append(first_content - first_event)
    gaps.sort()
    assert gaps[len(gaps) // 2] < 0.005, gaps


def test_the_openai_agents_sdk_runs_an_agent_streamed_and_not(server: Server) -> None:
    """The OpenAI Agents SDK over chat completions (its Responses default is not
    served yet): a one-turn run, then the same run streamed, whose text deltas add
    up to its final output."""
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    def agent() -> Agent:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        return Agent(
            name="assistant",
            instructions="Answer briefly.",
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            model_settings=ModelSettings(max_tokens=8, temperature=1.0),
        )

    result = Runner.run_sync(agent(), "hello there", max_turns=1)
    assert isinstance(result.final_output, str) and result.final_output
    usage = result.context_wrapper.usage
    assert usage.requests == 1 and usage.input_tokens > 0 and 0 < usage.output_tokens <= 8

    async def streamed() -> tuple[str, object]:
        run = Runner.run_streamed(agent(), "hello there", max_turns=1)
        text = ""
        async for event in run.stream_events():
            data = getattr(event, "data", None)
            if event.type == "raw_response_event" and data.type == "response.output_text.delta":
                text += data.delta
        return text, run.final_output

    text, final = asyncio.run(streamed())
    assert text and text == final


def test_openai_completions_streamed_and_not(server: Server) -> None:
    client = _openai(server)
    whole = client.completions.create(model=MODEL, prompt="hello there", max_tokens=6, seed=3)
    assert whole.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(
        chunk.choices[0].text
        for chunk in client.completions.create(
            model=MODEL, prompt="hello there", max_tokens=6, seed=3, stream=True
        )
        if chunk.choices
    )
    assert streamed == whole.choices[0].text


def test_anthropic_messages_streamed_and_not(server: Server) -> None:
    client = _anthropic(server)
    whole = client.messages.create(model=MODEL, max_tokens=10, messages=MESSAGES)
    assert whole.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    assert whole.content and whole.content[0].type == "text"
    # Anthropic counts prompt tokens served from the (prefix) cache apart: an earlier
    # test may have left this conversation cached.
    prompt_tokens = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert prompt_tokens > 0 and 0 < whole.usage.output_tokens <= 10
    with client.messages.stream(model=MODEL, max_tokens=10, messages=MESSAGES) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    # Unseeded requests differ; the stream must agree with its own final message.
    assert streamed == "".join(block.text for block in final.content if block.type == "text")
    assert final.stop_reason in ("end_turn", "max_tokens", "stop_sequence")


def test_anthropic_messages_under_a_seed_answer_as_chat_does(server: Server) -> None:
    # `seed` is an extension on Messages as on chat and Responses: the same prompt,
    # sampling and seed give the same tokens whichever route and SDK sent it. Before,
    # Messages ignored the field and drew a random seed.
    chat = _openai(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, seed=21, temperature=0.8, top_p=0.9
    )
    expected = chat.choices[0].message.content
    client = _anthropic(server)
    # This SDK's `create` no longer names the sampling fields: they go as extra fields.
    sampling = {"temperature": 0.8, "top_p": 0.9}
    request = {"model": MODEL, "max_tokens": 10, "messages": MESSAGES}
    whole = client.messages.create(**request, extra_body={**sampling, "seed": 21})
    assert "".join(b.text for b in whole.content if b.type == "text") == expected
    with client.messages.stream(**request, extra_body={**sampling, "seed": 21}) as stream:
        assert "".join(stream.text_stream) == expected
    with pytest.raises(anthropic.BadRequestError, match="seed"):
        client.messages.create(**request, extra_body={**sampling, "seed": -1})


def _transformers_prompt(messages: list[dict[str, str]], **options: bool) -> list[int]:
    """The prompt Transformers renders for the fake server's core (the tiny core
    fixture's tokenizer, template and named special tokens)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from ignition.export import flare_core_pb2 as pb

    core = pb.Core()
    core.ParseFromString(TINY_CORE.read_bytes())
    frontend = core.frontend
    special = {token.name: token.content for token in frontend.named_special_tokens}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(frontend.tokenizer_json), **special
    )
    return list(
        tokenizer.apply_chat_template(
            messages,
            chat_template=frontend.chat_template,
            tokenize=True,
            return_dict=False,
            **options,
        )
    )


def test_a_final_assistant_message_is_continued_as_transformers_renders_it(
    server: Server,
) -> None:
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "w3 w4"},
    ]
    continued = _transformers_prompt(messages, continue_final_message=True)
    fresh = _transformers_prompt(messages, add_generation_prompt=True)
    assert len(continued) < len(fresh)
    answer = _openai(server).chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert answer.usage is not None and answer.usage.prompt_tokens == len(continued)
    message = _anthropic(server).messages.create(model=MODEL, max_tokens=2, messages=messages)
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert prompt == len(continued)
    # Without the flag, OpenAI's route opens a new assistant turn, as Transformers does.
    plain = _openai(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert plain.usage is not None and plain.usage.prompt_tokens == len(fresh)


def test_unknown_models_roles_and_content_parts_are_refused_by_the_sdks(
    server: Server,
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        _openai(server).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "model_not_found"
    with pytest.raises(anthropic.NotFoundError):
        _anthropic(server).messages.create(model="claude-x", max_tokens=2, messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(server).chat.completions.create(
            model=MODEL, messages=[{"role": "wizard", "content": "hi"}]
        )
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "messages[0].role"
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}],
        )
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "unsupported_content"
    assert caught.value.body["param"] == "messages[0].content[1]"
    models = _openai(server).models.list()
    assert models.data[0].model_dump()["max_model_len"] == 1024


def test_bad_requests_are_400_with_the_envelope(server: Server) -> None:
    client = _openai(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and body.get("code"), body
    with socket.create_connection((server.host, server.port), timeout=10) as conn:
        payload = b"{not json"
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        head, body_bytes = _read_all(conn).split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body_bytes)["error"]["code"] == "invalid_json"
    with pytest.raises(anthropic.BadRequestError):
        _anthropic(server).messages.create(model=MODEL, max_tokens=0, messages=MESSAGES)


def test_an_api_key_is_required_when_configured(fake_server_binary: Path) -> None:
    keyed = Server(fake_server_binary, "--api-key", KEY)
    try:
        with pytest.raises(openai.AuthenticationError):
            _openai(keyed, "sk-wrong").chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=2
            )
        with pytest.raises(anthropic.AuthenticationError):
            _anthropic(keyed, "sk-wrong").messages.create(
                model=MODEL, max_tokens=2, messages=MESSAGES
            )
        ok = _openai(keyed, KEY).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        )
        assert ok.choices[0].message.content is not None
        assert (
            _anthropic(keyed, KEY)
            .messages.create(model=MODEL, max_tokens=2, messages=MESSAGES)
            .content
        )
    finally:
        assert keyed.stop() == 0


def _open_stream(server: Server, max_tokens: int) -> socket.socket:
    body = json.dumps(
        {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
    ).encode()
    conn = socket.create_connection((server.host, server.port), timeout=30)
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    return conn


def test_a_client_that_disconnects_mid_stream_frees_its_request(
    fake_server_binary: Path,
) -> None:
    slow = Server(fake_server_binary, "--launch-ms", "5")
    try:
        conn = _open_stream(slow, max_tokens=900)
        received = b""
        while b"data:" not in received:
            received += conn.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
        conn.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            metrics = slow.metrics()
            if metrics["flare_requests_cancelled_total"] == 1:
                break
            time.sleep(0.05)
        assert metrics["flare_requests_cancelled_total"] == 1, metrics
        assert metrics["flare_running_requests"] == 0, metrics
        assert metrics["flare_requests_finished_length_total"] == 0, metrics
        assert metrics["flare_pages_used"] == 0, metrics
    finally:
        assert slow.stop() == 0


def test_a_failure_after_the_headers_ends_the_stream_with_an_error_event(
    fake_server_binary: Path,
) -> None:
    failing = Server(fake_server_binary, "--fail-after", "6")
    try:
        conn = _open_stream(failing, max_tokens=50)
        conn.settimeout(30)
        data = _read_all(conn)
        conn.close()
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        text = data.decode(errors="replace")
        assert "execution_failed" in text, text[-2000:]
        assert "[DONE]" not in text
    finally:
        # The executor failed: the server still stops cleanly.
        assert failing.stop() == 0


def test_sigterm_lets_a_running_request_finish(fake_server_binary: Path) -> None:
    slow = Server(fake_server_binary, "--launch-ms", "2")
    conn = _open_stream(slow, max_tokens=200)
    received = b""
    while b"data:" not in received:
        received += conn.recv(4096)
    slow.process.send_signal(signal.SIGTERM)
    received += _read_all(conn)
    conn.close()
    assert slow.process.wait(timeout=60) == 0
    text = received.decode(errors="replace")
    assert "[DONE]" in text, text[-1000:]


def test_a_slow_consumer_never_blocks_other_requests(fake_server_binary: Path) -> None:
    slow = Server(fake_server_binary, "--launch-ms", "1")
    try:
        # A client that reads nothing: a tiny receive window, and no recv at all.
        stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((slow.host, slow.port))
        body = json.dumps(
            {"model": MODEL, "messages": MESSAGES, "max_tokens": 900, "stream": True}
        ).encode()
        stalled.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        time.sleep(0.5)
        started = time.monotonic()
        for _ in range(5):
            answer = _openai(slow).chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=8
            )
            assert answer.choices[0].message.content is not None
        assert time.monotonic() - started < 10
        assert slow.metrics()["flare_running_requests"] >= 1  # the stalled one still runs
        stalled.close()
    finally:
        assert slow.stop() == 0
