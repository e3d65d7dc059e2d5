"""The prefill kernel timeline's classes and FLOP counts, on a hand-made Chrome trace."""

from __future__ import annotations

import pytest
from test_kernel_timeline import _launch

from bench.kernel_timeline import summarize
from bench.prefill_timeline import classify, kernel_class, markdown, prefill_flops
from bench.suite.report import GEOMETRIES


def test_kernels_fall_in_their_classes() -> None:
    assert kernel_class("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_TNT") == "gemm"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") == "gemm"
    assert kernel_class("_prefill_kernel") == "attention"
    assert kernel_class("_prefill_split_kernel") == "attention"
    assert kernel_class("_prefill_history_kernel") == "attention"
    name = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"
    assert kernel_class(name) == "attention"
    assert kernel_class("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "other"
    assert kernel_class("_kv_write_kernel") == "other"


def test_the_8b_chunk_of_4096_counts_its_projections_and_causal_pairs() -> None:
    flops = prefill_flops(GEOMETRIES["qwen3-8b"], 4096)
    # 6.95 G projection parameters (36 layers of 4096 x 6144, 4096 x 4096 and three
    # 4096 x 12288), twice per token; 32 heads of 128 over 4096 x 4097 / 2 pairs.
    assert flops["gemm"] == 2 * 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288) * 4096
    assert flops["gemm"] == pytest.approx(56.9e12, rel=1e-3)
    assert flops["attention"] == 4 * 32 * 128 * 36 * 4096 * 4097 / 2
    assert flops["attention"] == pytest.approx(4.95e12, rel=1e-3)


def test_busy_time_by_class_counts_overlaps_once_and_takes_the_median() -> None:
    events = [
        # A GEMM, then attention starting under its tail (2 us of overlap), a gap of
        # 3, an elementwise kernel.
        *_launch(1, 0.0, [("nvjet_a", 0, 10), ("_prefill_kernel", 8, 6), ("triton_poi", 17, 1)]),
        *_launch(2, 100.0, [("nvjet_a", 0, 12), ("_prefill_kernel", 12, 6), ("triton_poi", 18, 1)]),
        *_launch(3, 200.0, [("nvjet_a", 0, 30), ("_prefill_kernel", 30, 6), ("triton_poi", 36, 1)]),
    ]
    busy = classify(events)
    assert busy == {"gemm": 12.0, "attention": 6.0, "other": 1.0, "gaps": 0.0}
    one = classify(events[:4])
    assert one == {"gemm": 10.0, "attention": 4.0, "other": 1.0, "gaps": 3.0}


def test_markdown_gives_each_length_its_rates() -> None:
    events = _launch(1, 0.0, [("nvjet_a", 0, 10), ("_prefill_kernel", 10, 5)])
    summary = summarize(events, layers=1, wall_us=[16.0])
    summary.update(
        capacity=512,
        chunk_us=15.0,
        chunk_p99_us=16.0,
        busy_by_class_us=classify(events),
        tflops={"gemm": 600.0, "attention": 300.0, "both": 550.0},
    )
    text = markdown({"model": "m", "lengths": {"512": summary}})
    assert "| 512 | 512 | 15.0 | 16.0 | 2 | 10.0 | 5.0 | 0.0 | 0.0 | 600 | 300 | 550 |" in text
    assert "`nvjet_a` | gemm" in text
