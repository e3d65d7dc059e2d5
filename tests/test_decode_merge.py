"""Decode attention's merge in its split kernel (``tickets``): the last split of each
row and kv head to finish merges the group's heads, so the merge kernel's launch
goes. It must give the merge kernel's bits, leave every ticket zero for the next
launch (a step's tickets serve all its layers), and refuse tickets of another shape.
Interpreted on the CPU (programs one after another), compiled on the GPU, where the
splits finish in any order and a captured graph replays the launch over the same
tickets."""

from __future__ import annotations

import pytest
import torch
from test_attention import SERVING, SMALL, SMOL, Geometry, decode_q, make_requests
from test_rope_decode_attention import _case, _rope

from ignition.components.attention import merge_tickets
from ignition.components.triton_attention import (
    triton_paged_decode_attention,
    triton_paged_decode_attention_rope,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(g: Geometry, lengths: list[int], seed: int, device: str) -> tuple:
    """(q, kv, page table, seq_lens) of rows of ``lengths`` cached tokens (0: a
    padding row)."""
    pages = max(1, max(-(-n // g.page_size) for n in lengths))
    reqs = make_requests(g, lengths, max_pages=pages, seed=seed)
    kv = reqs.kv(range(len(lengths)), device)
    q = decode_q(reqs, seed).to(device)
    table = torch.stack(reqs.tables).to(device)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return q, kv, table, seq_lens


@pytest.mark.parametrize("num_splits", [1, 3, 16])
@pytest.mark.parametrize("g", [SMALL, SMOL], ids=["group-2", "group-3"])
def test_the_merge_in_the_split_kernel_gives_the_merge_kernels_bits(
    g: Geometry, num_splits: int
) -> None:
    lengths = [1, g.page_size, 0, g.page_size + 1, 5 * g.page_size + 7]
    q, kv, table, seq_lens = _operands(g, lengths, seed=num_splits, device=DEVICE)
    tickets = merge_tickets(len(lengths), g.num_kv_heads, q.device)
    two = triton_paged_decode_attention(q, kv, table, seq_lens, g.scale, num_splits=num_splits)
    for _ in range(2):  # the second launch over the tickets the first left
        one = triton_paged_decode_attention(
            q, kv, table, seq_lens, g.scale, num_splits=num_splits, tickets=tickets
        )
        assert torch.equal(one, two)
        assert not tickets.any(), "every ticket is zero again"
    assert not one[2].any(), "a padding row gives zeros"


@pytest.mark.parametrize("norms", [True, False])
def test_the_merge_follows_the_fused_rotary_write(norms: bool) -> None:
    """With the rotary write in the split kernel too: one launch for the whole of
    decode attention, the same output and cache as its kernels apart."""
    case = _case([1, 16, 0, 17, 46], 6, 2, 32, 16, norms, seed=5)
    rope = _rope(case)
    args = (case["table"], case["seq_lens"], case["scale"], case["heads"])
    cache_two, cache_one = case["kv"][0].clone(), case["kv"][0].clone()
    two = triton_paged_decode_attention_rope(rope, cache_two, *args, num_splits=3)
    tickets = merge_tickets(5, 2, cache_one.device)
    one = triton_paged_decode_attention_rope(rope, cache_one, *args, num_splits=3, tickets=tickets)
    assert torch.equal(one, two)
    assert torch.equal(cache_one, cache_two)
    assert not tickets.any()


def test_tickets_of_another_shape_are_refused() -> None:
    g = SMALL
    q, kv, table, seq_lens = _operands(g, [3, 20], seed=1, device=DEVICE)
    for bad in (
        merge_tickets(2, g.num_kv_heads + 1, q.device),  # another kv-head count
        merge_tickets(3, g.num_kv_heads, q.device),  # another row count
        merge_tickets(2, g.num_kv_heads, q.device).to(torch.int64),
        merge_tickets(g.num_kv_heads, 2, q.device).t(),  # not contiguous
    ):
        with pytest.raises(ValueError, match="tickets"):
            triton_paged_decode_attention(q, kv, table, seq_lens, g.scale, tickets=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("g", [SERVING, SMOL], ids=["qwen3-8b", "smollm2"])
def test_the_merge_in_the_split_kernel_gives_the_merge_kernels_bits_on_the_gpu(
    g: Geometry,
) -> None:
    """Compiled at serving's split count, up to 4096 tokens: the splits arrive in any
    order, and the last merges. Eager, then captured and replayed over the same
    tickets (as a step's layers share them)."""
    lengths = [1, 63, 64, 65, 0, 1000, 4096, 4095]
    for seed in range(3):
        q, kv, table, seq_lens = _operands(g, lengths, seed, "cuda")
        tickets = merge_tickets(len(lengths), g.num_kv_heads, q.device)
        two = triton_paged_decode_attention(q, kv, table, seq_lens, g.scale)
        one = triton_paged_decode_attention(q, kv, table, seq_lens, g.scale, tickets=tickets)
        assert torch.equal(one, two), seed
        assert not tickets.any(), seed
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = triton_paged_decode_attention(q, kv, table, seq_lens, g.scale, tickets=tickets)
    for _ in range(20):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, two)
        assert not tickets.any()
