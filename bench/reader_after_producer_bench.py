"""Whether a decode projection reads slower right after a projection that fills the
device, and which tile width avoids it (H200).

Under ``--decode-fusion norms`` the Qwen3-8B's qkv projection, at 32 columns as it
was served then, took 19.9 us of busy time right after the down projection, against
15.5 us after the one-program norm kernel unfused
(``bench/results/issue23/2026-12-05b-h200-head``). The guess: the down projection's
128 programs take one SM each with 192 KB of shared memory, so the qkv's 192
programs (two fit an SM) take SMs as those leave, two at a time on the first freed,
where after the small norm kernel they find every SM free and spread one a SM
first. This times the reader in both places, launched programmatically as
serving launches them, at each tile width (every width gives the same bits):

- ``after-producer``: the down projection (its residual epilogue and partial
  squares), then the qkv projection scaled by the row's statistic from those squares;
- ``after-small``: the down projection, a one-program kernel, then the qkv projection
  (the unfused layer's order, the norm kernel's place);

each against the same graph without the reader, whose difference is the reader's
time in place (medians and p99 of the replays, in blocks). The weights rotate over
copies larger than L2, as a step's layers do.

And each at every pipeline budget of ``--pipeline-bytes`` (``linear.PIPELINE_BYTES``,
the shared memory a projection's K loop may take; 192 KiB, today's, fits one
program an SM): at 96 KiB two programs fit an SM, so the reader's programs can take
SMs beside the producer's last ones and launch under its tail. The graphs' totals
say what the pair costs at each budget (``pair_us``: producer and reader, a pair).

On the H200 at 192 KiB the qkv read in 15.2 us after the down projection at 64
columns (96 programs, one an SM) against 19.9 at 32 and 22.0 at 16, and in 14.4
after the one-program kernel; at 96 KiB 32 columns read in 15.3 us after the down
projection, but the pair took 45.5 us against 44.1 at 192 KiB and 64 columns
(``bench/results/issue23/2026-12-05e-h200-waves/``), so a row tile's width now
follows its waves' fill (``linear.tile_shape``), 64 for this qkv.

    python -m bench.reader_after_producer_bench --out OUT.json   (PYTHONPATH: the repository)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench.cuda_timing import blocks_us, capture, cold_copies, run_measurement
from ignition.components import linear
from ignition.components.programmatic_launch import (
    await_producer,
    kernel_options,
    programmatic_launch,
)

# (reader, N, K, producer's N, producer's K): the 8B's qkv after its down projection,
# and its gate/up after its o projection.
PAIRS = (
    ("8b-qkv", 6144, 4096, 4096, 12288),
    ("8b-gate-up", 24576, 4096, 4096, 4096),
)

# Where the graphs run (the smoke run on the CPU, under the interpreter, sets "cpu").
DEVICE = "cuda"


@triton.jit
def _small_kernel(x_ptr, PDL: tl.constexpr = False):
    """One program touching one value: the unfused norm kernel's place in the chain."""
    if PDL:
        await_producer()
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


def _pair_graphs(
    name: str, n: int, k: int, producer_n: int, producer_k: int, widths: tuple[int, ...]
) -> tuple[dict[str, object], int, list[torch.Tensor]]:
    """The graphs of one pair, each holding ``copies`` producer-reader pairs over
    different weight copies; ``copies``; and the tensors they read and write, which
    the caller keeps while it replays them (a graph holds only their addresses). A
    reader's key is its place and its tile width ("default" for the gated kernel,
    whose tile is not chosen here; "none": no reader)."""
    device = torch.device(DEVICE)

    def weights(rows: int, cols: int) -> list[torch.Tensor]:
        w = torch.randn(rows, cols, device=device, dtype=torch.bfloat16) / cols**0.5
        return [w] + [w.clone() for _ in range(cold_copies(w.numel() * w.element_size()) - 1)]

    readers, producers = weights(n, k), weights(producer_n, producer_k)
    copies = min(len(readers), len(producers))
    act = torch.randn(1, producer_k, device=device, dtype=torch.bfloat16)
    residual = torch.randn(1, producer_n, device=device, dtype=torch.bfloat16)
    squares = torch.empty(1, producer_n // linear.SQUARE_GROUP, device=device)
    cell = torch.zeros(1, device=device)
    gated = name.endswith("gate-up")

    def produce(i: int) -> torch.Tensor:
        return linear.triton_rows_linear(
            act, producers[i], None, residual=residual, squares=squares
        )

    def read(h: torch.Tensor, i: int, width: int | None) -> None:
        norm = linear.RowStatistic(squares, 1e-6)
        if gated:
            linear.triton_rows_gated(h, readers[i], norm)
        else:
            linear.triton_rows_linear(h, readers[i], None, width=width, norm=norm)

    def small() -> None:
        _small_kernel[(1,)](cell, num_warps=1, **kernel_options(device))

    def chain(with_small: bool, reads: bool, width: int | None) -> None:
        with programmatic_launch(True):
            for i in range(copies):
                h = produce(i)
                if with_small:
                    small()
                if reads:
                    read(h, i, width)

    tiles: dict[str, int | None] = {"default": None} if gated else {str(w): w for w in widths}
    graphs: dict[str, object] = {}
    for with_small in (False, True):
        place = "after-small" if with_small else "after-producer"
        graphs[f"{place}/none"] = capture(lambda s=with_small: chain(s, False, None))
        for label, width in tiles.items():
            graphs[f"{place}/{label}"] = capture(lambda s=with_small, w=width: chain(s, True, w))
    return graphs, copies, [*readers, *producers, act, residual, squares, cell]


def measure(args: argparse.Namespace) -> dict:
    results = []
    default_budget = linear.PIPELINE_BYTES
    for name, n, k, producer_n, producer_k in PAIRS:
        graphs: dict[str, object] = {}
        operands: list[torch.Tensor] = []  # alive while the graphs replay
        copies = 0
        try:
            for budget in args.pipeline_bytes:
                # The tile and stages are chosen at launch, so at capture.
                linear.PIPELINE_BYTES = budget
                pair, copies, used = _pair_graphs(
                    name, n, k, producer_n, producer_k, tuple(args.widths)
                )
                operands += used
                graphs.update({f"{budget >> 10}KiB/{key}": g for key, g in pair.items()})
        finally:
            linear.PIPELINE_BYTES = default_budget
        timed = blocks_us(graphs, args.replays, args.blocks)
        reader_us, pair_us = {}, {}
        for key, value in timed.items():
            budget, place, width = key.split("/")
            pair_us[key] = value["median_us"] / copies
            if width == "none":
                continue
            base = timed[f"{budget}/{place}/none"]["median_us"]
            reader_us[key] = (value["median_us"] - base) / copies
        for key, us in sorted(reader_us.items()):
            print(f"{name} {key}: {us:.2f} us a reader, {pair_us[key]:.2f} a pair", flush=True)
        results.append(
            {
                "reader": name,
                "n": n,
                "k": k,
                "copies": copies,
                "graphs": timed,
                "reader_us": reader_us,
                "pair_us": pair_us,
            }
        )
    return {
        "device": torch.cuda.get_device_name(),
        "replays": args.replays,
        "blocks": args.blocks,
        "pairs": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=list(linear.BLOCK_NS))
    parser.add_argument(
        "--pipeline-bytes", type=int, nargs="+", default=[linear.PIPELINE_BYTES, 96 << 10]
    )
    return run_measurement(parser, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
