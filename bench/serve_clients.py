"""Clients against a running `flare run` server: the acceptance checks of serving.

1. The OpenAI client streams one chat completion.
2. The prompts of a JSONL file (``{"messages": [...]}`` per line) are sent at each
   concurrency, request ``i`` with seed ``seed + i``, and every output is compared
   with the Python replay harness's (``ignition replay --out``, same prompts, seeds
   and sampling): batch packing must not change a request's tokens.
3. A raw SSE client disconnects mid-stream; the server's metrics must show the
   request cancelled and its slot and pages free (pages the prefix cache holds
   stay used).

With ``--sdks``, the first prompt under the run's temperature, top-p and ``--seed``
also goes through every stock client and route, streamed and not (chat, Responses,
Anthropic Messages, the OpenAI Agents SDK; ``bench/sdk_agreement.py``): every answer
must be chat's.

With ``--prefix-check`` (a server with the prefix cache), step 2 becomes: each prompt
is sent twice with the same seed, and the repeat must restore the whole prompt
(usage reports every prompt token cached) and answer exactly as the first request
did; then the conversation continues with that answer and a new user turn, which
must restore at least the first prompt.

    python3 bench/serve_clients.py --url http://127.0.0.1:8080 --prompts P.jsonl \\
        (--python python.json | --prefix-check) --out serve.json [--concurrency 1 2 4] \\
        [--sdks]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai


def _metrics(host: str, port: int) -> dict[str, float]:
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    values = {}
    for line in data.split(b"\r\n\r\n", 1)[1].decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            values[name] = float(value)
    return values


def stream_one(client: openai.OpenAI, model: str) -> dict[str, Any]:
    started = time.perf_counter()
    first = None
    text = ""
    finish = None
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=48,
        temperature=0.7,
        seed=1,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                first = first or time.perf_counter()
                text += choice.delta.content
            finish = choice.finish_reason or finish
    return {
        "text": text,
        "finish_reason": finish,
        "ttft_ms": None if first is None else (first - started) * 1e3,
        "total_ms": (time.perf_counter() - started) * 1e3,
    }


def run_prompts(
    client: openai.OpenAI,
    model: str,
    prompts: list[dict[str, Any]],
    sampling: dict[str, Any],
    concurrency: int,
) -> list[dict[str, Any]]:
    def one(index: int) -> dict[str, Any]:
        started = time.perf_counter()
        response = client.chat.completions.create(
            model=model,
            messages=prompts[index]["messages"],
            max_tokens=sampling["max_tokens"],
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            seed=sampling["seed"] + index,
            extra_body={"top_k": sampling["top_k"], "min_p": sampling["min_p"]},
        )
        choice = response.choices[0]
        return {
            "index": index,
            "text": choice.message.content,
            "finish_reason": choice.finish_reason,
            "completion_tokens": response.usage.completion_tokens if response.usage else None,
            "latency_ms": (time.perf_counter() - started) * 1e3,
        }

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


def prefix_check(
    client: openai.OpenAI, model: str, prompts: list[dict[str, Any]], sampling: dict[str, Any]
) -> dict[str, Any]:
    """Cold request, its whole-prompt hit, and the next turn, for every prompt."""

    def ask(messages: list[dict[str, Any]], seed: int) -> tuple[str, int, int, float]:
        started = time.perf_counter()
        response = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=sampling["max_tokens"],
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            seed=seed,
            extra_body={"top_k": sampling["top_k"], "min_p": sampling["min_p"]},
        )
        usage = response.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        elapsed = (time.perf_counter() - started) * 1e3
        return response.choices[0].message.content or "", usage.prompt_tokens, cached, elapsed

    cases = []
    for index, prompt in enumerate(prompts):
        seed = sampling["seed"] + index
        messages = prompt["messages"]
        cold, tokens, cold_cached, cold_ms = ask(messages, seed)
        hit, _, hit_cached, hit_ms = ask(messages, seed)
        turn = [
            *messages,
            {"role": "assistant", "content": cold},
            {"role": "user", "content": "Thanks. Now say it in one sentence."},
        ]
        _, turn_tokens, turn_cached, turn_ms = ask(turn, seed + 7)
        cases.append(
            {
                "index": index,
                "prompt_tokens": tokens,
                "cold_cached": cold_cached,
                "hit_cached": hit_cached,
                "hit_equal": hit == cold,
                "next_turn_tokens": turn_tokens,
                "next_turn_cached": turn_cached,
                "ms": {"cold": cold_ms, "hit": hit_ms, "next_turn": turn_ms},
            }
        )
    whole = [c["index"] for c in cases if c["hit_cached"] != c["prompt_tokens"]]
    unequal = [c["index"] for c in cases if not c["hit_equal"]]
    short = [c["index"] for c in cases if c["next_turn_cached"] < c["prompt_tokens"]]
    return {
        "requests": len(cases),
        "hits_not_whole": whole,
        "hits_not_equal": unequal,
        "next_turns_short": short,
        "median_ms": {
            key: statistics.median(c["ms"][key] for c in cases)
            for key in ("cold", "hit", "next_turn")
        },
        "cases": cases,
    }


def disconnect(host: str, port: int, model: str) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 2000,
            "temperature": 1.0,
            "stream": True,
        }
    ).encode()
    before = _metrics(host, port)
    conn = socket.create_connection((host, port), timeout=30)
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    received = b""
    while received.count(b"data:") < 3:
        chunk = conn.recv(4096)
        if not chunk:
            break
        received += chunk
    during = _metrics(host, port)
    conn.close()

    def freed(values: dict[str, float]) -> bool:
        # Every page left in use is one the prefix cache holds.
        return values["flare_running_requests"] == 0 and values["flare_pages_used"] == values.get(
            "flare_prefix_pages_held", 0
        )

    # Until the cancellation is counted and its pages are back: the scheduler
    # releases a cancelled request's pages once its last launch is retrieved, which
    # may come after the running gauge fell (a 30 s bound: a leak still fails).
    deadline = time.monotonic() + 30
    after = _metrics(host, port)
    while time.monotonic() < deadline:
        after = _metrics(host, port)
        cancelled = (
            after["flare_requests_cancelled_total"] - before["flare_requests_cancelled_total"]
        )
        if cancelled >= 1 and freed(after):
            break
        time.sleep(0.05)
    keys = (
        "flare_running_requests",
        "flare_pages_used",
        "flare_prefix_pages_held",
        "flare_requests_cancelled_total",
        "flare_requests_finished_length_total",
    )
    return {
        "frames_before_disconnect": received.count(b"data:"),
        "during": {k: during[k] for k in keys if k in during},
        "after": {k: after[k] for k in keys if k in after},
        "cancelled": after["flare_requests_cancelled_total"]
        - before["flare_requests_cancelled_total"]
        == 1,
        "freed": freed(after),
    }


def main() -> None:
    """Runs the checks, writes the report, and exits 1 when one failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    check = parser.add_mutually_exclusive_group(required=True)
    check.add_argument("--python", type=Path, help="ignition replay --out, to compare with")
    check.add_argument(
        "--prefix-check", action="store_true", help="repeat each prompt: it must hit exactly"
    )
    parser.add_argument(
        "--sampling", type=json.loads, help="with --prefix-check: temperature, top_k, ..."
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--sdks", action="store_true", help="the first prompt through every client and route"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=1000, help="the harness's --seed")
    parser.add_argument("--max-tokens", type=int, default=64, help="the harness's --max-new-tokens")
    args = parser.parse_args()

    url = urlparse(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line]
    if args.python is not None:
        python = json.loads(args.python.read_text())
        reference = [r["text"] for r in python["results"]]
        s = python["sampling"]
    else:
        reference = []
        s = args.sampling or {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.0}
    sampling = {
        "temperature": s["temperature"],
        "top_k": s["top_k"],
        "top_p": s["top_p"],
        "min_p": s["min_p"],
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    report: dict[str, Any] = {"model": model, "streamed": stream_one(client, model), "runs": {}}
    print("streamed:", json.dumps(report["streamed"]))
    if args.sdks:
        from sdk_agreement import sdk_agreement

        report["sdks"] = sdk_agreement(args.url, model, prompts[0]["messages"], sampling)
        print("sdks:", json.dumps({k: v for k, v in report["sdks"].items() if k != "answers"}))
    if args.prefix_check:
        report["prefix"] = prefix_check(client, model, prompts, sampling)
        summary = {k: v for k, v in report["prefix"].items() if k != "cases"}
        print("prefix:", json.dumps(summary))
    for concurrency in args.concurrency if args.python is not None else []:
        started = time.perf_counter()
        results = run_prompts(client, model, prompts, sampling, concurrency)
        wall = time.perf_counter() - started
        mismatches = [r["index"] for r in results if r["text"] != reference[r["index"]]]
        latencies = sorted(r["latency_ms"] for r in results)
        report["runs"][str(concurrency)] = {
            "completed": sum(r["finish_reason"] in ("stop", "length") for r in results),
            "requests": len(results),
            "match_python": len(results) - len(mismatches),
            "mismatches": mismatches,
            "wall_s": wall,
            "latency_ms_median": statistics.median(latencies),
            "latency_ms_p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "results": results,
        }
        print(
            f"concurrency {concurrency}: {report['runs'][str(concurrency)]['completed']}/"
            f"{len(results)} complete, {len(results) - len(mismatches)} match Python, "
            f"wall {wall:.2f} s"
        )
    report["disconnect"] = disconnect(host, port, model)
    print("disconnect:", json.dumps(report["disconnect"]))
    report["metrics"] = _metrics(host, port)
    failed = [f"concurrency {c}" for c, run in report["runs"].items() if run["mismatches"]]
    if not (report["disconnect"]["cancelled"] and report["disconnect"]["freed"]):
        failed.append("disconnect")
    if "sdks" in report and not report["sdks"]["agree"]:
        failed.append("sdks")
    prefix = report.get("prefix")
    if prefix and (
        prefix["hits_not_whole"] or prefix["hits_not_equal"] or prefix["next_turns_short"]
    ):
        failed.append("prefix")
    report["failed"] = failed
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    if failed:
        print("FAILED:", ", ".join(failed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
