"""The first content delta through the official ``openai`` SDK, as stock clients read
a stream: for chats of about 100 and 4,000 prompt tokens, the time from sending to
the first SSE event and to the first chunk with content, and the gap between them.

Each prompt is new to the server (a distinct opening line, so no prefix checkpoint
serves it): the time to the first content includes its whole prefill. The gap is
what a client waits after the stream opened; a transport stall (Nagle's algorithm
holding the second small write for a delayed ACK) showed there as about 40 ms.

    python bench/first_delta.py --url http://127.0.0.1:8080 --model NAME --out F.json
        [--lengths 100 4000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import openai

LENGTHS = (100, 4000)
REPEATS = 8
GAP_BOUND_MS = 5.0
FILLER = "The quick brown fox jumps over the lazy dog near the river bank. "


def prompt(tokens: int, index: int) -> str:
    """About ``tokens`` tokens for SmolLM2-like tokenizers (a filler sentence is about
    13 of them), opening with a line no other prompt of the run has."""
    return f"Session {index} at {time.time_ns()}.\n" + FILLER * max(1, (tokens - 20) // 13)


def measure(client: openai.OpenAI, model: str, text: str) -> dict[str, float | int]:
    sent = time.perf_counter()
    first_event = first_content = None
    prompt_tokens = 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        seed=7,
    )
    for chunk in stream:
        now = time.perf_counter()
        first_event = first_event or now
        if first_content is None and any(c.delta.content for c in chunk.choices):
            first_content = now
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
    if first_event is None or first_content is None:
        raise RuntimeError("the stream carried no content")
    return {
        "prompt_tokens": prompt_tokens,
        "first_event_ms": (first_event - sent) * 1000,
        "ttft_ms": (first_content - sent) * 1000,
        "gap_ms": (first_content - first_event) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0)
    measure(client, args.model, prompt(100, -1))  # connection and first-use warm-up
    rows, summary, failed = [], {}, False
    for length in args.lengths:
        samples = [measure(client, args.model, prompt(length, i)) for i in range(REPEATS)]
        rows += [{"length": length, **s} for s in samples]
        gaps = sorted(s["gap_ms"] for s in samples)
        summary[str(length)] = {
            "prompt_tokens": statistics.median(s["prompt_tokens"] for s in samples),
            "ttft_ms_median": statistics.median(s["ttft_ms"] for s in samples),
            "gap_ms_median": statistics.median(gaps),
            "gap_ms_max": gaps[-1],
        }
        failed |= statistics.median(gaps) >= GAP_BOUND_MS
    result = {"summary": summary, "rows": rows, "gap_bound_ms": GAP_BOUND_MS}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
