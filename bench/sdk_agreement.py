"""One prompt under one seed through every stock client and route of a running server,
streamed and not: OpenAI chat completions and Responses (the ``openai`` SDK),
Anthropic Messages (the ``anthropic`` SDK) and an OpenAI Agents SDK agent over chat
completions (``Runner.run`` and ``Runner.run_streamed``; over Responses the Agents SDK
raises on an answer the output limit ended, which a random-weight model's always is).
The server renders the same conversation on every route and samples it with the same
seed, so every answer must be chat's, token for token.

The sampling is what every route can state: temperature and top-p, and ``seed`` (an
extension on each route; the Anthropic SDK sends its sampling fields as extra body
fields). Used by ``bench/serve_clients.py --sdks``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai

Answers = dict[str, str]


def disagreements(answers: Answers, reference: str = "chat") -> list[str]:
    """The routes whose answer is not ``reference``'s, in order."""
    expected = answers[reference]
    return [route for route, text in answers.items() if text != expected]


def _split_system(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [m for m in messages if m["role"] != "system"]
    return ("\n".join(system) if system else None), rest


def _openai_answers(
    client: openai.OpenAI, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]
) -> Answers:
    chat = {"model": model, "messages": messages, "max_tokens": sampling["max_tokens"]}
    chat |= {"temperature": sampling["temperature"], "top_p": sampling["top_p"]}
    chat |= {"seed": sampling["seed"]}
    answers = {"chat": client.chat.completions.create(**chat).choices[0].message.content or ""}
    streamed = ""
    for chunk in client.chat.completions.create(stream=True, **chat):
        for choice in chunk.choices:
            streamed += choice.delta.content or ""
    answers["chat_stream"] = streamed
    responses = {"model": model, "input": messages, "max_output_tokens": sampling["max_tokens"]}
    responses |= {"temperature": sampling["temperature"], "top_p": sampling["top_p"]}
    responses |= {"extra_body": {"seed": sampling["seed"]}}
    answers["responses"] = client.responses.create(**responses).output_text
    streamed = ""
    for event in client.responses.create(stream=True, **responses):
        if event.type == "response.output_text.delta":
            streamed += event.delta
    answers["responses_stream"] = streamed
    return answers


def _anthropic_answers(
    url: str, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]
) -> Answers:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    system, turns = _split_system(messages)
    request: dict[str, Any] = {"model": model, "max_tokens": sampling["max_tokens"]}
    request["messages"] = turns
    if system is not None:
        request["system"] = system
    extra = {"temperature": sampling["temperature"], "top_p": sampling["top_p"]}
    extra["seed"] = sampling["seed"]
    whole = client.messages.create(**request, extra_body=extra)
    answers = {"messages": "".join(b.text for b in whole.content if b.type == "text")}
    with client.messages.stream(**request, extra_body=extra) as stream:
        answers["messages_stream"] = "".join(stream.text_stream)
    return answers


def _agents_answers(
    url: str, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]
) -> Answers:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    def agent() -> Agent:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        settings = ModelSettings(
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            max_tokens=sampling["max_tokens"],
            extra_body={"seed": sampling["seed"]},
        )
        return Agent(
            name="check",
            model=OpenAIChatCompletionsModel(model=model, openai_client=client),
            model_settings=settings,
        )

    async def both() -> Answers:
        whole = await Runner.run(agent(), messages, max_turns=1)
        run = Runner.run_streamed(agent(), messages, max_turns=1)
        streamed = ""
        async for event in run.stream_events():
            data = getattr(event, "data", None)
            if event.type == "raw_response_event" and data.type == "response.output_text.delta":
                streamed += data.delta
        return {"agents": str(whole.final_output), "agents_stream": streamed}

    return asyncio.run(both())


def sdk_agreement(
    url: str, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]
) -> dict[str, Any]:
    """Every route's answer to ``messages`` under ``sampling`` (temperature, top_p,
    seed, max_tokens) and the routes that disagree with chat's."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    answers = _openai_answers(client, model, messages, sampling)
    answers |= _anthropic_answers(url, model, messages, sampling)
    answers |= _agents_answers(url, model, messages, sampling)
    differ = disagreements(answers)
    return {"answers": answers, "disagree": differ, "agree": not differ and bool(answers["chat"])}
