"""Transformers' own ``generate`` on a random-weight geometry: the baseline of a decode
step, for models whose checkpoint a GPU machine's disk cannot hold as safetensors.

The canonical model is built on the meta device, moved to the GPU empty and filled
with exactly the tensors Ignition prepares: each parameter from the geometry's
generated source through the recipe's own checkpoint views (per-expert projections
into the fused experts, the PLE table's shards), so both engines run the same
weights. Per batch size ``b`` it times greedy ``generate`` of a fixed number of new
tokens after the same prompt, twice as many and as few (``min_new_tokens`` forces the
count), ``--repeats`` times each; the decode step is the difference of the medians
over the extra tokens, so prompt reading cancels out. Transformers picks its own
cache and kernels (fla's, where installed).

    python bench/transformers_decode.py GEOMETRY_DIR --batches 1 4 --out decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def load(geometry_dir: Path, device: str = "cuda") -> Any:
    """The canonical model of ``geometry_dir`` on ``device``, holding the weights
    Ignition prepares from it, bitwise."""
    import torch
    from transformers import AutoModelForCausalLM

    from ignition.loading.random_weights import RandomWeightsCheckpoint
    from recipes.qwen4_exp import checkpoint_views, place_ngram_constants

    source = RandomWeightsCheckpoint(geometry_dir)
    config = source.config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            for stored, view in checkpoint_views(name, param, config):
                view.copy_(source.load(stored))
    # The buffers to_empty left empty, derived from the config as the canonical
    # constructors derive them: rotary frequencies and the n-gram hash constants.
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=config, device=device)
    for layer in model.model.layers:
        ple = getattr(getattr(layer, "ple", None), "ple_embedding", None)
        if ple is not None:
            place_ngram_constants(ple, device)
    return model.eval()


def timed_generate(model: Any, prompt: Any, new_tokens: int) -> float:
    import torch

    torch.cuda.synchronize()
    begin = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    torch.cuda.synchronize()
    assert out.shape[1] == prompt.shape[1] + new_tokens
    return time.perf_counter() - begin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("geometry", type=Path, help="a random-weight geometry directory")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32, help="the shorter run's")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    import torch

    begin = time.perf_counter()
    model = load(args.geometry)
    results: dict[str, Any] = {
        "geometry": str(args.geometry),
        "load_s": time.perf_counter() - begin,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": [args.new_tokens, 2 * args.new_tokens],
        "batches": {},
    }
    vocab = model.config.vocab_size
    for batch in args.batches:
        prompt = (
            torch.arange(batch * args.prompt_tokens, device="cuda").view(batch, -1) * 7 % 1000 + 3
        ) % vocab
        timed_generate(model, prompt, 4)  # warm-up: kernels, autotuning
        short = [timed_generate(model, prompt, args.new_tokens) for _ in range(args.repeats)]
        long = [timed_generate(model, prompt, 2 * args.new_tokens) for _ in range(args.repeats)]
        step = (statistics.median(long) - statistics.median(short)) / args.new_tokens
        results["batches"][str(batch)] = {"short_s": short, "long_s": long, "step_ms": step * 1e3}
        print(f"batch {batch}: {step * 1e3:.2f} ms per decode step", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
