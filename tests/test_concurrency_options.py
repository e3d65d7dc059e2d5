"""bench/concurrency_options.py over a run's real files: an export's log and a
`flare replay --bench-decode` report (SmolLM2's stand-in at concurrency 4, H200)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.concurrency_options import export_report, main, summarize, table

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "bench/results/issue23/2026-12-05b-h200-head/smol-core"


def _option(root: Path, capacity: int, bench: str) -> None:
    folder = root / f"c{capacity}"
    folder.mkdir(parents=True)
    shutil.copy(RUN / "prepare.log", folder / "prepare.log")
    shutil.copy(RUN / bench, folder / "replay.json")


def test_each_option_reports_capture_memory_and_throughput(tmp_path: Path) -> None:
    _option(tmp_path, 4, "bench-decode-c4.json")
    assert export_report(tmp_path / "c4/prepare.log")["graphs"] == 13
    (row,) = summarize(tmp_path, "smollm2-135m")["options"]
    assert row["max_concurrency"] == 4 and row["graphs"] == 13
    # An older export's report predates the capture time: absent, not invented.
    assert row["compile_capture_s"] is None and row["export_s"] == pytest.approx(179.83, abs=0.01)
    assert row["caches"] is None
    backed = row["backed_gib"]
    assert backed["weights"] == pytest.approx(325058560 / 2**30)
    assert backed["total"] == pytest.approx(
        (325058560 + 2097152 * 2 + 757071872 + 190840832 + 278921216) / 2**30
    )
    assert row["kv_pages"] == 513
    assert row["tokens_per_s"] == pytest.approx(4 * 1000 / 0.782611)
    assert main(["summarize", str(tmp_path), "--model", "smollm2-135m"]) == 0
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["options"][0]["step_median_ms"] == pytest.approx(0.782611)


def test_each_option_names_its_compile_caches_state(tmp_path: Path) -> None:
    _option(tmp_path, 4, "bench-decode-c4.json")
    (tmp_path / "c4/caches.txt").write_text("warm\n")
    (row,) = summarize(tmp_path, "smollm2-135m")["options"]
    assert row["caches"] == "warm"
    assert "| 4 | 13 | warm |" in table(summarize(tmp_path, "smollm2-135m"))


def test_a_bench_of_another_capacity_or_no_option_is_refused(tmp_path: Path) -> None:
    _option(tmp_path / "mixed", 8, "bench-decode-c4.json")
    with pytest.raises(ValueError, match="the bench ran capacity 4"):
        summarize(tmp_path / "mixed", "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no option"):
        summarize(tmp_path / "empty", "m")
    (tmp_path / "log").write_text("no report here\n")
    with pytest.raises(ValueError, match="holds no export report"):
        export_report(tmp_path / "log")


def test_an_option_cut_off_is_listed_as_unfinished_beside_the_finished(tmp_path: Path) -> None:
    # A run that ran out of time: c4 finished, c16's preparation stopped in its capture
    # and c8's bench never wrote its report. Before, the summary failed on c16.
    _option(tmp_path, 4, "bench-decode-c4.json")
    (tmp_path / "c16").mkdir()
    (tmp_path / "c16/prepare.log").write_text("warm-up and capture: 3/16\n")
    (tmp_path / "c8").mkdir()
    shutil.copy(RUN / "prepare.log", tmp_path / "c8/prepare.log")
    summary = summarize(tmp_path, "smollm2-135m")
    assert [row["max_concurrency"] for row in summary["options"]] == [4]
    assert summary["unfinished"] == [
        {"max_concurrency": 8, "reason": "the decode bench did not finish (no replay.json)"},
        {
            "max_concurrency": 16,
            "reason": "preparation did not finish (no export report in prepare.log)",
        },
    ]
    assert "- 16: unfinished, preparation did not finish" in table(summary)
