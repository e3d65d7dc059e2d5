"""Times a long prefill chunk's attention in two parts against the one Triton kernel:

    python bench/prefill_two_parts_bench.py [--out two_parts.json]

For Qwen3-8B's heads (32 query, 8 kv, 128 wide, with q/k norms), chunks of 2,048 and
4,096 tokens after 0 to 60K cached tokens, each inside CUDA graphs
(``bench/cuda_timing.py``), in ms:

- ``one``: the rotary write, then ``triton_paged_prefill_attention`` (before);
- ``two``: ``triton_paged_prefill_attention_rope``: the write leaving the projection
  finished, the flash kernel within the chunk, the history kernel merging in place;
- ``flash``: the flash kernel alone, over the same finished projection;
- ``cudnn``: PyTorch's cuDNN attention over the same projection (causal, the
  log-sum-exp kept; its grouped heads natively, else expanded first, timed with the
  expansion): a candidate for the within-chunk part, with its largest difference from
  the flash kernel's output and log-sum-exp (``cudnn`` holds the error where cuDNN
  declines the shape);
- ``gathered_flash``, ``gathered_cudnn`` (after a history): the history's and the
  chunk's keys gathered from their pages into one contiguous tensor, then one causal
  attention of the chunk's queries over all of them (the mask aligned to the last key),
  timed with the gather: what a path through either library's kernel would cost at
  long histories (the 64K line), with each output's largest difference from ``two``'s;

with the largest difference between the two outputs and each one's against the
float32 reference where the history is short enough to gather. Then the kernels one
replay of ``two`` launches, by name (``torch.profiler``). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from bench.cuda_timing import median_graph_ms
from bench.prefill_attention_bench import causal_flops
from ignition.components.attention import paged_prefill_attention_ref
from ignition.components.triton_attention import (
    RopeInputs,
    _chunk_attention,
    flash_chunk_applies,
    triton_paged_prefill_attention,
    triton_paged_prefill_attention_rope,
)
from ignition.components.triton_kv_write import triton_rope_write_kv

PAGE = 64
HEADS, KV_HEADS, DIM = 32, 8, 128
CASES = [(2048, [0, 4096, 16384]), (4096, [0, 4096, 16384, 61440])]
REFERENCE_KEYS = 8192
EPS = 1e-6


def _case(chunk: int, history: int, device: torch.device) -> dict:
    total = history + chunk
    pages = total // PAGE + 2
    kv = torch.randn(2, pages + 1, PAGE, KV_HEADS, DIM, device=device).to(torch.bfloat16)
    kv[:, 0].zero_()
    table = torch.randperm(pages, device=device).to(torch.int32) + 1
    positions = history + torch.arange(chunk, device=device)
    rows = table[positions // PAGE].long() * PAGE + positions % PAGE
    angle = positions[:, None].float() * torch.rand(DIM // 2, device=device)[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], dim=1).to(torch.bfloat16)
    sin = torch.cat([angle.sin(), angle.sin()], dim=1).to(torch.bfloat16)
    weights = [torch.rand(DIM, device=device).to(torch.bfloat16) + 0.5 for _ in range(2)]
    qkv = torch.randn(chunk, (HEADS + 2 * KV_HEADS) * DIM, device=device).to(torch.bfloat16)
    return dict(
        rope=RopeInputs(qkv, weights[0], weights[1], EPS, cos, sin, rows),
        kv=kv, table=table,
        start=torch.tensor([history], dtype=torch.int32, device=device),
        n_valid=torch.tensor([chunk], dtype=torch.int32, device=device),
    )  # fmt: skip


def _one(c: dict) -> torch.Tensor:
    r = c["rope"]
    q = triton_rope_write_kv(c["kv"], r.qkv, r.q_weight, r.k_weight, EPS, r.cos, r.sin, r.rows,
                             HEADS)  # fmt: skip
    return triton_paged_prefill_attention(q, c["kv"], c["table"], c["start"], c["n_valid"],
                                          DIM**-0.5)  # fmt: skip


def _two(c: dict) -> torch.Tensor:
    return triton_paged_prefill_attention_rope(
        c["rope"], c["kv"], c["table"], c["start"], c["n_valid"], DIM**-0.5, HEADS
    )


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, expand: bool) -> tuple:
    """cuDNN's attention over ``[T, heads, D]`` operands: the output ``[T, heads, D]``
    and the log-sum-exp ``[heads, T]``."""
    if expand:
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        None, True, 0.0, True, False, scale=DIM**-0.5,
    )  # fmt: skip
    return out[0].transpose(0, 1), lse[0].reshape(q.shape[1], q.shape[0])


def _cudnn_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """The cuDNN arm: grouped heads natively if cuDNN takes them, else expanded."""
    flash_out, flash_lse = _chunk_attention(q, k, v, DIM**-0.5)
    errors = []
    for expand in (False, True):
        try:
            out, lse = _cudnn(q, k, v, expand)
            ms = median_graph_ms([partial(_cudnn, q, k, v, expand)])
        except RuntimeError as error:
            errors.append(f"expand={expand}: {str(error).splitlines()[0][:200]}")
            continue
        return dict(
            cudnn_ms=ms, cudnn_expanded=expand,
            cudnn_out_diff=(out.float() - flash_out.float()).abs().max().item(),
            cudnn_lse_diff=(lse.float() - flash_lse.float()).abs().max().item(),
        )  # fmt: skip
    return dict(cudnn=errors)


def _gathered(c: dict, q: torch.Tensor, history: int, backend: str) -> torch.Tensor:
    """The chunk's queries over the history's and the chunk's keys, gathered from
    their pages, by one causal attention aligned to the last key."""
    chunk = q.shape[0]
    total = history + chunk
    pages = c["table"][: -(-total // PAGE)].long()
    k, v = (c["kv"][i, pages].reshape(-1, KV_HEADS, DIM)[:total] for i in (0, 1))
    if backend == "flash":
        out, *_ = torch.ops.aten._flash_attention_forward(
            q[None], k[None], v[None], None, None, chunk, total, 0.0, True, False,
            scale=DIM**-0.5,
        )  # fmt: skip
        return out[0]
    group = HEADS // KV_HEADS
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    out, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        None, False, 0.0, True, False, scale=DIM**-0.5,
    )  # fmt: skip
    return out[0].transpose(0, 1)


def _gathered_rows(c: dict, q: torch.Tensor, history: int, two: torch.Tensor) -> dict:
    row: dict = {}
    for backend in ("flash", "cudnn"):
        try:
            out = _gathered(c, q, history, backend)
            row[f"gathered_{backend}_diff"] = (out.float() - two.float()).abs().max().item()
            row[f"gathered_{backend}_ms"] = median_graph_ms(
                [partial(_gathered, c, q, history, backend)]
            )
        except RuntimeError as error:
            row[f"gathered_{backend}"] = str(error).splitlines()[0][:200]
    return row


def _kernels(call: partial) -> list[tuple[str, float]]:
    """Each kernel one call launches and its device microseconds."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [
        (e.key, e.device_time_total / max(e.count, 1))
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    for chunk, histories in CASES:
        applies = flash_chunk_applies(
            chunk, HEADS, KV_HEADS, DIM, torch.bfloat16, device, min_tokens=chunk
        )
        for history in histories:
            c = _case(chunk, history, device)
            one = _one(c).clone()
            two = _two(c).clone()
            diff = (one.float() - two.float()).abs().max().item()
            row: dict = dict(chunk=chunk, history=history, rule_takes_two=applies, max_diff=diff)
            if history + chunk <= REFERENCE_KEYS:
                q = triton_rope_write_kv(
                    c["kv"].clone(), *c["rope"][:3], EPS, *c["rope"][4:], HEADS
                )
                ref = paged_prefill_attention_ref(
                    q, c["kv"], c["table"], c["start"], c["n_valid"], DIM**-0.5
                ).float()
                row["ref_diff_one"] = (one.float() - ref).abs().max().item()
                row["ref_diff_two"] = (two.float() - ref).abs().max().item()
            finished = triton_rope_write_kv(
                c["kv"].clone(), *c["rope"][:3], EPS, *c["rope"][4:], HEADS, finished=True
            )
            q, k, v = finished.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
            row["one_ms"] = median_graph_ms([partial(_one, c)])
            row["two_ms"] = median_graph_ms([partial(_two, c)])
            row["flash_ms"] = median_graph_ms([partial(_chunk_attention, q, k, v, DIM**-0.5)])
            if history == 0:
                row.update(_cudnn_row(q, k, v))
            else:
                row.update(_gathered_rows(c, q, history, two))
            tflop = causal_flops(HEADS, DIM, chunk, history) / 1e12
            row["tflop"] = tflop
            rows.append(row)
            print(
                f"chunk {chunk} history {history:6}: one {row['one_ms']:.3f} ms "
                f"({tflop / row['one_ms'] * 1e3:.0f} TFLOP/s), two {row['two_ms']:.3f} "
                f"({tflop / row['two_ms'] * 1e3:.0f}), two / one "
                f"{row['two_ms'] / row['one_ms']:.3f}; flash alone {row['flash_ms']:.3f}; "
                f"max |one - two| {diff:.3g}"
                + (
                    f", against the reference: one {row['ref_diff_one']:.3g}, "
                    f"two {row['ref_diff_two']:.3g}"
                    if "ref_diff_one" in row
                    else ""
                )
                + ("" if applies else " (the rule keeps one)")
            )
            if "cudnn_ms" in row:
                print(
                    f"  cudnn alone {row['cudnn_ms']:.3f} ms (expanded: {row['cudnn_expanded']}"
                    f"), max |cudnn - flash| {row['cudnn_out_diff']:.3g}, log-sum-exp "
                    f"{row['cudnn_lse_diff']:.3g}"
                )
            elif "cudnn" in row:
                print(f"  cudnn declined: {row['cudnn']}")
            for backend in ("flash", "cudnn"):
                if f"gathered_{backend}_ms" in row:
                    print(
                        f"  gathered, {backend}: {row[f'gathered_{backend}_ms']:.3f} ms "
                        f"({tflop / row[f'gathered_{backend}_ms'] * 1e3:.0f} TFLOP/s), max "
                        f"|it - two| {row[f'gathered_{backend}_diff']:.3g}"
                    )
                elif f"gathered_{backend}" in row:
                    print(f"  gathered, {backend}: declined: {row[f'gathered_{backend}']}")
            del c, q, k, v, finished
    c = _case(4096, 4096, device)
    kernels = _kernels(partial(_two, c))
    for name, us in kernels:
        print(f"  two parts, 4096 after 4096: {us:9.1f} us  {name[:110]}")
    if args.out:
        args.out.write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "kernels": kernels})
        )


if __name__ == "__main__":
    main()
