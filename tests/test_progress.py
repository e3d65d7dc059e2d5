"""Preparation progress in a log (stderr not a terminal): each named item prints the
seconds it took, so a slow compile shows which graph it was."""

from __future__ import annotations

import re
import time

import pytest

from ignition.preparation.progress import phase


def test_plain_progress_names_each_item_and_its_seconds(capsys: pytest.CaptureFixture) -> None:
    with phase("warm-up and capture", 3) as advance:
        time.sleep(0.2)
        advance(1, "prefill@4096")
        advance(1)
        advance(1, "decode@1")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "warm-up and capture: 0/3"
    assert lines[-1] == "warm-up and capture: 3/3 done"
    first = re.fullmatch(r"  prefill@4096: 1/3 after (\d+\.\d) s", lines[1])
    assert first and float(first.group(1)) >= 0.1
    assert re.fullmatch(r"  decode@1: 3/3 after \d+\.\d s", lines[2])
    assert len(lines) == 4
