"""The decode kernel timeline's aggregation, on a hand-made Chrome trace."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from bench.concurrency_report import table as concurrency_table
from bench.fastest_fusion import fastest
from bench.fastest_fusion import table as fusion_table
from bench.kernel_timeline import _graphs, _p99, head_weight, markdown, summarize


def _launch(correlation: int, start: float, kernels: list[tuple[str, float, float]]) -> list:
    events: list[dict[str, Any]] = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaGraphLaunch",
            "ts": start,
            "dur": 3.0,
            "args": {"correlation": correlation},
        }
    ]
    for name, offset, duration in kernels:
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "ts": start + offset,
                "dur": duration,
                "args": {"correlation": correlation, "graph id": 7},
            }
        )
    return events


def test_kernels_group_by_their_graph_launch() -> None:
    events = [
        # A kernel launched outside any graph and a CPU op are ignored.
        {
            "ph": "X",
            "cat": "kernel",
            "name": "stray",
            "ts": 0,
            "dur": 50,
            "args": {"correlation": 1},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9, "args": {}},
        *_launch(10, 100.0, [("gemm", 5, 10), ("norm", 16, 2), ("gemm", 20, 10)]),
        *_launch(20, 200.0, [("gemm", 5, 12), ("norm", 18, 2), ("gemm", 22, 12)]),
        *_launch(30, 300.0, [("gemm", 5, 10), ("norm", 16, 2), ("gemm", 20, 10)]),
    ]
    summary = summarize(events, layers=2, wall_us=[40.0, 50.0, 45.0])
    assert summary["launches"] == 3
    assert summary["kernels_per_launch"] == 3
    assert summary["kernels_per_layer"] == 1.5
    # Summed kernel time per launch: 22, 26, 22; GPU spans: 25, 29, 25.
    assert summary["kernel_us"] == 22
    assert summary["span_us"] == 25
    assert summary["wall_us"] == 45
    assert summary["kernel_over_span"] == pytest.approx(22 / 25)
    assert summary["kernel_over_wall"] == pytest.approx(22 / 45)
    gemm, norm = summary["top_kernels"]
    assert (gemm["name"], gemm["per_launch"], gemm["median_us"]) == ("gemm", 2, 10)
    assert gemm["total_us_per_launch"] == pytest.approx(64 / 3)
    assert (norm["name"], norm["per_launch"]) == ("norm", 1)
    table = markdown({"model": "m", "capacities": {"1": summary}})
    assert "| 1 | 3 | 1.5 | 22.0 | 25.0 | 45.0 | 0.880 | 0.489 | - | - | - | - |" in table
    summary.update(step_us=41.0, step_p99_us=44.5, roofline_us=32.8, step_over_roofline=1.25)
    table = markdown({"model": "m", "capacities": {"1": summary}})
    assert "| 0.489 | 41.0 | 44.5 | 32.8 | 1.250 |" in table
    assert "| `gemm` | 2.0 | 10.00 | 21.33 |" in table


def test_the_compared_launch_is_tabled_beside_the_prepared_one() -> None:
    prepared = {"kernels_per_launch": 3, "kernel_us": 22.0, "busy_us": 22.0, "span_us": 25.0}
    prepared.update(step_us=40.0, step_p99_us=44.0, gap_us=3.0)
    compared = {"kernels_per_launch": 3, "kernel_us": 23.0, "busy_us": 19.0, "span_us": 21.0}
    compared.update(step_us=36.0, step_p99_us=37.5, gap_us=2.0)
    gap = {"before": "norm", "after": "gemm", "per_launch": 1, "median_us": 2}
    compared["top_gaps"] = [{**gap, "total_us_per_launch": 2}]
    results = {
        "model": "m",
        "capacities": {"1": {**prepared, "kernels_per_layer": 1.5, "top_kernels": []}},
        "compared": {"programmatic": {"programmatic_launch": True, "capacities": {"1": compared}}},
    }
    for row in results["capacities"].values():
        row.update(wall_us=45.0, kernel_over_span=0.88, kernel_over_wall=0.49)
    table = markdown(results)
    assert "captured with programmatic launch on, early weights off" in table
    row = "| 1 | 40.0 | 36.0 | 0.900 | 44.0 | 37.5 | 22.0 | 19.0 | 25.0 | 21.0 | 3.0 | 2.0 |"
    assert row in table
    # The compared launch's gaps are tabled too (the prepared one here has none).
    assert "## Capacity 1, programmatic: gaps between kernels" in table
    assert "## Capacity 1: gaps" not in table
    assert "| `norm` | `gemm` | 1.0 | 2.00 | 2.00 |" in table
    # Early weights, compared beside a plain launch.
    early = {"programmatic_launch": True, "early_weights": True, "capacities": {"1": compared}}
    plain = {"programmatic_launch": False, "capacities": {"1": compared}}
    table = markdown({**results, "compared": {"early weights": early, "plain": plain}})
    assert "captured with programmatic launch on, early weights on" in table
    assert "captured with programmatic launch off\n" in table
    assert "## Capacity 1, early weights: gaps between kernels" in table
    # Every bandwidth probe is tabled, in TB/s.
    probes = {"torch_sum": 4.13e12, "stream_read": 4.02e12, "rows_linear": 4.551e12}
    table = markdown({**results, "bandwidth_probes": probes})
    assert "torch_sum 4.13, stream_read 4.02, rows_linear 4.55." in table


def test_a_compared_graph_stands_in_for_the_prepared_one_within_the_block() -> None:
    prepared = SimpleNamespace(graphs={"decode": "own", "prefill": "own prefill"})
    with _graphs(prepared, "decode", {"decode": "other"}):
        assert prepared.graphs == {"decode": "other", "prefill": "own prefill"}
    assert prepared.graphs["decode"] == "own"
    with pytest.raises(RuntimeError), _graphs(prepared, "decode", {"decode": "other"}):
        raise RuntimeError("replay failed")
    assert prepared.graphs["decode"] == "own"
    with _graphs(prepared, "decode", None):
        assert prepared.graphs["decode"] == "own"


def test_overlapping_kernels_count_once_in_the_busy_time() -> None:
    # Programmatic launch: the second kernel starts (and waits) under the first's tail.
    events = _launch(10, 100.0, [("gemm", 5, 10), ("gemm2", 12, 10), ("norm", 25, 2)])
    summary = summarize(events, layers=1)
    assert summary["kernel_us"] == 22  # summed: the wait counted twice
    assert summary["busy_us"] == 19  # [105, 122) and [125, 127)
    assert summary["span_us"] == 22
    # Without overlap the busy time is the sum.
    plain = summarize(_launch(10, 100.0, [("gemm", 5, 10), ("norm", 16, 2)]), layers=1)
    assert plain["busy_us"] == plain["kernel_us"] == 12


def test_gaps_are_attributed_to_the_kernels_around_them_and_sum_to_span_less_busy() -> None:
    # Launch 1: norm -> gemm 3 us; "pdl" starts under gemm's tail and leaves no gap;
    # gemm2 -> norm 1 us (gemm2 ends last, so the gap follows it, not gemm or pdl);
    # norm -> norm 2 us.
    first = [("norm", 0, 2), ("gemm", 5, 10), ("pdl", 12, 1), ("gemm2", 13, 5)]
    first += [("norm", 19, 2), ("norm", 23, 1)]
    second = [("norm", 0, 2), ("gemm", 4, 10), ("norm", 15, 2)]
    summary = summarize([*_launch(10, 100.0, first), *_launch(20, 200.0, second)], layers=1)
    gaps = {(g["before"], g["after"]): g for g in summary["top_gaps"]}
    assert set(gaps) == {("norm", "gemm"), ("gemm2", "norm"), ("norm", "norm"), ("gemm", "norm")}
    assert gaps[("norm", "gemm")]["per_launch"] == 1  # 3 us and 2 us
    assert gaps[("norm", "gemm")]["total_us_per_launch"] == 2.5
    assert gaps[("gemm2", "norm")]["total_us_per_launch"] == 0.5  # 1 us, in one launch
    assert gaps[("norm", "norm")]["median_us"] == 2
    assert summary["top_gaps"][0]["before"] == "norm"  # the largest total first
    # Per launch, the gaps are the span less the busy time.
    for launch, expected in zip(summary["per_launch"], (3 + 1 + 2, 2 + 1), strict=True):
        assert launch["span_us"] - launch["busy_us"] == expected
    assert summary["gap_us"] == (6 + 3) / 2  # the median of two launches
    table = markdown({"model": "m", "capacities": {"1": {**summary, "kernels_per_layer": 1}}})
    assert "## Capacity 1: gaps between kernels" in table
    assert "4.5 us of gaps a launch" in table
    assert "| `norm` | `gemm` | 1.0 | 2.50 | 2.50 |" in table


def test_an_empty_trace_reports_nothing_measured() -> None:
    summary = summarize([], layers=4)
    assert summary["launches"] == 0 and summary["kernels_per_launch"] is None
    assert summary["kernel_over_wall"] is None


def test_p99_is_an_observed_value() -> None:
    assert _p99([float(v) for v in range(1, 101)]) == 99.0
    assert _p99([5.0, 1.0, 3.0]) == 5.0
    assert _p99([2.0]) == 2.0


def _timeline(fusion: str, steps: dict[str, float | None]) -> dict[str, Any]:
    return {
        "options": {"decode_fusion": fusion},
        "capacities": {c: {"kernels_per_launch": 300, "step_us": us} for c, us in steps.items()},
    }


def test_the_fastest_fusion_is_chosen_at_one_capacity() -> None:
    results = [
        _timeline("none", {"1": 4400.0, "4": 4470.0}),
        _timeline("residuals", {"1": 4360.0, "4": 4500.0}),
        _timeline("norms", {"1": 4390.0, "4": 4420.0}),
    ]
    assert fastest(results) == "residuals"
    assert fastest(results, capacity=4) == "norms"
    # A timeline without that capacity's step is not a candidate.
    assert fastest([_timeline("none", {"1": 10.0}), _timeline("norms", {"4": 1.0})], 4) == "norms"
    with pytest.raises(ValueError, match="capacity 2"):
        fastest(results, capacity=2)
    assert "| residuals | 4 | 300 | 4500.0 | - | - | - |" in fusion_table(results)


def _option(option: int, step_c1: float, step: float) -> dict[str, Any]:
    memory = {"operator_scratch_and_graph_pool": 3 * (1 << 20), "kv_page_count": 100 - option}
    capacities = {"1": {"step_us": step_c1}, str(option): {"step_us": step, "step_p99_us": step}}
    capacities[str(option)]["tokens_per_s"] = option / (step * 1e-6)
    return {
        "preparation": {
            "max_concurrency": option,
            "decode_capacities": [1, 2, 4, 8, 16, 32][: option.bit_length()],
            "timings_s": {"load_s": 1.5, "compile_capture_s": 10.0 * option},
            "memory_bytes": memory,
        },
        "capacities": capacities,
    }


def test_the_concurrency_options_are_tabled_in_ascending_order() -> None:
    text = concurrency_table([_option(32, 4400.0, 6000.0), _option(8, 4390.0, 4700.0)])
    lines = text.splitlines()
    assert len(lines) == 4
    # 8 requests a step of 4.7 ms: 1,702 tokens/s; 32 of 6 ms: 5,333.
    assert lines[2].startswith("| 8 | 4 | 1.5 | 80.0 | 3.0 | 92 | 4,390.0 | 4,700.0 |")
    assert "| 1,702 | - |" in lines[2]
    assert lines[3].startswith("| 32 | 6 | 1.5 | 320.0 |") and "| 5,333 | - |" in lines[3]


def test_busy_time_is_shared_by_kernel_grid_and_the_kernel_before() -> None:
    # Two projections of one name: after the norm (grid 1,192) and after attention
    # (grid 1,128); the second starts under attention's tail (a programmatic launch)
    # and its wait there is attention's share, not its own.
    def launch(correlation: int, start: float) -> list:
        events = _launch(
            correlation,
            start,
            [("norm", 0, 2), ("rows", 3, 10), ("attn", 14, 4), ("rows", 16, 9)],
        )
        grids = [[1, 1, 1], [1, 192, 1], [8, 1, 1], [1, 128, 1]]
        for event, grid in zip(events[1:], grids, strict=True):
            event["args"]["grid"] = grid
        return events

    summary = summarize([*launch(1, 100.0), *launch(2, 200.0)], layers=1)
    sites = {(s["name"], s["grid"], s["after"]): s for s in summary["top_sites"]}
    assert sites[("rows", "1,192,1", "norm")]["median_us"] == 10.0
    # The o-like projection ran 16..25 but attention held the GPU until 18.
    assert sites[("rows", "1,128,1", "attn")]["median_us"] == 7.0
    assert sites[("attn", "8,1,1", "rows")]["median_us"] == 4.0
    assert sites[("norm", "1,1,1", "")]["total_us_per_launch"] == 2.0
    # The shares sum to the busy time (2 + 10 + 4 + 7 = 23 of a 25 us span, 2 of gaps).
    total = sum(s["total_us_per_launch"] for s in summary["top_sites"])
    assert total == summary["busy_us"] == 23.0
    table = markdown({"model": "m", "capacities": {"1": {**summary, "step_us": None}}})
    assert "## Capacity 1: busy time by kernel, grid and the kernel before" in table
    assert "| `rows` | 1,128,1 | `attn` | 1.0 | 7.00 | 7.00 |" in table


def test_the_head_probe_reads_the_vocabulary_head_or_nothing() -> None:
    """The served head is the weight of the vocabulary's rows by the hidden size (the
    embeddings where tied); a model without one (a rank's shard) gets no head probe."""
    head = torch.empty(50, 8)
    model = SimpleNamespace(
        geometry=SimpleNamespace(vocab=50, hidden=8),
        weights={"qkv": torch.empty(24, 8), "lm_head.weight": head, "norm": torch.empty(8)},
    )
    assert head_weight(model) is head
    model.weights = {"qkv": torch.empty(24, 8), "lm_head.weight": torch.empty(25, 8)}
    assert head_weight(model) is None
