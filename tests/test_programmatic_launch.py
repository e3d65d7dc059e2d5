"""Programmatic dependent launch of the weight-streaming decode kernels: when it is on,
and on the GPU the same bits as a plain launch with programmatic edges in the captured
graph (the kernels' PTX order is checked without a
GPU in tests/test_kernel_compile.py)."""

from __future__ import annotations

import pytest
import torch
import triton

from ignition.components import linear, programmatic_launch
from ignition.components.programmatic_launch import launch_kwargs, launches_programmatically
from ignition.components.triton_attention import (
    RopeInputs,
    triton_paged_decode_attention,
    triton_paged_decode_attention_rope,
)
from ignition.components.triton_kv_write import triton_rope_write_kv

CUDA = torch.device("cuda")


def _capability(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int]) -> None:
    """A GPU of ``capability`` running compiled kernels (these tests run Triton's
    interpreter)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)


def test_it_is_off_unless_preparation_turns_it_on_for_a_device_that_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _capability(monkeypatch, (9, 0))
    assert launch_kwargs(CUDA) == {}
    with programmatic_launch.programmatic_launch():
        assert launch_kwargs(CUDA) == {"launch_pdl": True}
        # The CPU (Triton's interpreter there) never launches programmatically.
        assert launch_kwargs(torch.device("cpu")) == {}
        with programmatic_launch.programmatic_launch(False):
            assert not launches_programmatically(CUDA)
        assert launches_programmatically(CUDA)
    assert launch_kwargs(CUDA) == {}
    _capability(monkeypatch, (8, 9))  # before grid dependency control
    with programmatic_launch.programmatic_launch():
        assert launch_kwargs(CUDA) == {}
    # Triton's interpreter runs no PTX: a plain launch whatever the setting.
    _capability(monkeypatch, (9, 0))
    monkeypatch.setattr(triton.knobs.runtime, "interpret", True)
    with programmatic_launch.programmatic_launch():
        assert launch_kwargs(CUDA) == {}


def test_the_setting_is_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), programmatic_launch.programmatic_launch(True, True):
        raise RuntimeError("capture failed")
    assert not programmatic_launch._enabled
    assert not programmatic_launch._early_weights


def test_the_kernels_options_follow_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Off: a plain launch on any device.
    assert programmatic_launch.kernel_options(CUDA) == {}
    # On, off the GPU: a plain launch.
    with programmatic_launch.programmatic_launch():
        assert programmatic_launch.kernel_options(torch.device("cpu")) == {}
    monkeypatch.setattr(programmatic_launch, "launch_kwargs", lambda device: {"launch_pdl": True})
    assert programmatic_launch.kernel_options(CUDA) == {"launch_pdl": True, "PDL": True}
    # Early weights: for the row projections alone (which pass their early steps),
    # and only when asked for.
    assert programmatic_launch.kernel_options(CUDA, early_steps=2) == {
        "launch_pdl": True,
        "PDL": True,
    }
    with programmatic_launch.programmatic_launch(True, early_weights=True):
        assert programmatic_launch.kernel_options(CUDA) == {"launch_pdl": True, "PDL": True}
        assert programmatic_launch.kernel_options(CUDA, early_steps=2) == {
            "launch_pdl": True,
            "PDL": True,
            "EARLY_WEIGHTS": 2,
        }
    # A plain launch has no early weights: nothing to load them before.
    monkeypatch.setattr(programmatic_launch, "launch_kwargs", lambda device: {})
    with programmatic_launch.programmatic_launch(True, early_weights=True):
        assert programmatic_launch.kernel_options(CUDA, early_steps=2) == {}


# ----------------------------------------------------------------------------- GPU


def _programmatic_edges(graph: torch.cuda.CUDAGraph) -> tuple[int, int]:
    """(programmatic edges, all edges) of a graph captured with ``keep_graph``."""
    from ignition.export.graph_walk import _driver, _graph_edges, _graph_nodes

    cu = _driver("test")
    raw = cu.CUgraph(int(graph.raw_cuda_graph()))
    nodes = _graph_nodes(cu, raw, "test")
    edges = _graph_edges(cu, raw, {int(node): i for i, node in enumerate(nodes)}, "test")
    return sum(1 for edge in edges if edge.type != 0), len(edges)


@pytest.mark.gpu
def test_programmatic_launch_computes_the_same_bits_and_captures_programmatic_edges_on_gpu() -> (
    None
):
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16)

    x, w, b = rand(20, 4096), rand(6144, 4096) / 64, rand(6144)
    gate_up, narrow = rand(2 * 4096, 4096) / 64, rand(128, 4096) / 64
    norm = linear.RowStatistic(linear.group_squares(x), 1e-6)
    residual = rand(20, 6144)
    # Decode attention over 20 rows of 300 cached tokens in 64-token pages, then the
    # o projection: the attention's merge lets the projection launch at its start.
    kv = rand(2, 20 * 5, 64, 8, 128)
    table = torch.arange(20 * 5, dtype=torch.int32, device="cuda").view(20, 5)
    lengths = torch.full((20,), 300, dtype=torch.int32, device="cuda")
    o = rand(4096, 4096) / 64

    # The rotary/KV write of h as a packed projection (32 query and 8 kv heads of 128)
    # at position 299 of each row (page 4, offset 43), with Qwen3's q/k norms.
    cos, sin = rand(20, 128), rand(20, 128)
    q_norm, k_norm = rand(128).abs() + 0.5, rand(128).abs() + 0.5
    rows = table[:, 4].long() * 64 + 43
    kv_fused = kv.clone()

    def step() -> list[torch.Tensor]:
        squares = torch.empty(20, 6144 // linear.SQUARE_GROUP, device="cuda")
        h = linear.triton_rows_linear(x, w, b, norm=norm, residual=residual, squares=squares)
        h_norm = linear.RowStatistic(squares[:, : 4096 // linear.SQUARE_GROUP], 1e-6)
        g = linear.triton_rows_gated(h[:, :4096].contiguous(), gate_up, h_norm)
        narrowed = linear.triton_rows_split_linear(g, narrow, None)
        q = triton_rope_write_kv(kv, h, q_norm, k_norm, 1e-6, cos, sin, rows, 32)
        a = triton_paged_decode_attention(q, kv, table, lengths, 128**-0.5)
        y = linear.triton_rows_linear(a.reshape(20, 4096), o, None, residual=x)
        # The same rotary write inside the attention's split kernel, over a copy.
        rope = RopeInputs(h, q_norm, k_norm, 1e-6, cos, sin, rows)
        fused = triton_paged_decode_attention_rope(rope, kv_fused, table, lengths, 128**-0.5, 32)
        return [h, squares, g, narrowed, q, kv.clone(), a, y, fused, kv_fused.clone()]

    plain = step()
    # Launched programmatically, then with early weights too: each eager, then
    # captured and replayed.
    for early in (False, True):
        with programmatic_launch.programmatic_launch(True, early):
            eager = step()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(graph):
                captured = step()
        torch.cuda.synchronize()
        programmatic, edges = _programmatic_edges(graph)
        graph.replay()
        torch.cuda.synchronize()
        for a, e, c in zip(plain, eager, captured, strict=True):
            assert torch.equal(a, e), early
            assert torch.equal(a, c), early
        # Programmatic: the gated kernel after the copy of h, the split after the
        # gated, the rotary/KV write after the split's sum, the attention's split
        # after it, its merge after the split, the o projection after the merge (the
        # split's sum and the copies launch plainly), then the split finishing the
        # projection itself and its merge.
        assert programmatic >= 8, (programmatic, edges)
    # The rotary write inside the split: the two launches' attention and cache.
    assert torch.equal(plain[8], plain[6]) and torch.equal(plain[9], plain[5])
