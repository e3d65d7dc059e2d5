"""An agent session against a served model through the stock SDKs: a Responses API
stream with a function tool (``openai``), and an Anthropic tool conversation
(``anthropic``: when the model calls the tool, its result goes back and the answer
is read). What the model says is its own; the report records the event sequence,
the items and the stop reasons, and fails only on protocol faults: a stream that
does not end in ``response.completed`` or ``response.incomplete``, sequence numbers
out of order, or a conversation that does not finish.

    python bench/agent_session.py --url http://127.0.0.1:8080 --model NAME --out F.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anthropic
import openai
from tool_prefix_reuse import WEATHER

TOOL = WEATHER["function"]
QUESTION = "What is the weather in Paris? Use the get_weather tool."


def responses_stream(client: openai.OpenAI, model: str) -> dict[str, Any]:
    events = list(
        client.responses.create(
            model=model,
            input=QUESTION,
            tools=[{"type": "function", **TOOL}],
            max_output_tokens=128,
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    numbers = [event.sequence_number for event in events]
    final = events[-1]
    ok = (
        kinds[:2] == ["response.created", "response.in_progress"]
        and kinds[-1] in ("response.completed", "response.incomplete")
        and numbers == list(range(len(events)))
    )
    response = final.response.model_dump() if hasattr(final, "response") else None
    return {"ok": ok, "event_types": kinds, "response": response}


def anthropic_conversation(client: anthropic.Anthropic, model: str) -> dict[str, Any]:
    tool = {
        "name": TOOL["name"],
        "description": TOOL["description"],
        "input_schema": TOOL["parameters"],
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    turns = []
    for _ in range(3):
        with client.messages.stream(
            model=model, max_tokens=128, messages=messages, tools=[tool]
        ) as stream:
            message = stream.get_final_message()
        turns.append(message.model_dump())
        uses = [block for block in message.content if block.type == "tool_use"]
        if message.stop_reason != "tool_use" or not uses:
            break
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        results = [
            {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"} for use in uses
        ]
        messages.append({"role": "user", "content": results})
    ok = bool(turns) and turns[-1]["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    return {"ok": ok, "turns": turns}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=args.url, api_key="unused", max_retries=0)
    result = {
        "responses_stream": responses_stream(client, args.model),
        "anthropic_tool_conversation": anthropic_conversation(claude, args.model),
    }
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for name, part in result.items():
        print(name, "ok" if part["ok"] else "FAILED", file=sys.stderr)
    return 0 if all(part["ok"] for part in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
