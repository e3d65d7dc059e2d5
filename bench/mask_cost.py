"""What a token mask costs the captured sampler: the compiled ``sample_padded`` at a
served vocabulary and the sampler's row count, captured as a CUDA graph as the
decode graphs capture it, timed per replay (CUDA events around batches of replays)
in three forms: without the mask input (as cores before token masks sampled), with
the mask input and every row unflagged (unconstrained requests on a core with
masks), and with every row masked. The difference between the first two is what
token masks add to every unconstrained decode step.

    python bench/mask_cost.py --out F.json [--vocab 49152] [--rows 4] [--replays 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from ignition.components import sampling
from ignition.components.token_state import RequestState
from ignition.preparation.steps import SamplingOps
from ignition.replay.packing import token_mask

BATCH = 20


def timed(run: Any, replays: int) -> dict[str, float]:
    """Per-replay milliseconds of ``run`` captured as a graph: median and p99 of
    batches of ``BATCH`` replays."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    per_replay = []
    for _ in range(max(1, replays // BATCH)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BATCH):
            graph.replay()
        end.record()
        end.synchronize()
        per_replay.append(start.elapsed_time(end) / BATCH)
    ordered = sorted(per_replay)
    return {
        "median_ms": statistics.median(per_replay),
        "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--replays", type=int, default=2000)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows, vocab = args.rows, args.vocab
    state = RequestState.allocate(rows + 1, vocab, 1, 1, torch.float32, device)
    state.top_p.fill_(0.95)
    state.top_k.fill_(50)
    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(rows, vocab, generator=gen)).to(device)
    slots = torch.arange(1, rows + 1, device=device)
    allowed = torch.randint(0, vocab, (64,), generator=gen).tolist()
    words = torch.stack([token_mask(allowed, vocab)] * rows).to(device)
    unflagged = torch.zeros(rows, dtype=torch.int32, device=device)
    flagged = torch.ones(rows, dtype=torch.int32, device=device)
    sample = SamplingOps.compiled().sample
    out = torch.zeros(rows, dtype=torch.int64, device=device)
    forms = {
        "no_mask_input": None,
        "mask_input_unflagged": (words, unflagged),
        "every_row_masked": (words, flagged),
    }
    result: dict[str, Any] = {"vocab": vocab, "rows": rows, "replays": args.replays}
    for name, masks in forms.items():

        def run(masks: sampling.RowMasks | None = masks) -> None:
            out.copy_(sampling.sample_rows(logits, state, slots, rows, sample, masks))

        result[name] = timed(run, args.replays)
    free = result["no_mask_input"]["median_ms"]
    result["unflagged_added_ms"] = result["mask_input_unflagged"]["median_ms"] - free
    result["masked_added_ms"] = result["every_row_masked"]["median_ms"] - free
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
