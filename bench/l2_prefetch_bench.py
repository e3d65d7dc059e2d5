"""Whether a weight prefetched into L2 while no kernel streams weights is read from
L2 by the decode projection after it (H200).

A decode step spends time in kernels that read no weights (attention, norms, the
rotary write, the sampler): the DRAM idles under them. If a kernel there could
prefetch the next projection's weight into L2, that projection would read it from
L2. An earlier prefetch (each projection its own weight's first bytes, before its
wait, while the kernel before streamed its own) cost what reading those bytes again
costs (``bench/results/issue23/2026-12-04e-h200-programmatic-launch``), which left
open whether a prefetched line is ever hit. This measures it directly, each case a
CUDA graph replayed in alternating blocks, its medians and p99 over the replays:

- ``flush``: a write of ``--flush-mib`` that evicts L2;
- ``flush+warm`` then ``flush+warm+project`` for each way of warming the weight
  (``none``; ``bulk``: ``cp.async.bulk.prefetch.L2`` of whole rows; ``line``:
  ``prefetch.global.L2`` of each 128-byte line; ``load``: every byte loaded and
  summed, the reference for L2-resident), the projection's time being the
  difference of the two graphs' medians;
- and ``idle``: a kernel that spins ``--idle-us`` without memory traffic (as
  attention does for the DRAM) with and without issuing a bulk prefetch of the
  weight first, followed by the projection: the step time a prefetch under an idle
  kernel would save.

    python bench/l2_prefetch_bench.py --out OUT.json   (PYTHONPATH: the repository)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from bench.cuda_timing import blocks_us, capture, run_measurement
from ignition.components.l2_prefetch import prefetch_l2
from ignition.components.linear import triton_rows_linear

# (name, N, K): Qwen3-8B's o and qkv, SmolLM2-135M's qkv and gate/up.
SHAPES = (
    ("8b-o", 4096, 4096),
    ("8b-qkv", 6144, 4096),
    ("smol-qkv", 960, 576),
    ("smol-gate-up", 3072, 576),
)
LINE = 128


@triton.jit
def _bulk_prefetch(w_ptr, nbytes, chunk, BLOCK: tl.constexpr):
    """Program i prefetches bytes [i * chunk, (i+1) * chunk) of the weight, one bulk
    prefetch per BLOCK-th of that chunk (16-byte units)."""
    start = tl.program_id(0).to(tl.int64) * chunk
    prefetch_l2(w_ptr + start, nbytes - start, chunk // BLOCK, BLOCK)


@triton.jit
def _bulk_prefetch_kernel(w_ptr, nbytes, chunk, BLOCK: tl.constexpr):
    _bulk_prefetch(w_ptr, nbytes, chunk, BLOCK)


@triton.jit
def _line_prefetch_kernel(w_ptr, nbytes, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK * 128 + tl.arange(0, BLOCK).to(tl.int64) * 128
    ok = offs < nbytes
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // $0",
        "=r,l",
        [w_ptr + tl.where(ok, offs, 0)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _load_kernel(w_ptr, sink_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(w_ptr + offs, mask=offs < n, other=0)
    tl.store(sink_ptr + pid, tl.sum(x.to(tl.int32), axis=0))


@triton.jit
def _globaltimer(dummy):
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer; // $1", "=l,l", [dummy], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _idle_kernel(w_ptr, nbytes, chunk, ns, PREFETCH: tl.constexpr, BLOCK: tl.constexpr):
    """Spins ``ns`` nanoseconds (globaltimer) after, with PREFETCH, a bulk prefetch of
    its share of the weight."""
    if PREFETCH:
        _bulk_prefetch(w_ptr, nbytes, chunk, BLOCK)
    t0 = _globaltimer(ns)
    t = t0
    while t - t0 < ns:
        t = _globaltimer(ns)


def _chunk(nbytes: int, programs: int, block: int) -> int:
    unit = 16 * block
    return triton.cdiv(triton.cdiv(nbytes, programs), unit) * unit


def _shape_graphs(
    w: torch.Tensor,
    x: torch.Tensor,
    flush: torch.Tensor,
    sink: torch.Tensor,
    sms: int,
    idle_ns: int,
) -> tuple[dict[str, object], tuple[str, ...]]:
    """The graphs of one weight: each warm-up after the flush, alone and followed by
    the projection, and the idle kernel (with and without a prefetch) then the
    projection; and the warm-ups' names."""
    nbytes = w.numel() * w.element_size()
    raw = w.view(torch.uint8).view(-1)
    block = 128
    chunk = _chunk(nbytes, sms, block)
    lines = 1024

    warms: dict[str, Callable[[], object]] = {
        "none": lambda: None,
        "bulk": lambda: _bulk_prefetch_kernel[(sms,)](raw, nbytes, chunk, BLOCK=block),
        "line": lambda: _line_prefetch_kernel[(triton.cdiv(nbytes, lines * LINE),)](
            raw, nbytes, BLOCK=lines
        ),
        "load": lambda: _load_kernel[(triton.cdiv(nbytes, 4096),)](raw, sink, nbytes, BLOCK=4096),
    }

    def project() -> None:
        triton_rows_linear(x, w, None)

    def idle(prefetch: bool) -> None:
        _idle_kernel[(sms,)](raw, nbytes, chunk, idle_ns, PREFETCH=prefetch, BLOCK=block)

    graphs: dict[str, object] = {}
    for name, warm in warms.items():
        graphs[f"flush+{name}"] = capture(lambda warm=warm: (flush.zero_(), warm()))
        graphs[f"flush+{name}+project"] = capture(
            lambda warm=warm: (flush.zero_(), warm(), project())
        )
    for prefetch in (False, True):
        label = "idle-prefetch" if prefetch else "idle"
        graphs[f"flush+{label}+project"] = capture(
            lambda prefetch=prefetch: (flush.zero_(), idle(prefetch), project())
        )
    return graphs, tuple(warms)


def measure(args: argparse.Namespace) -> dict:
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flush = torch.empty(args.flush_mib << 20, dtype=torch.uint8, device=device)
    sink = torch.empty(1 << 20, dtype=torch.int32, device=device)
    results = []
    for name, n, k in SHAPES:
        w = torch.randn(n, k, dtype=torch.bfloat16, device=device) * 0.02
        x = torch.randn(1, k, dtype=torch.bfloat16, device=device)
        graphs, warms = _shape_graphs(w, x, flush, sink, sms, int(args.idle_us * 1000))
        timed = blocks_us(graphs, args.replays, args.blocks)
        nbytes = w.numel() * w.element_size()
        row: dict = {"shape": name, "n": n, "k": k, "bytes": nbytes, "graphs": timed}
        for warm_name in warms:
            row[f"project_us_after_{warm_name}"] = (
                timed[f"flush+{warm_name}+project"]["median_us"]
                - timed[f"flush+{warm_name}"]["median_us"]
            )
        row["idle_saving_us"] = (
            timed["flush+idle+project"]["median_us"]
            - timed["flush+idle-prefetch+project"]["median_us"]
        )
        print(
            f"{name}: project after none {row['project_us_after_none']:.2f} us, "
            f"bulk {row['project_us_after_bulk']:.2f}, line {row['project_us_after_line']:.2f}, "
            f"load {row['project_us_after_load']:.2f}; idle {args.idle_us} us then project: "
            f"{timed['flush+idle+project']['median_us']:.2f} without a prefetch, "
            f"{timed['flush+idle-prefetch+project']['median_us']:.2f} with",
            flush=True,
        )
        results.append(row)
    return {
        "device": torch.cuda.get_device_name(device),
        "flush_mib": args.flush_mib,
        "idle_us": args.idle_us,
        "replays": args.replays,
        "blocks": args.blocks,
        "shapes": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush-mib", type=int, default=256)
    parser.add_argument("--idle-us", type=float, default=8.0)
    return run_measurement(parser, measure, argv, replays=50, blocks=4)


if __name__ == "__main__":
    raise SystemExit(main())
