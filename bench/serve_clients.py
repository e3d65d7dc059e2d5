"""Clients against a running `flare run` server: the acceptance checks of serving.

1. The OpenAI client streams one chat completion.
2. The prompts of a JSONL file (``{"messages": [...]}`` per line) are sent at each
   concurrency, request ``i`` with seed ``seed + i``, and every output is compared
   with the Python replay harness's (``ignition replay --out``, same prompts, seeds
   and sampling): batch packing must not change a request's tokens.
3. A raw SSE client disconnects mid-stream; the server's metrics must show the
   request cancelled and its slot and pages free.

    python3 bench/serve_clients.py --url http://127.0.0.1:8080 --prompts P.jsonl \\
        --python python.json --out serve.json [--concurrency 1 2 4]
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
    deadline = time.monotonic() + 30
    after = _metrics(host, port)
    while time.monotonic() < deadline:
        after = _metrics(host, port)
        cancelled = (
            after["flare_requests_cancelled_total"] - before["flare_requests_cancelled_total"]
        )
        if cancelled >= 1 and after["flare_running_requests"] == 0:
            break
        time.sleep(0.05)
    keys = (
        "flare_running_requests",
        "flare_pages_used",
        "flare_requests_cancelled_total",
        "flare_requests_finished_length_total",
    )
    return {
        "frames_before_disconnect": received.count(b"data:"),
        "during": {k: during[k] for k in keys},
        "after": {k: after[k] for k in keys},
        "cancelled": after["flare_requests_cancelled_total"]
        - before["flare_requests_cancelled_total"]
        == 1,
        "freed": after["flare_running_requests"] == 0 and after["flare_pages_used"] == 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--python", type=Path, required=True, help="ignition replay --out")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seed", type=int, default=1000, help="the harness's --seed")
    parser.add_argument("--max-tokens", type=int, default=64, help="the harness's --max-new-tokens")
    args = parser.parse_args()

    url = urlparse(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line]
    python = json.loads(args.python.read_text())
    reference = [r["text"] for r in python["results"]]
    s = python["sampling"]
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
    for concurrency in args.concurrency:
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
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
