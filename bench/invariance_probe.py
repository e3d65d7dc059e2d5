"""Packing-invariance probe on a random-weight SmolLM2-geometry model (no download).

Writes a random LlamaForCausalLM with SmolLM2-135M's geometry, prepares it, and runs
50 requests (the token lengths of bench/prompts/agent50.jsonl, random tokens) in
order, again, reversed and interleaved; reports which requests' tokens differ and
where. Random weights give flat distributions, so sampling boundaries are crossed
often: a good net for arithmetic that depends on batch packing.

    python3 bench/invariance_probe.py --out OUT [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from checkpoints import _tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from ignition.preparation.prepared import PrepareOptions, prepare  # noqa: E402
from ignition.replay.harness import Harness, Request, SamplingParams  # noqa: E402

LENGTHS = [37, 36, 38, 40, 38, 38, 43, 40, 36, 41, 41, 38, 36, 38, 35, 41, 40, 35, 38, 37]
LENGTHS += [38, 41, 34, 43, 40, 39, 39, 41, 34, 37, 38, 39, 37, 39, 38, 137, 136, 139, 137, 125]
LENGTHS += [1520, 1949, 2299, 2808, 3368, 3906, 4392, 4914, 5617, 6218]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/flare-probe"))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    path = args.work / "random-smollm2"
    LlamaForCausalLM(config).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    t0 = time.perf_counter()
    prepared = prepare(path, PrepareOptions(compile=not args.no_compile))
    prepare_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)
    requests = [
        Request(i, torch.randint(3, 49152, (n,), generator=gen).tolist(), 64, sampling, 1000 + i)
        for i, n in enumerate(LENGTHS)
    ]

    def run(order: list[Request]) -> dict[int, list[int]]:
        prepared.reset()
        return {r.id: r.tokens for r in Harness(prepared).run(order)}

    first = run(requests)
    report: dict[str, object] = {"compile": not args.no_compile, "prepare_s": prepare_s}
    for name, order in (
        ("second", requests),
        ("reversed", list(reversed(requests))),
        ("interleaved", requests[1::2] + requests[::2]),
    ):
        tokens = run(order)
        report[name] = {
            i: next((j for j, (a, b) in enumerate(zip(t, first[i], strict=False)) if a != b), -1)
            for i, t in tokens.items()
            if t != first[i]
        }
        print(name, report[name], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "invariance-probe.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
