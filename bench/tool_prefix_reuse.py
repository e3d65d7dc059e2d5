"""Prefix-cache reuse across a multi-turn tool conversation, through the ``openai``
SDK as an agent drives it: each turn sends the whole conversation so far, and the
report lists the prompt tokens and the cached (restored, not prefilled) tokens of
every turn.

Two schedules run on fresh conversations: ``tool_choice`` ``auto`` on every turn,
and ``auto`` alternating with ``none``. ``none`` removes the tools from the prompt,
so the prompt changes where the tools were rendered (a system block near the start)
and the turn after a switch reuses only what precedes them: the report says how much
that costs. A turn whose answer calls a tool gets a tool result next; a text answer
gets the next user question.

    python bench/tool_prefix_reuse.py --url http://127.0.0.1:8080 --model NAME --out F.json
        [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}
QUESTIONS = [
    "What is the weather in Paris?",
    "Thanks. And just chat with me: how are you?",
    "What is the weather in Paris now, again?",
]
SCHEDULES = {"auto": ["auto"], "alternating": ["auto", "none"]}


def run(client: openai.OpenAI, model: str, schedule: list[str], turns: int) -> list[dict[str, Any]]:
    """One conversation of ``turns`` requests; a row per turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a weather assistant (run {time.time_ns()})."},
        {"role": "user", "content": QUESTIONS[0]},
    ]
    rows = []
    asked = 1
    for turn in range(turns):
        choice = schedule[turn % len(schedule)]
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=[WEATHER],
            tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=64,
            seed=7,
        )
        usage = reply.usage
        details = usage.prompt_tokens_details if usage else None
        message = reply.choices[0].message
        calls = message.tool_calls or []
        rows.append(
            {
                "turn": turn,
                "tool_choice": choice,
                "prompt_tokens": usage.prompt_tokens if usage else 0,
                "cached_tokens": (details.cached_tokens or 0) if details else 0,
                "tool_calls": len(calls),
                "finish_reason": reply.choices[0].finish_reason,
            }
        )
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            entry["tool_calls"] = [call.model_dump(exclude_none=True) for call in calls]
        messages.append(entry)
        if calls:
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
        else:
            messages.append({"role": "user", "content": QUESTIONS[asked % len(QUESTIONS)]})
            asked += 1
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per turn: prompt, cached and prefilled tokens; the prefilled total."""
    prefilled = [row["prompt_tokens"] - row["cached_tokens"] for row in rows]
    return {
        "prompt_tokens": [row["prompt_tokens"] for row in rows],
        "cached_tokens": [row["cached_tokens"] for row in rows],
        "prefilled_tokens": prefilled,
        "cached_fraction": [
            round(row["cached_tokens"] / row["prompt_tokens"], 3) if row["prompt_tokens"] else 0.0
            for row in rows
        ],
        "prefilled_total": sum(prefilled),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    result: dict[str, Any] = {"turns": args.turns, "schedules": {}}
    for name, schedule in SCHEDULES.items():
        rows = run(client, args.model, schedule, args.turns)
        result["schedules"][name] = {"rows": rows, "summary": summary(rows)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, entry in result["schedules"].items():
        print(name, json.dumps(entry["summary"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
