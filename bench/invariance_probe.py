"""Packing-invariance probe: which requests' tokens change with batch packing, and
the first step at which their logits differ.

Without --model it writes a random LlamaForCausalLM with SmolLM2-135M's geometry
(no download) and uses random prompts with the token lengths of the 50-prompt
corpus; random weights give flat distributions, so sampling boundaries are crossed
often. With --model it prepares that checkpoint and uses bench/prompts/agent50.jsonl.
Runs the requests in order, again, reversed and interleaved; for each request
whose tokens or logits differ from the first run it reports the first differing
token, the first step whose logits differ, how much they differ there, and where
that step ran in both runs (graph, capacity, row, slot, pages).

    python3 bench/invariance_probe.py --out OUT [--no-compile] [--model GGUF_OR_DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from checkpoints import _tokenizer  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from ignition.loading.random_weights import GEOMETRIES as RANDOM_GEOMETRIES  # noqa: E402
from ignition.preparation.prepared import PrepareOptions, prepare  # noqa: E402
from ignition.replay.harness import (  # noqa: E402
    Harness,
    Request,
    SamplingParams,
    TracedStep,
)

LENGTHS = [37, 36, 38, 40, 38, 38, 43, 40, 36, 41, 41, 38, 36, 38, 35, 41, 40, 35, 38, 37]
LENGTHS += [38, 41, 34, 43, 40, 39, 39, 41, 34, 37, 38, 39, 37, 39, 38, 137, 136, 139, 137, 125]
LENGTHS += [1520, 1949, 2299, 2808, 3368, 3906, 4392, 4914, 5617, 6218]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/flare-probe"))
    parser.add_argument("--model", type=Path, help="a checkpoint (default: random weights)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.model is not None:
        run_probe(args, args.model, None)
        return
    config = RANDOM_GEOMETRIES["smollm2-135m"]()
    path = args.work / "random-smollm2"
    LlamaForCausalLM(config).save_pretrained(path)
    _tokenizer().save_pretrained(path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (n,), generator=gen).tolist() for n in LENGTHS]
    run_probe(args, path, prompts)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), -1)


def _logits_difference(a: list[TracedStep], b: list[TracedStep]) -> dict[str, object]:
    """The first step whose logits differ, by how much, and where both ran."""
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if not torch.equal(x.logits, y.logits):
            diff = (x.logits - y.logits).abs()
            return {
                "step": j,
                "max_abs_diff": float(diff.max()),
                "differing_logits": int((diff > 0).sum()),
                "steps_differing": sum(
                    not torch.equal(p.logits, q.logits) for p, q in zip(a, b, strict=False)
                ),
                "baseline": x.context(),
                "this_run": y.context(),
                "previous_baseline": a[j - 1].context() if j else None,
                "previous_this_run": b[j - 1].context() if j else None,
            }
    return {"step": -1}


def run_probe(args: argparse.Namespace, path: Path, prompts: list[list[int]] | None) -> None:
    t0 = time.perf_counter()
    prepared = prepare(path, PrepareOptions(compile=not args.no_compile))
    prepare_s = time.perf_counter() - t0
    if prompts is None:
        from ignition.cli import encode_prompt, load_prompts

        corpus = load_prompts(ROOT / "bench/prompts/agent50.jsonl", [])
        prompts = [encode_prompt(prepared.tokenizer, p) for p in corpus]
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)
    requests = [Request(i, p, 64, sampling, 1000 + i) for i, p in enumerate(prompts)]

    def run(order: list[Request]) -> tuple[dict[int, list[int]], dict[int, list[TracedStep]]]:
        prepared.reset()
        harness = Harness(prepared, trace_logits=True)
        tokens = {r.id: r.tokens for r in harness.run(order)}
        assert harness.logit_trace is not None
        return tokens, harness.logit_trace

    first, first_trace = run(requests)
    report: dict[str, object] = {"compile": not args.no_compile, "prepare_s": prepare_s}
    for name, order in (
        ("second", requests),
        ("reversed", list(reversed(requests))),
        ("interleaved", requests[1::2] + requests[::2]),
    ):
        tokens, trace = run(order)
        report[name] = {
            i: {
                "first_token": _first_difference(t, first[i]),
                "first_logits": _logits_difference(first_trace[i], trace[i]),
            }
            for i, t in tokens.items()
            if t != first[i]
            or any(
                not torch.equal(a.logits, b.logits)
                for a, b in zip(first_trace[i], trace[i], strict=False)
            )
        }
        print(name, report[name], flush=True)
    if prepared.storage.cache.kv.is_cuda:
        from gpu_acceptance import decode_invariance

        report["decode_invariance"] = decode_invariance(prepared)
        print("decode_invariance passed:", report["decode_invariance"]["passed"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "invariance-probe.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
