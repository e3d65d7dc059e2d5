"""Constrained decoding against a served model through the stock SDKs: every
``json_schema`` answer (chat, streamed and not; Responses ``text.format``) must
validate against its schema, and every ``tool_choice`` required or named answer
(chat, Anthropic ``any``/``tool``, Responses), streamed or not, must be a completed
call whose arguments validate against the tool's schema; a Responses custom tool's
input (a Lark patch grammar, a regex) must be in its language. Then inter-token latency of
streamed chats, unconstrained and under a JSON schema, at each concurrency: each
request's mean gap between content chunks as the SDK's user sees it (median and p99
over requests), and the server's own inter-token latency from its metrics.

    python bench/constrained_session.py --url http://127.0.0.1:8080 --model NAME \\
        --out F.json [--concurrency 1 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
from tool_prefix_reuse import WEATHER

TOOL = WEATHER["function"]
ASK = [{"role": "user", "content": "Is Paris in France? Answer briefly."}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
YES_NO = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
STORY = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}
STORY_ASK = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
# Custom tools as Codex sends them: raw input in a Lark grammar or a regex.
PATCH_GRAMMAR = """start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
%import common.LF
"""
# The same language as a regex, to judge the input by.
PATCH_LANGUAGE = re.compile(
    r"\*\*\* Begin Patch\n(\*\*\* Add File: .+\n(\+.*\n)+|\*\*\* Delete File: .+\n)+"
    r"\*\*\* End Patch\n?"
)
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files: a patch that adds or deletes files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
DECIDE = {
    "type": "custom",
    "name": "decide",
    "description": "Answer yes or no.",
    "format": {"type": "grammar", "syntax": "regex", "definition": "^(yes|no)$"},
}
CUSTOM_ASKS = {
    "apply_patch": ("Create a file hello.txt that says hello.", PATCH_LANGUAGE),
    "decide": ("Is Paris in France?", re.compile("yes|no")),
}


def violations(value: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema`` (the subset these checks use: type, enum,
    properties, required, additionalProperties, items)."""
    types = {"object": dict, "string": str, "array": list, "boolean": bool}
    found: list[str] = []
    kind = schema.get("type")
    if kind == "integer" and not (isinstance(value, int) and not isinstance(value, bool)):
        return [f"{at}: not an integer"]
    if kind in types and not isinstance(value, types[kind]):
        return [f"{at}: not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{at}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        found += [f"{at}.{k}: missing" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key in properties:
                found += violations(item, properties[key], f"{at}.{key}")
            elif schema.get("additionalProperties") is False:
                found.append(f"{at}.{key}: not allowed")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += violations(item, schema["items"], f"{at}[{i}]")
    return found


def judged(text: str, schema: dict[str, Any], finish: Any) -> dict[str, Any]:
    """Whether ``text`` is JSON valid against ``schema``, ended by ``finish``."""
    try:
        problems = violations(json.loads(text), schema)
    except json.JSONDecodeError as error:
        problems = [f"not JSON: {error}"]
    return {"ok": not problems, "problems": problems, "finish": finish, "text": text}


CUT = ("length", "max_tokens", "incomplete")


def calls_judged(calls: list[tuple[str, str | dict[str, Any]]], finish: Any) -> dict[str, Any]:
    """Whether every call is to the tool with arguments valid against its schema. An
    answer the output limit ended (``finish`` in ``CUT``) after completed calls may
    end inside one more, which is left out: a call cut off is not a call."""
    cut = finish in CUT and len(calls) > 1
    judged_calls = calls[:-1] if cut else calls
    problems = [] if calls else ["no call"]
    for name, arguments in judged_calls:
        if name != TOOL["name"]:
            problems.append(f"called {name!r}")
            continue
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else arguments
            problems += violations(value, TOOL["parameters"])
        except json.JSONDecodeError as error:
            problems.append(f"arguments not JSON: {error}")
    return {
        "ok": not problems,
        "problems": problems,
        "finish": finish,
        "calls": calls,
        "last_cut_by_limit": cut,
    }


def streamed_chat(client: openai.OpenAI, **request: Any) -> tuple[str, list[Any], Any]:
    text, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, ["", ""])
                slot[0] += (call.function and call.function.name) or ""
                slot[1] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    return text, [tuple(c) for c in calls.values()], finish


Check = Callable[[], dict[str, Any]]
CALL_TOKENS = 256  # room for a few calls; a call longer than this fails the check
PATCH_TOKENS = 512  # a patch: its header, added lines and its end


def refused(error: Exception) -> dict[str, Any]:
    """A check the server answered with a typed error (before or after headers)."""
    body = getattr(error, "body", None) or str(error)
    return {"ok": False, "problems": [f"{type(error).__name__}: {body}"], "finish": None}


def chat_checks(client: openai.OpenAI, model: str) -> dict[str, Check]:
    schema_format = {"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO}}
    chat = {"model": model, "messages": ASK, "response_format": schema_format, "max_tokens": 64}

    def schema_whole() -> dict[str, Any]:
        whole = client.chat.completions.create(**chat).choices[0]
        return judged(whole.message.content or "", YES_NO, whole.finish_reason)

    def schema_stream() -> dict[str, Any]:
        text, _, finish = streamed_chat(client, **chat)
        return judged(text, YES_NO, finish)

    def text_format() -> dict[str, Any]:
        response = client.responses.create(
            model=model,
            input=ASK[0]["content"],
            text={"format": {"type": "json_schema", "name": "yes_no", "schema": YES_NO}},
            max_output_tokens=64,
        )
        return judged(response.output_text, YES_NO, response.status)

    found: dict[str, Check] = {
        "chat_json_schema": schema_whole,
        "chat_json_schema_stream": schema_stream,
        "responses_text_format": text_format,
    }
    named = {"type": "function", "function": {"name": TOOL["name"]}}
    for label, choice in (("required", "required"), ("named", named)):
        request = {"model": model, "messages": WEATHER_ASK, "tools": [WEATHER]}
        request |= {"tool_choice": choice, "max_tokens": CALL_TOKENS}

        def whole(request: dict[str, Any] = request) -> dict[str, Any]:
            reply = client.chat.completions.create(**request).choices[0]
            calls = reply.message.tool_calls or []
            pairs = [(c.function.name, c.function.arguments) for c in calls]
            return calls_judged(pairs, reply.finish_reason)

        def stream(request: dict[str, Any] = request) -> dict[str, Any]:
            _, calls, finish = streamed_chat(client, **request)
            return calls_judged(calls, finish)

        found[f"chat_{label}"] = whole
        found[f"chat_{label}_stream"] = stream
    for streamed in (False, True):
        request = {
            "model": model,
            "input": WEATHER_ASK[0]["content"],
            "tools": [{"type": "function", **TOOL}],
            "tool_choice": "required",
            "max_output_tokens": CALL_TOKENS,
        }

        def responses(request: dict[str, Any] = request, streamed: bool = streamed) -> Any:
            if streamed:
                response = list(client.responses.create(stream=True, **request))[-1].response
            else:
                response = client.responses.create(**request)
            calls = [(i.name, i.arguments) for i in response.output if i.type == "function_call"]
            return calls_judged(calls, response.status)

        found["responses_required" + ("_stream" if streamed else "")] = responses
    for tool in (APPLY_PATCH, DECIDE):
        for streamed in (False, True):
            name = f"responses_custom_{tool['format']['syntax']}" + ("_stream" if streamed else "")
            found[name] = lambda tool=tool, streamed=streamed: custom_call(
                client, model, tool, streamed
            )
    return found


def custom_call(
    client: openai.OpenAI, model: str, tool: dict[str, Any], streamed: bool
) -> dict[str, Any]:
    """A Responses custom tool forced by name: its one call's input must be in the
    tool's language (streamed: the input deltas must join to the final input)."""
    ask, language = CUSTOM_ASKS[tool["name"]]
    request = {
        "model": model,
        "input": ask,
        "tools": [tool],
        "tool_choice": {"type": "custom", "name": tool["name"]},
        "parallel_tool_calls": False,
        "max_output_tokens": PATCH_TOKENS if tool is APPLY_PATCH else CALL_TOKENS,
    }
    problems = []
    if streamed:
        events = list(client.responses.create(stream=True, **request))
        response = events[-1].response
        deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        done = [e.input for e in events if e.type == "response.custom_tool_call_input.done"]
        if done != ["".join(deltas)]:
            problems.append(f"input deltas {deltas!r} do not make the done input {done!r}")
    else:
        response = client.responses.create(**request)
    if response.status == "failed":
        # An error event in the stream: as a whole response's typed error, with
        # what the call's input held when it stopped.
        failed = refused(RuntimeError(f"response.failed: {response.error}"))
        cut = [item.input for item in response.output if item.type == "custom_tool_call"]
        return failed | {"inputs": cut}
    calls = [item for item in response.output if item.type == "custom_tool_call"]
    inputs = [call.input for call in calls]
    if len(calls) != 1:
        problems.append(f"{len(calls)} custom tool calls")
    problems += [
        f"input {text!r} is not in the grammar" for text in inputs if not language.fullmatch(text)
    ]
    return {"ok": not problems, "problems": problems, "finish": response.status, "inputs": inputs}


def anthropic_checks(claude: anthropic.Anthropic, model: str) -> dict[str, Check]:
    tool = {
        "name": TOOL["name"],
        "description": TOOL["description"],
        "input_schema": TOOL["parameters"],
    }
    found: dict[str, Check] = {}
    forced = {"any": {"type": "any"}, "tool": {"type": "tool", "name": TOOL["name"]}}
    for label, choice in forced.items():
        request = {
            "model": model,
            "max_tokens": CALL_TOKENS,
            "messages": WEATHER_ASK,
            "tools": [tool],
            "tool_choice": choice,
        }

        def whole(request: dict[str, Any] = request) -> dict[str, Any]:
            message = claude.messages.create(**request)
            uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
            return calls_judged(uses, message.stop_reason)

        def stream(request: dict[str, Any] = request) -> dict[str, Any]:
            with claude.messages.stream(**request) as events:
                message = events.get_final_message()
            uses = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
            return calls_judged(uses, message.stop_reason)

        found[f"anthropic_{label}"] = whole
        found[f"anthropic_{label}_stream"] = stream
    return found


def checks(client: openai.OpenAI, claude: anthropic.Anthropic, model: str) -> dict[str, Any]:
    """Every check, each judged alone: a typed error fails only its check."""
    out: dict[str, Any] = {}
    for name, check in (chat_checks(client, model) | anthropic_checks(claude, model)).items():
        try:
            out[name] = check()
        except (openai.APIError, anthropic.APIError) as error:
            out[name] = refused(error)
    return out


def timed_stream(client: openai.OpenAI, request: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat's content chunks: their arrival times, text and finish."""
    started = time.perf_counter()
    times, text, finish = [], "", None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            if choice.delta.content:
                times.append(time.perf_counter() - started)
                text += choice.delta.content
            finish = choice.finish_reason or finish
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {"gaps_ms": [1e3 * g for g in gaps], "text": text, "finish": finish}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def served_metrics(url: str) -> dict[str, float]:
    """The server's ``/metrics`` samples: name (histogram buckets with their label)
    -> value."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    pairs = (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, value in pairs}


def served_itl(url: str) -> tuple[float, float]:
    """The server's inter-token latency histogram: (sum in seconds, count)."""
    values = served_metrics(url)
    name = "flare_inter_token_latency_seconds"
    return values[f"{name}_sum"], values[f"{name}_count"]


def served_masks(url: str) -> dict[str, Any]:
    """The server's grammar mask histogram (one constrained request's next-token
    mask, on the model thread): count, mean, and the bucket bounds holding the
    median and the 99th percentile."""
    values = served_metrics(url)
    name = "flare_grammar_mask_seconds"
    buckets = [
        (float(key.split('le="')[1].rstrip('"}')), value)
        for key, value in values.items()
        if key.startswith(f"{name}_bucket")
    ]
    count = values.get(f"{name}_count", 0.0)

    def bound(q: float) -> float | None:
        return next((b for b, cumulative in buckets if cumulative >= q * count), None)

    return {
        "count": count,
        "mean_us": 1e6 * values.get(f"{name}_sum", 0.0) / count if count else None,
        "p50_at_most_us": 1e6 * b if count and (b := bound(0.5)) is not None else None,
        "p99_at_most_us": 1e6 * b if count and (b := bound(0.99)) is not None else None,
    }


MODES = ("unconstrained", "constrained")


def latency(
    client: openai.OpenAI,
    url: str,
    model: str,
    concurrency: int,
    rounds: int,
    only: tuple[str, ...] = MODES,
) -> dict[str, Any]:
    """Per mode: each request's mean inter-token latency (its first to last content
    chunk over the gaps between), their median and p99, the pooled chunk gaps, and
    the server's own mean inter-token latency over the mode's requests (its metrics
    histogram, read before and after each batch: no client scheduling in it)."""
    base = {"model": model, "messages": STORY_ASK, "max_tokens": 128, "temperature": 0.8}
    modes = {
        "unconstrained": base,
        "constrained": {
            **base,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "story", "schema": STORY},
            },
        },
    }
    modes = {mode: request for mode, request in modes.items() if mode in only}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    served = dict.fromkeys(modes, (0.0, 0.0))
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(rounds):  # interleaved, so drift affects both modes alike
            for mode, request in modes.items():
                before = served_itl(url)
                batch = pool.map(timed_stream, [client] * concurrency, [request] * concurrency)
                runs[mode].extend(batch)
                after = served_itl(url)
                total, count = served[mode]
                served[mode] = (total + after[0] - before[0], count + after[1] - before[1])
    summary: dict[str, Any] = {}
    for mode, done in runs.items():
        per_request = [statistics.fmean(run["gaps_ms"]) for run in done if run["gaps_ms"]]
        gaps = [g for run in done for g in run["gaps_ms"]]
        total, count = served[mode]
        summary[mode] = {
            "requests": len(done),
            "request_itl_median_ms": statistics.median(per_request),
            "request_itl_p99_ms": percentile(per_request, 0.99),
            "gaps": len(gaps),
            "gap_median_ms": statistics.median(gaps),
            "gap_p99_ms": percentile(gaps, 0.99),
            "served_itl_mean_ms": 1e3 * total / count if count else None,
            "served_tokens": count,
            "finish": [run["finish"] for run in done],
        }
    if set(MODES) <= set(summary):
        constrained, free = summary["constrained"], summary["unconstrained"]
        for key in ("request_itl_median_ms", "request_itl_p99_ms", "served_itl_mean_ms"):
            if constrained[key] and free[key]:
                summary[f"ratio_{key.removesuffix('_ms')}"] = constrained[key] / free[key]
    # A story the output limit cut is unfinished JSON; every finished one must parse.
    summary["constrained_finished_valid"] = [
        judged(run["text"], STORY, run["finish"])["ok"]
        for run in runs.get("constrained", [])
        if run["finish"] == "stop"
    ]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=args.url, api_key="unused", max_retries=0)
    result: dict[str, Any] = {"checks": checks(client, claude, args.model)}
    for concurrency in args.concurrency:
        row = latency(client, args.url, args.model, concurrency, args.rounds)
        result[f"latency_c{concurrency}"] = row
    result["served_masks"] = served_masks(args.url)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    failed = [name for name, check in result["checks"].items() if not check["ok"]]
    for name, check in result["checks"].items():
        print(name, "ok" if check["ok"] else f"FAILED {check['problems']}", file=sys.stderr)
    print(f"served grammar masks: {result['served_masks']}", file=sys.stderr)
    for concurrency in args.concurrency:
        row = result[f"latency_c{concurrency}"]
        if not all(row["constrained_finished_valid"]):
            failed.append(f"latency_c{concurrency}")
        free, constrained = row["unconstrained"], row["constrained"]
        print(
            f"c={concurrency}: request ITL median unconstrained "
            f"{free['request_itl_median_ms']:.3f} ms, constrained "
            f"{constrained['request_itl_median_ms']:.3f} ms "
            f"(x{row.get('ratio_request_itl_median', float('nan')):.3f}); served mean "
            f"x{row.get('ratio_served_itl_mean', float('nan')):.3f}",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
