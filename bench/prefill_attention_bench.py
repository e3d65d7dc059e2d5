"""Times the paged prefill attention kernel of one chunk after a cached history, for
each KV split count: the data behind ``prefill_splits``' default.

    python bench/prefill_attention_bench.py [--out bench.json]

For SmolLM2-135M's and Qwen3-8B's attention shapes (one layer), chunk capacities 128
and 512 with 11 and 370 real tokens, after 0 to 32K cached tokens: the time per call
inside a CUDA graph, over KV copies larger than L2 together
(``bench/cuda_timing.py``), per split count (1, the default, and 2 to 32), and the
default's choice. Then whole 4,096-token chunks of the Qwen3-8B shape after 0 to 60K
cached tokens (a 64K prompt's chunks) and of SmolLM2-135M's after 0 and 4K, the
kernel's default, the default with its tiles in launch order (not longest first; the
bits compared), and each tiling of TILINGS against PyTorch's SDPA over the same keys
and values laid out contiguously (the generate loop's attention), in ms and TFLOP/s:
the data behind ``prefill_tiling``' default. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right
from triton.runtime.errors import OutOfResources

from bench.cuda_timing import cold_copies, median_graph_ms
from ignition.components.triton_attention import prefill_splits, triton_paged_prefill_attention

PAGE = 64
# (name, query heads, kv heads, head dim)
SHAPES = [("smollm2-135m", 9, 3, 64), ("qwen3-8b", 32, 8, 128)]
CHUNKS = [(128, 11), (512, 370)]
HISTORIES = [0, 2048, 8192, 32768]
SPLITS = [1, 2, 4, 8, 16, 32]
# Whole chunks of a long prompt: (shape, chunk tokens, histories).
LONG_CHUNK = 4096
# (shape, query heads, kv heads, head dim, histories): a 64K prompt's chunks for the
# 8B; SmolLM2's 8K context holds two.
LONG = [
    ("qwen3-8b", 32, 8, 128, [0, 16384, 32768, 61440]),
    ("smollm2-135m", 9, 3, 64, [0, 4096]),
]
# Tilings of the long chunks: (query rows, key pages per step, warps, stages).
TILINGS = [
    (64, 1, 4, 2),
    (64, 2, 4, 2),
    (64, 2, 4, 3),
    (128, 1, 8, 2),
    (128, 2, 8, 2),
    (128, 2, 8, 3),
    (128, 1, 4, 2),
    (128, 2, 4, 3),
    (128, 4, 8, 2),
]


def causal_flops(heads: int, dim: int, chunk: int, history: int) -> int:
    """Multiply-adds times two of QK^T and PV for ``chunk`` queries after ``history``
    cached keys, each query seeing the history and the chunk up to itself."""
    keys = chunk * history + chunk * (chunk + 1) // 2
    return 4 * heads * dim * keys


def long_chunks(device: torch.device, tilings: bool = True) -> list[dict]:
    """The kernel's default on whole chunks after long histories, against SDPA (and
    each of TILINGS with ``tilings``)."""
    rows = []
    for name, heads, kv_heads, dim, histories in LONG:
        rows += _long_chunks(device, name, heads, kv_heads, dim, histories, tilings)
    return rows


def _long_chunks(
    device: torch.device,
    name: str,
    heads: int,
    kv_heads: int,
    dim: int,
    histories: list[int],
    tilings: bool,
) -> list[dict]:
    rows = []
    for history in histories:
        total = history + LONG_CHUNK
        pages = total // PAGE + 2
        kv = torch.randn(2, pages + 1, PAGE, kv_heads, dim, device=device, dtype=torch.bfloat16)
        table = torch.randperm(pages, device=device).to(torch.int32) + 1
        q = torch.randn(LONG_CHUNK, heads, dim, device=device, dtype=torch.bfloat16)
        start = torch.tensor([history], dtype=torch.int32, device=device)
        n_valid = torch.tensor([LONG_CHUNK], dtype=torch.int32, device=device)
        call = partial(triton_paged_prefill_attention, q, kv, table, start, n_valid, dim**-0.5)
        flare_ms = median_graph_ms([call])
        # The tiles in launch order (shortest first), as before longest_first: the time
        # and whether the bits agree.
        in_order = partial(call, longest_first=False)
        in_order_ms = median_graph_ms([in_order])
        same_bits = bool(torch.equal(call(), in_order()))
        group = triton.next_power_of_2(heads // kv_heads)
        tiling_ms: dict[str, float | None] = {}
        for t in TILINGS if tilings else []:
            tuned = partial(
                call, block_t=t[0] // group, key_pages=t[1], num_warps=t[2], num_stages=t[3]
            )
            try:
                tiling_ms["x".join(map(str, t))] = median_graph_ms([tuned])
            except OutOfResources as error:  # a tiling the SM's shared memory cannot hold
                print(f"    tiling {t}: {error}")
                tiling_ms["x".join(map(str, t))] = None
        # The same keys and values in position order, [1, kv_heads, total, dim].
        ordered = kv[:, table.long()].flatten(1, 2)[:, :total].permute(0, 2, 1, 3)
        k, v = ordered[0:1].contiguous(), ordered[1:2].contiguous()
        sdpa_q = q.permute(1, 0, 2).unsqueeze(0)
        mask = causal_lower_right(LONG_CHUNK, total)
        sdpa_ms = median_graph_ms(
            [partial(F.scaled_dot_product_attention, sdpa_q, k, v, mask, enable_gqa=True)]
        )
        tflop = causal_flops(heads, dim, LONG_CHUNK, history) / 1e12
        rows.append(dict(shape=name, history=history, chunk=LONG_CHUNK, flare_ms=flare_ms,
                         sdpa_ms=sdpa_ms, tflop=tflop, tiling_ms=tiling_ms,
                         in_order_ms=in_order_ms, same_bits_in_order=same_bits))  # fmt: skip
        print(
            f"{name:13} history {history:6} chunk {LONG_CHUNK}: flare {flare_ms:.3f} ms "
            f"({tflop / flare_ms * 1e3:.0f} TFLOP/s), SDPA {sdpa_ms:.3f} ms "
            f"({tflop / sdpa_ms * 1e3:.0f} TFLOP/s), flare / SDPA {flare_ms / sdpa_ms:.2f}; "
            f"tiles in launch order {in_order_ms:.3f} ms "
            f"({'the same bits' if same_bits else 'BITS DIFFER'})"
        )
        for key, ms in tiling_ms.items():
            if ms is None:
                continue
            print(
                f"    tiling rows x key pages x warps x stages {key:10}: {ms:.3f} ms "
                f"({tflop / ms * 1e3:.0f} TFLOP/s), / SDPA {ms / sdpa_ms:.2f}"
            )
        del kv, k, v, ordered
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--long-only", action="store_true", help="only the whole long chunks")
    parser.add_argument(
        "--no-tilings", action="store_true", help="the long chunks at the default tiling only"
    )
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    for name, heads, kv_heads, dim in [] if args.long_only else SHAPES:
        for history in HISTORIES:
            for capacity, valid in CHUNKS:
                pages = (history + capacity) // PAGE + 2
                kv = torch.randn(2, pages + 1, PAGE, kv_heads, dim, device=device)
                kv = kv.to(torch.bfloat16)
                table = torch.randperm(pages, device=device).to(torch.int32) + 1
                q = torch.randn(capacity, heads, dim, device=device, dtype=torch.bfloat16)
                start = torch.tensor([history], dtype=torch.int32, device=device)
                n_valid = torch.tensor([valid], dtype=torch.int32, device=device)

                caches = [kv] + [
                    kv.clone() for _ in range(cold_copies(kv.numel() * kv.element_size()) - 1)
                ]
                calls = [
                    partial(triton_paged_prefill_attention, q, c, table, start, n_valid, dim**-0.5)
                    for c in caches
                ]
                timings = {
                    str(s): median_graph_ms([partial(call, num_splits=s) for call in calls])
                    for s in SPLITS
                }
                default = prefill_splits(capacity, 16, kv_heads)
                timings["default"] = median_graph_ms(calls)
                row = dict(
                    shape=name,
                    history=history,
                    capacity=capacity,
                    valid=valid,
                    default_splits=default,
                    median_ms=timings,
                )
                rows.append(row)
                best = min(SPLITS, key=lambda s: timings[str(s)])
                print(
                    f"{name:13} history {history:6} chunk {valid:4}/{capacity:4}: "
                    + " ".join(f"{s}:{timings[str(s)]:.3f}" for s in SPLITS)
                    + f"  default({default}) {timings['default']:.3f} ms, best {best}"
                )
    long_rows = long_chunks(device, tilings=not args.no_tilings)
    if args.out:
        args.out.write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "long": long_rows})
        )


if __name__ == "__main__":
    main()
