"""Times a long prefill chunk's attention in two parts against the one Triton kernel:

    python bench/prefill_two_parts_bench.py [--out two_parts.json]

For Qwen3-8B's heads (32 query, 8 kv, 128 wide, with q/k norms), chunks of 2,048 and
4,096 tokens after 0 to 60K cached tokens, each inside CUDA graphs
(``bench/cuda_timing.py``), in ms:

- ``one``: the rotary write, then ``triton_paged_prefill_attention`` (before);
- ``two``: ``triton_paged_prefill_attention_rope``: the write leaving the projection
  finished, cuDNN's kernel within the chunk, the history kernel merging in place;
- ``two_flash``: the same with PyTorch's flash kernel within the chunk (the first
  library tried: ``bench/results/issue23/2026-12-07i-h100-two-parts/``);
- ``cudnn``, ``flash``: each library's kernel alone over the same finished
  projection, with their outputs' and log-sum-exps' largest differences;
- ``history_cudnn``, ``history_flash`` (after a history): the history's keys gathered
  from their pages into one contiguous tensor, then one attention of the chunk's
  queries over all of them with no mask (every history key precedes every query),
  timed with the gather: the history part through either library (the 64K line's
  candidate), with TFLOP/s over the history's share alone and the largest
  difference from ``one`` of its merge (in fp32, by the log-sum-exps) with cuDNN's
  part within the chunk;
- ``history_varlen``: cuDNN's ragged form (``aten::_cudnn_attention_forward``) over
  the same history held in a buffer of ``VARLEN_KEYS`` keys, its length read on the
  device (``cum_seq_k``): whether one graph could serve every history at the cost of
  the keys it has rather than the buffer's, with its output's and log-sum-exp's
  largest differences from ``history_cudnn``'s (the latter in whichever layout, heads
  first or tokens first, matches: ``history_varlen_lse_layout``);

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
    triton_paged_prefill_attention,
    triton_paged_prefill_attention_rope,
    two_parts_apply,
)
from ignition.components.triton_kv_write import triton_rope_write_kv

PAGE = 64
HEADS, KV_HEADS, DIM = 32, 8, 128
CASES = [(2048, [0, 4096, 16384]), (4096, [0, 4096, 16384, 61440])]
REFERENCE_KEYS = 8192
VARLEN_KEYS = 65536
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


def _two_flash(c: dict) -> torch.Tensor:
    return triton_paged_prefill_attention_rope(
        c["rope"], c["kv"], c["table"], c["start"], c["n_valid"], DIM**-0.5, HEADS, "flash"
    )


def _history(c: dict, q: torch.Tensor, history: int, library: str) -> tuple:
    """The chunk's queries over the history's keys, gathered from their pages, with no
    mask: the normalised output ``[T, heads, D]`` and the log-sum-exp ``[heads, T]``."""
    pages = c["table"][: -(-history // PAGE)].long()
    k, v = (c["kv"][i, pages].reshape(-1, KV_HEADS, DIM)[:history] for i in (0, 1))
    return _chunk_attention(q, k, v, DIM**-0.5, library, causal=False)


def _history_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cum_q: torch.Tensor, cum_k: torch.Tensor
) -> tuple:
    """cuDNN's ragged attention of the chunk's queries over the first ``cum_k[1]`` of
    ``k``/``v``'s ``VARLEN_KEYS`` rows, no mask."""
    out, lse, *_ = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cum_q, cum_k, q.shape[0], k.shape[0], True, 0.0, False, False,
        scale=DIM**-0.5,
    )  # fmt: skip
    return out, lse


def _varlen_row(c: dict, q: torch.Tensor, history: int) -> dict:
    pages = c["table"][: -(-history // PAGE)].long()
    k, v = (
        torch.zeros(VARLEN_KEYS, KV_HEADS, DIM, device=q.device, dtype=q.dtype) for _ in range(2)
    )
    for i, buffer in enumerate((k, v)):
        buffer[:history] = c["kv"][i, pages].reshape(-1, KV_HEADS, DIM)[:history]
    cum_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    cum_k = torch.tensor([0, history], dtype=torch.int32, device=q.device)
    try:
        out, lse = _history_varlen(q, k, v, cum_q, cum_k)
        ms = median_graph_ms([partial(_history_varlen, q, k, v, cum_q, cum_k)])
    except RuntimeError as error:
        return dict(history_varlen=str(error).splitlines()[0][:200])
    static_out, static_lse = _history(c, q, history, "cudnn")
    row = dict(
        history_varlen_ms=ms,
        history_varlen_out_diff=(out.float() - static_out.float()).abs().max().item(),
        history_varlen_lse_shape=list(lse.shape),
    )
    for layout, view in (
        ("heads first", lse.reshape(HEADS, -1)),
        ("tokens first", lse.reshape(-1, HEADS).T),
    ):
        if view.shape == static_lse.shape:
            diff = (view.float() - static_lse.float()).abs().max().item()
            if diff < row.get("history_varlen_lse_diff", float("inf")):
                row.update(history_varlen_lse_diff=diff, history_varlen_lse_layout=layout)
    return row


def _merged(parts: list[tuple]) -> torch.Tensor:
    """Normalised partial attentions merged by their natural-log sums, in fp32."""
    lse = torch.stack([p[1].float().transpose(0, 1) for p in parts])  # [n, T, heads]
    weights = torch.softmax(lse, dim=0)[..., None]
    return sum(w * p[0].float() for w, p in zip(weights, parts, strict=True))


def _history_rows(
    c: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, history: int, one: torch.Tensor
) -> dict:
    row: dict = {}
    within = _chunk_attention(q, k, v, DIM**-0.5)
    for library in ("cudnn", "flash"):
        try:
            merged = _merged([_history(c, q, history, library), within])
            row[f"history_{library}_diff"] = (merged - one.float()).abs().max().item()
            row[f"history_{library}_ms"] = median_graph_ms(
                [partial(_history, c, q, history, library)]
            )
        except RuntimeError as error:
            row[f"history_{library}"] = str(error).splitlines()[0][:200]
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
        applies = two_parts_apply(
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
            row["two_flash_ms"] = median_graph_ms([partial(_two_flash, c)])
            for library in ("cudnn", "flash"):
                row[f"{library}_ms"] = median_graph_ms(
                    [partial(_chunk_attention, q, k, v, DIM**-0.5, library)]
                )
            cudnn = _chunk_attention(q, k, v, DIM**-0.5)
            flash = _chunk_attention(q, k, v, DIM**-0.5, "flash")
            row["cudnn_flash_out_diff"] = (cudnn[0].float() - flash[0].float()).abs().max().item()
            row["cudnn_flash_lse_diff"] = (cudnn[1] - flash[1]).abs().max().item()
            if history:
                row.update(_history_rows(c, q, k, v, history, one))
                row.update(_varlen_row(c, q, history))
            tflop = causal_flops(HEADS, DIM, chunk, history) / 1e12
            row["tflop"] = tflop
            rows.append(row)
            print(
                f"chunk {chunk} history {history:6}: one {row['one_ms']:.3f} ms "
                f"({tflop / row['one_ms'] * 1e3:.0f} TFLOP/s), two {row['two_ms']:.3f} "
                f"({tflop / row['two_ms'] * 1e3:.0f}), two / one "
                f"{row['two_ms'] / row['one_ms']:.3f}, with flash within "
                f"{row['two_flash_ms'] / row['one_ms']:.3f}; max |one - two| {diff:.3g}"
                + (
                    f", against the reference: one {row['ref_diff_one']:.3g}, "
                    f"two {row['ref_diff_two']:.3g}"
                    if "ref_diff_one" in row
                    else ""
                )
                + ("" if applies else " (the rule keeps one)")
            )
            print(
                f"  within the chunk alone: cudnn {row['cudnn_ms']:.3f} ms, flash "
                f"{row['flash_ms']:.3f}; max |cudnn - flash| {row['cudnn_flash_out_diff']:.3g}"
                f", log-sum-exp {row['cudnn_flash_lse_diff']:.3g}"
            )
            history_tflop = 4 * HEADS * DIM * chunk * history / 1e12
            for library in ("cudnn", "flash"):
                if f"history_{library}_ms" in row:
                    ms = row[f"history_{library}_ms"]
                    print(
                        f"  history by {library}, gathered: {ms:.3f} ms "
                        f"({history_tflop / ms * 1e3:.0f} TFLOP/s of the history's share), "
                        f"merged with cudnn's within: max |it - one| "
                        f"{row[f'history_{library}_diff']:.3g}"
                    )
                elif f"history_{library}" in row:
                    print(f"  history by {library}: declined: {row[f'history_{library}']}")
            if "history_varlen_ms" in row:
                ms = row["history_varlen_ms"]
                print(
                    f"  history by cudnn's ragged form in {VARLEN_KEYS} keys: {ms:.3f} ms "
                    f"({history_tflop / ms * 1e3:.0f} TFLOP/s), max |it - gathered| "
                    f"{row['history_varlen_out_diff']:.3g}, log-sum-exp "
                    f"{row.get('history_varlen_lse_diff', float('nan')):.3g} "
                    f"({row.get('history_varlen_lse_layout', 'no layout matched')}, shape "
                    f"{row['history_varlen_lse_shape']})"
                )
            elif "history_varlen" in row:
                print(f"  history by cudnn's ragged form: declined: {row['history_varlen']}")
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
