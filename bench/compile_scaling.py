"""Preparation time (compile included) of a Qwen3-shaped random-weights model against
its layer count and width: does compiling scale with the graph or with the weights?

    python bench/compile_scaling.py LAYERS HIDDEN [--device cpu|cuda]

Writes the geometry under /tmp, prepares decode at capacity 1 and prefill at 128
(compiled, not captured) and prints the weights and the seconds taken.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import Qwen3Config

from ignition.loading.random_weights import write_random_checkpoint
from ignition.preparation.prepared import PrepareOptions, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layers", type=int)
    parser.add_argument("hidden", type=int, help="a multiple of 64 (head_dim 64)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    heads = args.hidden // 64
    config = Qwen3Config(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    out = write_random_checkpoint(Path(f"/tmp/compile-scaling-{args.layers}-{args.hidden}"), config)
    options = PrepareOptions(
        max_concurrency=1,
        prefill_chunk_size=128,
        context_limit=256,
        kv_pages=16,
        snapshot_rows=2,
        compile=True,
        capture=False,
        device=args.device,
        dtype=torch.bfloat16,
    )
    started = time.perf_counter()
    prepared = prepare(out, options)
    print(
        f"layers {args.layers} hidden {args.hidden}: weights "
        f"{prepared.model.weight_bytes() / 2**20:.0f} MiB, prepare "
        f"{time.perf_counter() - started:.1f} s ({prepared.timings})"
    )


if __name__ == "__main__":
    main()
