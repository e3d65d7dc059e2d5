"""How often a row-wise float32 cumulative sum of the sampler's shape repeats bit for
bit: Inductor's compiled ``torch.cumsum`` (a split scan with decoupled look-back at
long rows), ATen's, and ``flare::row_cumsum``. Needs a GPU.

    python bench/scan_repeatability.py [--vocab 151936] [--rows 4] [--runs 200]

Prints, per implementation, how many distinct results the runs gave on one input.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from ignition.components.cumulative import row_cumsum


def distinct(fn, x: torch.Tensor, runs: int) -> int:
    seen = set()
    for _ in range(runs):
        y = fn(x)
        torch.cuda.synchronize()
        seen.add(hashlib.sha256(y.cpu().numpy().tobytes()).hexdigest())
    return len(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(args.rows, args.vocab, generator=gen), dim=-1)
    x = torch.sort(probs, dim=-1, descending=True).values.cuda()
    compiled = torch.compile(lambda t: t.cumsum(dim=-1), fullgraph=True, dynamic=False)
    for name, fn in (
        ("inductor cumsum", compiled),
        ("aten cumsum", lambda t: t.cumsum(dim=-1)),
        ("flare::row_cumsum", row_cumsum),
    ):
        print(
            f"{name:18} {args.rows}x{args.vocab}: {distinct(fn, x, args.runs)} distinct "
            f"results in {args.runs} runs",
            flush=True,
        )


if __name__ == "__main__":
    main()
