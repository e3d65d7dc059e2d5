"""The agent protocol through the stock clients (no GPU): tool calls, ``tool_choice``
and reasoning over OpenAI chat completions and Anthropic messages, driven by the
``openai`` and ``anthropic`` SDKs and the OpenAI Agents SDK over sockets.

The server is Helios's own over the deterministic test executor (the ``fake_server``
example), serving a frontend that Ignition derives from a fixture template exactly as
it would for a core (``agent_fixtures.py``): SmolLM2's template, which renders no
tools (the server's instructed JSON format), and a Qwen3-style template (JSON calls in
``<tool_call>`` tags and ``<think>`` reasoning, all single added tokens). The model is
scripted: each reply is chosen by text in the prompt, so the tests check what the
server makes of a known output, and what prompt it renders (a reply can be the
SHA-256 of the prompt's token ids, compared with Transformers' rendering).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from agent_fixtures import fixture_tokenizer, scripted_server
from fake_server import FakeServer as Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from constrained_session import APPLY_PATCH, DECIDE

MODEL = "tiny"
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
CALL_PARIS = f"<tool_call>\n{PARIS}\n</tool_call>"
CALL_TWO = (
    CALL_PARIS
    + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)
# Custom tools as Codex sends them (an apply_patch Lark grammar, a yes/no regex), the
# same the GPU check sends; the model's call writes the input as the JSON string
# argument of the function the tool is presented as.
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+Hello "world"\t\\o/\n*** End Patch\n'
CALL_PATCH = (
    '<tool_call>\n{"name": "apply_patch", "arguments": {"input": '
    + json.dumps(PATCH)
    + "}}\n</tool_call>"
)
CALL_DECIDE = '<tool_call>\n{"name": "decide", "arguments": {"input": "maybe"}}\n</tool_call>'
SCRIPT = [
    {"when": "", "reply": "Nothing is scripted for that."},
    {"when": "weather in Paris", "reply": CALL_PARIS},
    {"when": "weather in Rome", "reply": CALL_PARIS.replace("Paris", "Rome")},
    {"when": "two cities", "reply": CALL_TWO},
    {"when": "just chat", "reply": "Hello there."},
    {"when": "think first", "reply": "<think>\nplan: call it\n</think>\n\n" + CALL_PARIS},
    {"when": "sunny", "reply": "It is sunny in Paris."},
    {"when": "digest please", "reply_with": "prompt_sha256"},
    {"when": "in json", "reply": '{"mood": "sunny", "count": 2}'},
    {"when": "patch please", "reply": CALL_PATCH},
    {"when": "file hello.txt", "reply": CALL_PATCH},
    {"when": "yes or no", "reply": CALL_DECIDE},
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            # Closed schemas: where the mask leaves the fake model a choice, it
            # picks at random, and an open object could grow without end.
            "additionalProperties": False,
        },
    },
}
NOW = {
    "type": "function",
    "function": {
        "name": "now",
        "description": "The time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
ANTHROPIC_WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": WEATHER["function"]["parameters"],
}


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = scripted_server("smollm2", SCRIPT, tmp_path_factory.mktemp("smollm2"))
    yield running
    assert running.stop() == 0, "".join(running.log)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = scripted_server("qwen3", SCRIPT, tmp_path_factory.mktemp("qwen3"))
    yield running
    assert running.stop() == 0, "".join(running.log)


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _streamed_chat(client: openai.OpenAI, **request: Any) -> dict[str, Any]:
    """A streamed chat completion folded: content, reasoning, calls, finish reason,
    and every tool-call delta as it came."""
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    deltas: list[dict[str, Any]] = []
    for chunk in client.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            deltas.append(call.model_dump(exclude_none=True))
            into = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            if call.id is not None:
                into["id"] = call.id
            if call.function is not None:
                if call.function.name is not None:
                    into["name"] = call.function.name
                into["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": [calls[index] for index in sorted(calls)],
        "finish": finish,
        "deltas": deltas,
    }


def test_a_tool_call_streamed_and_not_is_the_same_call(smollm2: Server) -> None:
    client = _openai(smollm2)
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("What is the weather in Paris?"),
        "tools": [strict, NOW],
    }
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'
    streamed = _streamed_chat(client, **request)
    assert streamed["finish"] == "tool_calls" and streamed["content"] == ""
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [
        ("get_weather", '{"city": "Paris"}')
    ]
    # The id, type and name come once, in the call's first delta.
    first, *rest = streamed["deltas"]
    assert first["id"] and first["type"] == "function" and first["function"]["name"]
    assert all("id" not in d and "name" not in d.get("function", {}) for d in rest)


def test_parallel_calls_and_parallel_tool_calls_false(smollm2: Server) -> None:
    client = _openai(smollm2)
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("Compare two cities"),
        "tools": [WEATHER],
    }
    both = client.chat.completions.create(**request).choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments)["city"] for c in both] == ["Paris", "Oslo"]
    assert len({c.id for c in both}) == 2
    one = client.chat.completions.create(parallel_tool_calls=False, **request)
    assert len(one.choices[0].message.tool_calls or []) == 1
    streamed = _streamed_chat(client, parallel_tool_calls=False, **request)
    assert len(streamed["calls"]) == 1 and streamed["finish"] == "tool_calls"


# (tool_choice, tools declared?, script prompt) -> outcome:
# ("calls", n), ("text", content) or ("error", HTTP status).
MATRIX = [
    ("auto", True, "weather in Paris", ("calls", 1)),
    ("auto", True, "just chat", ("text", "Hello there.")),
    ("auto", False, "weather in Paris", ("text", CALL_PARIS)),
    ("none", True, "weather in Paris", ("text", CALL_PARIS)),
    ("none", False, "just chat", ("text", "Hello there.")),
    ("required", True, "weather in Paris", ("calls", 1)),
    # The fake server applies masks: a required call is made even when the
    # model would answer in text, and a named one is the named tool's.
    ("required", True, "just chat", ("calls", 1)),
    ("required", False, "weather in Paris", ("error", 400)),
    ("get_weather", True, "weather in Paris", ("calls", 1)),
    ("now", True, "weather in Paris", ("calls", 1)),
    ("get_weather", False, "weather in Paris", ("error", 400)),
]


def _openai_choice(choice: str) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("choice", "declared", "prompt", "outcome"), MATRIX)
def test_the_openai_tool_choice_matrix(
    smollm2: Server, choice: str, declared: bool, prompt: str, outcome: Any, stream: bool
) -> None:
    client = _openai(smollm2)
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask(prompt),
        "tool_choice": _openai_choice(choice),
    }
    if declared:
        request["tools"] = [WEATHER, NOW]
    kind, expected = outcome
    if kind == "error" and (expected == 400 or not stream):
        with pytest.raises(openai.APIStatusError) as raised:
            _streamed_chat(client, **request) if stream else client.chat.completions.create(
                **request
            )
        assert raised.value.status_code == expected
        code = "tool_choice_unmet" if expected == 422 else "invalid_parameter"
        assert raised.value.body["code"] == code, raised.value.body
        return
    if kind == "error":
        # After the headers, the failure is an error event the SDK raises.
        with pytest.raises(openai.APIError) as raised:
            _streamed_chat(client, **request)
        assert "tool_choice" in str(raised.value)
        return
    if stream:
        result = _streamed_chat(client, **request)
        content, calls, finish = result["content"], result["calls"], result["finish"]
    else:
        whole = client.chat.completions.create(**request).choices[0]
        content, calls = whole.message.content or "", whole.message.tool_calls or []
        finish = whole.finish_reason
    if kind == "calls":
        assert len(calls) == expected and finish == "tool_calls" and content == ""
    else:
        assert (content, calls, finish) == (expected, [], "stop")


ANTHROPIC_MATRIX = [
    ({"type": "auto"}, True, "weather in Paris", ("tool_use", "get_weather")),
    ({"type": "auto"}, True, "just chat", ("text", "Hello there.")),
    ({"type": "auto"}, False, "weather in Paris", ("text", CALL_PARIS)),
    ({"type": "none"}, True, "weather in Paris", ("text", CALL_PARIS)),
    ({"type": "none"}, False, "just chat", ("text", "Hello there.")),
    ({"type": "any"}, True, "weather in Paris", ("tool_use", "get_weather")),
    ({"type": "any"}, True, "just chat", ("tool_use", None)),
    ({"type": "any"}, False, "weather in Paris", ("error", 400)),
    (
        {"type": "tool", "name": "get_weather"},
        True,
        "weather in Paris",
        ("tool_use", "get_weather"),
    ),
    ({"type": "tool", "name": "now"}, True, "weather in Paris", ("tool_use", "now")),
    ({"type": "tool", "name": "get_weather"}, False, "weather in Paris", ("error", 400)),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("choice", "declared", "prompt", "outcome"), ANTHROPIC_MATRIX)
def test_the_anthropic_tool_choice_matrix(
    smollm2: Server,
    choice: dict[str, str],
    declared: bool,
    prompt: str,
    outcome: Any,
    stream: bool,
) -> None:
    client = _anthropic(smollm2)
    now = {
        "name": "now",
        "description": "The time",
        "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
    }
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": _ask(prompt),
        "tool_choice": choice,
    }
    if declared:
        request["tools"] = [ANTHROPIC_WEATHER, now]
    kind, expected = outcome
    if kind == "error":
        with pytest.raises(anthropic.APIError) as raised:
            if stream:
                with client.messages.stream(**request) as events:
                    events.get_final_message()
            else:
                client.messages.create(**request)
        if not stream or expected == 400:
            assert isinstance(raised.value, anthropic.APIStatusError)
            assert raised.value.status_code == expected
        assert "tool_choice" in str(raised.value)
        return
    if stream:
        with client.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    if kind == "tool_use":
        uses = [block for block in message.content if block.type == "tool_use"]
        assert len(uses) == 1 and message.stop_reason == "tool_use"
        assert uses[0].name == expected or expected is None
        if uses[0].name == "get_weather":
            assert uses[0].input["city"] in ("Paris", "Oslo")
        assert uses[0].id.startswith("toolu_")
        assert not [block for block in message.content if block.type == "text"]
    else:
        assert [block.type for block in message.content] == ["text"]
        assert message.content[0].text == expected and message.stop_reason == "end_turn"


def test_an_anthropic_tool_conversation_continues_after_the_result(smollm2: Server) -> None:
    client = _anthropic(smollm2)
    first = client.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=_ask("What is the weather in Paris?"),
        tools=[ANTHROPIC_WEATHER],
    )
    (use,) = [block for block in first.content if block.type == "tool_use"]
    follow = [
        *_ask("What is the weather in Paris?"),
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=follow, tools=[ANTHROPIC_WEATHER]
    ) as events:
        kinds = [event.type for event in events]
        answer = events.get_final_message()
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "It is sunny in Paris."
    assert answer.stop_reason == "end_turn"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"


def test_reasoning_is_parsed_by_its_tokens_on_a_qwen3_style_template(qwen3: Server) -> None:
    client = _openai(qwen3)
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("The weather in Paris? Please think first"),
        "tools": [WEATHER],
    }
    whole = client.chat.completions.create(**request).choices[0]
    extra = whole.message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == "plan: call it"
    (call,) = whole.message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
    streamed = _streamed_chat(client, **request)
    assert streamed["reasoning"] == "plan: call it"
    assert [c["arguments"] for c in streamed["calls"]] == ['{"city": "Paris"}']
    message = _anthropic(qwen3).messages.create(
        model=MODEL,
        max_tokens=200,
        messages=_ask("The weather in Paris? Please think first"),
        tools=[ANTHROPIC_WEATHER],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "tool_use"], kinds
    assert message.content[0].thinking == "plan: call it" and message.content[0].signature
    with _anthropic(qwen3).messages.stream(
        model=MODEL,
        max_tokens=200,
        messages=_ask("The weather in Paris? Please think first"),
        tools=[ANTHROPIC_WEATHER],
    ) as events:
        streamed_message = events.get_final_message()
    assert [b.type for b in streamed_message.content] == kinds
    assert streamed_message.content[1].input == {"city": "Paris"}


def _digest(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


TOOL_CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris? digest please"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, digest please"},
]


def _as_template_sees_it(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the server hands it to the template: a call's arguments
    string is the object it encodes (as vLLM passes it)."""
    out = json.loads(json.dumps(messages))
    for message in out:
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


# SmolLM2's template renders no tools: the server writes the exchange in the format
# it instructs (here with no tools shown, so no instruction), which is this
# conversation for Transformers.
INSTRUCTED_CONVERSATION = [
    TOOL_CONVERSATION[0],
    TOOL_CONVERSATION[1],
    {"role": "assistant", "content": CALL_PARIS},
    {"role": "user", "content": "<tool_response>\nsunny, digest please\n</tool_response>"},
]


@pytest.mark.parametrize(
    ("name", "tools", "rendered"),
    [("qwen3", [WEATHER], None), ("smollm2", None, INSTRUCTED_CONVERSATION)],
)
def test_tool_conversations_render_as_transformers_renders_them(
    request: pytest.FixtureRequest,
    name: str,
    tools: list[dict[str, Any]] | None,
    rendered: list[dict[str, Any]] | None,
) -> None:
    server: Server = request.getfixturevalue(name)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    reply = _openai(server).chat.completions.create(
        model=MODEL, messages=TOOL_CONVERSATION, max_tokens=200, **extra
    )
    tokenizer = fixture_tokenizer(name)
    ids = tokenizer.apply_chat_template(
        rendered or _as_template_sees_it(TOOL_CONVERSATION),
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert reply.choices[0].message.content == _digest(list(ids))
    assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)


FLAT_WEATHER = {"type": "function", **WEATHER["function"], "strict": True}


def test_a_responses_stream_conforms_and_matches_the_whole_response(smollm2: Server) -> None:
    client = _openai(smollm2)
    request: dict[str, Any] = {
        "model": MODEL,
        "input": "What is the weather in Paris?",
        "instructions": "Use the tools.",
        "tools": [FLAT_WEATHER, {"type": "web_search"}],
    }
    whole = client.responses.create(**request)
    assert whole.status == "completed"
    (call,) = [item for item in whole.output if item.type == "function_call"]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert call.call_id.startswith("call_")
    # Hosted tool types are skipped, not refused, and not echoed.
    assert [tool.type for tool in whole.tools] == ["function"]
    events = list(client.responses.create(stream=True, **request))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    for kind in (
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert kind in kinds, kinds
    arguments = "".join(
        event.delta for event in events if event.type == "response.function_call_arguments.delta"
    )
    assert arguments == call.arguments
    final = events[-1].response
    assert [item.type for item in final.output] == [item.type for item in whole.output]


def test_a_responses_text_stream_and_a_token_limit(smollm2: Server) -> None:
    client = _openai(smollm2)
    with client.responses.stream(model=MODEL, input="just chat") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello there."
    short = client.responses.create(model=MODEL, input="just chat", max_output_tokens=2)
    assert short.status == "incomplete"
    assert short.incomplete_details is not None
    assert short.incomplete_details.reason == "max_output_tokens"


def test_previous_response_id_round_trips_function_items(smollm2: Server) -> None:
    client = _openai(smollm2)
    first = client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[FLAT_WEATHER]
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[FLAT_WEATHER],
    )
    assert second.output_text == "It is sunny in Paris."
    # The same conversation sent whole renders the same prompt.
    replayed = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[FLAT_WEATHER],
    )
    assert second.usage is not None and replayed.usage is not None
    assert second.usage.input_tokens == replayed.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, previous_response_id="resp_unknown", input="hi")
    assert raised.value.body["code"] == "previous_response_not_found", raised.value.body
    unstored = client.responses.create(model=MODEL, input="just chat", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, previous_response_id=unstored.id, input="hi")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_openai_agents_sdk_runs_a_two_step_tool_loop(smollm2: Server, api: str) -> None:
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        calls.append(city)
        return "sunny"

    kind = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel

    def agent() -> Any:
        # A client per event loop: each run below has its own.
        client = openai.AsyncOpenAI(base_url=smollm2.url + "/v1", api_key="unused", max_retries=0)
        model = kind(model=MODEL, openai_client=client)
        return agents.Agent(
            name="weather", instructions="Answer.", model=model, tools=[get_weather]
        )

    result = agents.Runner.run_sync(agent(), "What is the weather in Paris?")
    assert calls == ["Paris"]
    assert result.final_output == "It is sunny in Paris."

    async def streamed() -> Any:
        run = agents.Runner.run_streamed(agent(), "What is the weather in Paris?")
        async for _ in run.stream_events():
            pass
        return run.final_output

    assert asyncio.run(streamed()) == "It is sunny in Paris." and calls == ["Paris", "Paris"]


def test_truncated_calls_and_stop_strings(smollm2: Server) -> None:
    client = _openai(smollm2)
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("What is the weather in Paris?"),
        "tools": [WEATHER],
    }
    # Cut inside the arguments: the call as far as it was written, finish "length".
    short = client.chat.completions.create(max_tokens=14, **request).choices[0]
    (call,) = short.message.tool_calls or []
    assert short.finish_reason == "length" and call.function.name == "get_weather"
    assert '{"city": "Paris"}'.startswith(call.function.arguments)
    assert call.function.arguments != '{"city": "Paris"}'
    streamed = _streamed_chat(client, max_tokens=14, **request)
    assert [c["arguments"] for c in streamed["calls"]] == [call.function.arguments]
    # A stop string at the closing marker: the call closed before it.
    stopped = client.chat.completions.create(stop=["</tool_call>"], **request).choices[0]
    assert stopped.finish_reason == "stop"
    assert [c.function.arguments for c in stopped.message.tool_calls or []] == ['{"city": "Paris"}']


def test_enable_thinking_reaches_the_template_and_decides_where_output_starts(
    qwen3: Server,
) -> None:
    client = _openai(qwen3)
    for enable in (True, False):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=_ask("just chat, digest please"),
            extra_body={"chat_template_kwargs": {"enable_thinking": enable}},
        )
        ids = fixture_tokenizer("qwen3").apply_chat_template(
            _ask("just chat, digest please"),
            add_generation_prompt=True,
            enable_thinking=enable,
            tokenize=True,
            return_dict=False,
        )
        # The digest is plain text: no reasoning, whichever way the prompt ends.
        message = reply.choices[0].message
        assert message.content == _digest(list(ids))
        assert "reasoning_content" not in (message.model_extra or {})


YES_NO = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def test_json_schema_answers_validate_whatever_the_model_would_say(smollm2: Server) -> None:
    # The scripted model answers in prose; the mask leaves it only the schema.
    client = _openai(smollm2)
    fmt = {"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO}}
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("just chat"),
        "response_format": fmt,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert json.loads(whole.message.content or "")["answer"] in ("yes", "no")
    assert whole.finish_reason == "stop"
    streamed = _streamed_chat(client, **request)
    assert json.loads(streamed["content"])["answer"] in ("yes", "no")
    # A JSON object leaves the model free inside it: one that would say an
    # object says exactly that; one that would say prose is held to an
    # object's opening (a random walk inside a string need not end, so the
    # prose case is cut by its limit and checked only for its start).
    objects = client.chat.completions.create(
        model=MODEL, messages=_ask("in json"), response_format={"type": "json_object"}
    )
    assert objects.choices[0].message.content == '{"mood": "sunny", "count": 2}'
    assert objects.choices[0].finish_reason == "stop"
    forced = client.chat.completions.create(
        model=MODEL,
        messages=_ask("just chat"),
        response_format={"type": "json_object"},
        max_tokens=6,
    ).choices[0]
    assert (forced.message.content or "").lstrip().startswith("{"), forced.message.content
    if forced.finish_reason == "stop":
        assert isinstance(json.loads(forced.message.content or ""), dict)
    else:
        assert forced.finish_reason == "length"
    response = client.responses.create(
        model=MODEL,
        input="just chat",
        text={"format": {"type": "json_schema", "name": "yes_no", "schema": YES_NO}},
    )
    assert json.loads(response.output_text)["answer"] in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL,
            messages=_ask("just chat"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nope"}},
            },
        )
    assert raised.value.body["code"] == "invalid_grammar", raised.value.body


def test_auto_with_a_strict_tool_holds_its_calls_to_the_schema(smollm2: Server) -> None:
    # The scripted model calls for Rome, outside the tool's enum: as declared,
    # the call comes back as written; declared strict, the mask leaves only the
    # schema's cities, and prose stays free.
    client = _openai(smollm2)
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    ask = _ask("weather in Rome")
    loose = client.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER])
    calls = loose.choices[0].message.tool_calls or []
    assert [json.loads(call.function.arguments) for call in calls] == [{"city": "Rome"}]
    for stream in (False, True):
        if stream:
            held = _streamed_chat(client, model=MODEL, messages=ask, tools=[strict])
            arguments, finish = [c["arguments"] for c in held["calls"]], held["finish"]
        else:
            choice = client.chat.completions.create(
                model=MODEL, messages=ask, tools=[strict]
            ).choices[0]
            arguments = [c.function.arguments for c in choice.message.tool_calls or []]
            finish = choice.finish_reason
        assert finish == "tool_calls", (stream, arguments)
        assert len(arguments) == 1 and json.loads(arguments[0])["city"] in ("Paris", "Oslo")
    chat = client.chat.completions.create(model=MODEL, messages=_ask("just chat"), tools=[strict])
    assert chat.choices[0].message.content == "Hello there."
    broken = {
        "type": "function",
        "function": {"name": "x", "strict": True, "parameters": {"type": "nope"}},
    }
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=ask, tools=[broken])
    assert raised.value.body["code"] == "invalid_grammar", raised.value.body
    assert raised.value.body["param"] == "tools", raised.value.body


def test_a_schema_with_auto_tools_answers_by_it_or_calls(smollm2: Server) -> None:
    # An agent asking for structured final output may still call its tools: the
    # scripted call comes through, and prose is held to the schema.
    client = _openai(smollm2)
    fmt = {"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO}}
    request = {"model": MODEL, "tools": [WEATHER], "response_format": fmt}
    called = client.chat.completions.create(messages=_ask("weather in Paris"), **request)
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [c.function.arguments for c in choice.message.tool_calls or []] == ['{"city": "Paris"}']
    # The scripted prose is neither: the mask leaves the schema's answer or a
    # call, and the fake model picks among what is allowed at random.
    for _ in range(4):
        held = client.chat.completions.create(messages=_ask("just chat"), **request).choices[0]
        if held.finish_reason == "tool_calls":
            calls = held.message.tool_calls or []
            assert calls and all(
                json.loads(c.function.arguments)["city"] in ("Paris", "Oslo") for c in calls
            ), held
        else:
            assert held.finish_reason == "stop", held
            assert json.loads(held.message.content or "")["answer"] in ("yes", "no"), held
    streamed = _streamed_chat(client, messages=_ask("weather in Paris"), **request)
    assert [c["arguments"] for c in streamed["calls"]] == ['{"city": "Paris"}']


def test_a_required_call_cut_by_the_output_limit_still_fails(smollm2: Server) -> None:
    client = _openai(smollm2)
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": _ask("just chat"),
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 3,
    }
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(**request)
    assert raised.value.status_code == 422
    assert raised.value.body["code"] == "tool_choice_unmet"
    with pytest.raises(openai.APIError) as streamed:
        _streamed_chat(client, **request)
    assert "tool_choice" in str(streamed.value)


@pytest.mark.parametrize("stream", [False, True])
def test_without_masks_required_calls_are_validated_and_schemas_refused(
    tmp_path: Path, stream: bool
) -> None:
    # As flare run serves today: the sampling takes no grammar mask.
    server = scripted_server("smollm2", SCRIPT, tmp_path, "--no-masks")
    try:
        client = _openai(server)
        request: dict[str, Any] = {
            "model": MODEL,
            "messages": _ask("just chat"),
            "tools": [WEATHER],
            "tool_choice": "required",
        }
        if stream:
            # After the headers, the unmet requirement is an error event.
            with pytest.raises(openai.APIError) as raised:
                _streamed_chat(client, **request)
            assert "tool_choice" in str(raised.value)
        else:
            with pytest.raises(openai.APIStatusError) as status:
                client.chat.completions.create(**request)
            assert status.value.status_code == 422
            assert status.value.body["code"] == "tool_choice_unmet"
        met = client.chat.completions.create(**{**request, "messages": _ask("weather in Paris")})
        assert (met.choices[0].message.tool_calls or [])[0].function.name == "get_weather"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=MODEL, messages=_ask("just chat"), response_format={"type": "json_object"}
            )
    finally:
        assert server.stop() == 0


def _custom_calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "custom_tool_call"]


def test_custom_tools_take_grammar_constrained_raw_input_streamed_or_not(
    smollm2: Server,
) -> None:
    # Codex's custom tools: the input is raw text in the tool's grammar, written by
    # the model as a JSON string (SmolLM2's call format) and given back decoded.
    client = _openai(smollm2)
    choices: list[Any] = ["required", "auto", {"type": "custom", "name": "apply_patch"}]
    for choice in choices:
        request = {
            "model": MODEL,
            "input": "patch please",
            "tools": [APPLY_PATCH, FLAT_WEATHER],
            "tool_choice": choice,
        }
        whole = client.responses.create(**request)
        assert whole.status == "completed", whole
        (call,) = _custom_calls(whole)
        assert (call.name, call.input) == ("apply_patch", PATCH), call
        assert call.call_id.startswith("call_")
        assert whole.tools[0].type == "custom"
        if isinstance(choice, dict):
            assert whole.tool_choice.type == "custom", whole.tool_choice
        events = list(client.responses.create(stream=True, **request))
        assert [event.sequence_number for event in events] == list(range(len(events)))
        deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        (done,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert "".join(deltas) == done.input == PATCH
        assert len(deltas) > 1, deltas
        (item,) = [e.item for e in events if e.type == "response.output_item.done"]
        assert item.type == "custom_tool_call" and item.input == PATCH
        assert not [e for e in events if "function_call" in e.type]
    # The scripted model answers "maybe": the regex leaves it yes or no.
    for _ in range(3):
        held = client.responses.create(
            model=MODEL, input="yes or no", tools=[DECIDE], tool_choice="required"
        )
        (call,) = _custom_calls(held)
        assert call.input in ("yes", "no"), call


def test_a_custom_tool_call_and_its_output_continue_the_conversation(smollm2: Server) -> None:
    client = _openai(smollm2)
    tools = [APPLY_PATCH]
    first = client.responses.create(model=MODEL, input="patch please", tools=tools)
    (call,) = _custom_calls(first)
    output = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "sunny"}
    second = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[output], tools=tools
    )
    assert second.output_text == "It is sunny in Paris."
    replayed = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "patch please"},
            call.model_dump(exclude_none=True),
            output,
        ],
        tools=tools,
        store=False,
    )
    assert second.usage is not None and replayed.usage is not None
    assert replayed.usage.input_tokens == second.usage.input_tokens


def test_bad_custom_tools_are_typed_errors(smollm2: Server) -> None:
    client = _openai(smollm2)
    unknown = {**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}
    nested = {
        **APPLY_PATCH,
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: %json {}"},
    }
    broken = {**DECIDE, "format": {"type": "grammar", "syntax": "regex", "definition": "("}}
    for tool, code in (
        (unknown, "invalid_parameter"),
        (nested, "invalid_grammar"),
        (broken, "invalid_grammar"),
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            client.responses.create(model=MODEL, input="patch please", tools=[tool])
        assert raised.value.body["code"] == code, raised.value.body
        assert raised.value.body["param"] == "tools", raised.value.body
