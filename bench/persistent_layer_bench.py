"""SmolLM2-135M's decode layers as one persistent kernel each against the per-kernel
chain serving runs today (``--decode-fusion norms``), on the H200.

The chain's layer is six kernels (qkv, attention's split with the rotary write, its
merge, o, gate/up, down), each 2.6 to 4.4 us whatever its bytes
(``bench/results/issue23/2026-12-05b-h200-head``). The persistent kernel
(``ignition.components.persistent_layer``) runs the same tiles with grid barriers
between its phases. Each variant is a CUDA graph of the model's 30 layers (random
weights, its own cache per layer, every row ``--context`` tokens long), launched
programmatically as serving launches, replayed in blocks (medians and p99):

- ``chain``: the six kernels a layer, the chain's tiles (16 columns for qkv, o and
  down: the most programs for the small projections);
- ``chain-wide``: the same with 32-column tiles for qkv, o and down (the default
  before 16-column tiles measured faster here; every width gives the same bits);
- ``persistent``: one kernel a layer, the chain's tiles;
- ``persistent-wide``: the same with the wide tiles;
- ``persistent-prefetch``, ``persistent-wide-prefetch``: the same, each program
  first prefetching into L2 the weight rows of all its tiles of the layer (before
  its wait for the kernel before, so under the layer before's tail);
- ``persistent-step``, ``persistent-step-prefetch``: one kernel for all 30 layers
  (their weights by address tables, a barrier between layers as between phases;
  prefetching, each program also prefetches the next layer's tiles as a layer
  starts): the one-kernel-per-step decode of the model's layers;
- ``persistent-phases``: the persistent kernel launched once per phase (its kernel
  boundaries in place of its barriers: what the barriers cost against boundaries).

Before timing, the persistent kernel's output (all 30 layers, one launch a layer)
must equal its phase-by-phase launches bit for bit, and its distance from the
chain's is recorded (they differ by the attention phases' contraction, which the
whole persistent kernel compiles without).

    python -m bench.persistent_layer_bench --out OUT.json   (PYTHONPATH: the repository)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from bench.cuda_timing import blocks_us, capture, run_measurement
from ignition.components import linear
from ignition.components.kv_cache import PagedKvCache
from ignition.components.persistent_layer import (
    STATE_WORDS,
    LayerShape,
    LayerStep,
    LayerTables,
    LayerWeights,
    chain_layer,
    layer_shape,
    phase_tiles,
    stack_layers,
    triton_persistent_layer,
    triton_persistent_step,
)
from ignition.components.programmatic_launch import programmatic_launch

# SmolLM2-135M: hidden, heads, kv heads, head_dim, intermediate, layers; the serving
# page size.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 576, 9, 3, 64, 1536, 30
PAGE = 64
EPS = 1e-5
WIDE = {"qkv": 32, "o": 32, "down": 32}
DEVICE = "cuda"

Layer = tuple[LayerWeights, LayerStep]


def _layers(
    rows: int, context: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, list[Layer], torch.Tensor]:
    """x, its partial squares, LAYERS layers of random weights, each with its own
    cache of ``rows`` rows of ``context`` tokens (the newest pending), and those
    caches as one tensor."""
    device = torch.device(DEVICE)
    gen = torch.Generator(device=device).manual_seed(seed)
    per_row = -(-context // PAGE)
    pages = 1 + rows * per_row
    table = (1 + torch.arange(rows * per_row, dtype=torch.int32, device=device)).view(rows, -1)
    pos = context - 1
    row_ids = table[:, pos // PAGE].long() * PAGE + pos % PAGE
    angles = torch.rand(rows, HEAD_DIM // 2, generator=gen, device=device) * 6.3
    angles = torch.cat((angles, angles), dim=-1)

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen, device=device) / k**0.5).to(torch.bfloat16)

    layers = []
    # One cache of every layer (the stacked step's), each layer's a view of it.
    cache = PagedKvCache.allocate(LAYERS, pages, PAGE, KV_HEADS, HEAD_DIM, torch.bfloat16, device)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen, device=device).to(torch.bfloat16))
    cache.kv[:, :, 0] = 0
    for i in range(LAYERS):
        kv = cache.kv[i]
        weights = LayerWeights(
            w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), w(HIDDEN, HEADS * HEAD_DIM),
            w(2 * INTER, HIDDEN), w(HIDDEN, INTER),
        )  # fmt: skip
        step = LayerStep(
            kv, table, torch.full((rows,), context, dtype=torch.int32, device=device), row_ids,
            angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16),
        )  # fmt: skip
        layers.append((weights, step))
    x = (torch.randn(rows, HIDDEN, generator=gen, device=device) * 2).to(torch.bfloat16)
    return x, linear.group_squares(x), layers, cache.kv


def _model(
    x: torch.Tensor, squares: torch.Tensor, layers: list[Layer],
    layer: Callable[[torch.Tensor, torch.Tensor, LayerWeights, LayerStep], tuple],
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The step's layers in order, each taking the one before's output and squares."""

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        h, s = x, squares
        with programmatic_launch(True):
            for weights, step in layers:
                h, s = layer(h, s, weights, step)
        return h, s

    return run


def _stacked_model(
    x: torch.Tensor, squares: torch.Tensor, tables: LayerTables, caches: torch.Tensor,
    step: LayerStep, shape: LayerShape, state: torch.Tensor, prefetch: bool,
) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The step's layers in one kernel (``triton_persistent_step``)."""

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        with programmatic_launch(True):
            return triton_persistent_step(
                x, squares, tables, caches, step, shape, state, prefetch=prefetch
            )

    return run


def measure(args: argparse.Namespace) -> dict:
    results = []
    state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=DEVICE)
    for rows in args.rows:
        x, squares, layers, caches = _layers(rows, args.context, seed=rows)
        tables = stack_layers([weights for weights, _ in layers])
        shapes = {
            name: layer_shape(layers[0][0], HEADS, HEAD_DIM, rows, EPS, widths=widths)
            for name, widths in (("default", None), ("wide", WIDE))
        }

        def chain(shape: LayerShape) -> Callable:
            return lambda h, s, w, st: chain_layer(h, s, w, st, shape)

        def persistent(
            shape: LayerShape, by_phase: bool = False, prefetch: bool = False
        ) -> Callable:
            return lambda h, s, w, st: triton_persistent_layer(
                h, s, w, st, shape, state, by_phase=by_phase, prefetch=prefetch
            )

        variants = {
            "chain": chain(shapes["default"]),
            "chain-wide": chain(shapes["wide"]),
            "persistent": persistent(shapes["default"]),
            "persistent-wide": persistent(shapes["wide"]),
            "persistent-prefetch": persistent(shapes["default"], prefetch=True),
            "persistent-wide-prefetch": persistent(shapes["wide"], prefetch=True),
            "persistent-phases": persistent(shapes["default"], by_phase=True),
        }
        runs = {name: _model(x, squares, layers, fn) for name, fn in variants.items()}

        for name, prefetch in (("persistent-step", False), ("persistent-step-prefetch", True)):
            runs[name] = _stacked_model(
                x, squares, tables, caches, layers[0][1], shapes["default"], state, prefetch
            )
        outputs = {name: run() for name, run in runs.items()}
        phased = _model(x, squares, layers, persistent(shapes["wide"], by_phase=True))()
        # Each barrier launch against the same kernel and tiles launched phase by phase.
        references = {
            "persistent": outputs["persistent-phases"],
            "persistent-wide": phased,
            "persistent-prefetch": outputs["persistent-phases"],
            "persistent-wide-prefetch": phased,
            "persistent-step": outputs["persistent-phases"],
            "persistent-step-prefetch": outputs["persistent-phases"],
        }
        bitwise = {
            name: all(torch.equal(a, b) for a, b in zip(outputs[name], ref, strict=True))
            for name, ref in references.items()
        }
        from_chain = (outputs["persistent"][0].float() - outputs["chain"][0].float()).abs()
        print(f"rows {rows}: barriers equal phase by phase: {bitwise}", flush=True)
        if not all(bitwise.values()):
            print("WRONG: the barriers changed the bits; timed anyway", flush=True)
        graphs = {name: capture(run) for name, run in runs.items()}
        timed = blocks_us(graphs, args.replays, args.blocks)
        per_layer = {name: t["median_us"] / LAYERS for name, t in timed.items()}
        for name, us in per_layer.items():
            ratio = timed[name]["median_us"] / timed["chain"]["median_us"]
            print(f"rows {rows} {name}: {us:.2f} us a layer, {ratio:.3f}x the chain", flush=True)
        results.append(
            {
                "rows": rows,
                "phase_tiles": {
                    name: phase_tiles(rows, shape, HIDDEN, KV_HEADS, HEAD_DIM, INTER)
                    for name, shape in shapes.items()
                },
                "tiles": {name: shape.tiles for name, shape in shapes.items()},
                "bitwise_with_phases": bitwise,
                "max_abs_from_chain": from_chain.max().item(),
                "graphs": timed,
                "per_layer_us": per_layer,
            }
        )
    return {
        "device": torch.cuda.get_device_name(),
        "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "context": args.context,
        "layers": LAYERS,
        "replays": args.replays,
        "blocks": args.blocks,
        "barrier_state_after": state.tolist(),
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    """Fails (1) where a barrier launch's bits differ from its phase-by-phase run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--context", type=int, default=128)
    found: list[dict] = []

    def kept(args: argparse.Namespace) -> dict:
        found.append(measure(args))
        return found[0]

    status = run_measurement(parser, kept, argv)
    wrong = any(not all(r["bitwise_with_phases"].values()) for f in found for r in f["results"])
    return 1 if status == 0 and wrong else status


if __name__ == "__main__":
    raise SystemExit(main())
