"""``ignition prepare MODEL --out CORE`` on the GPU: a tiny random Llama and Qwen3 are
prepared inside the fixed-address window and exported; the core is read back and
checked for agreement (every kernel's image present, every buffer inside its
region, a qualification sequence covering every graph). With a ``flare`` binary
(``FLARE_BIN``, default ``target/release/flare``) the core is also replayed by
Helios and must match bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoints import write_tiny

from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import read_core_dir

ROOT = Path(__file__).resolve().parent.parent


PREPARATION = ["--max-concurrency", "4", "--prefill-chunk-size", "256", "--context-limit", "512"]
PREPARATION += ["--kv-pages", "64", "--snapshot-rows", "2", "--no-compile"]
REQUESTS = ["--prompt", "Name three rivers.", "--prompt", "Count to five.", "--prompt", "Hi"]
REQUESTS += ["--max-new-tokens", "24", "--temperature", "0.8", "--top-k", "20", "--seed", "7"]


def _ignition(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "ignition.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def _export(checkpoint: Path, core: Path, *extra: str) -> dict[str, object]:
    done = _ignition("prepare", str(checkpoint), "--out", str(core), *PREPARATION, *extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(done.stdout[done.stdout.rfind("\n{") + 1 :])


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp(request.param)
    checkpoint = write_tiny(tmp / "ckpt", request.param, hidden=128, head_dim=32)
    core_dir = tmp / "core"
    report = _export(checkpoint, core_dir)
    assert report["core"] == str(core_dir)
    return core_dir


@pytest.mark.gpu
def test_exported_core_agrees(exported: Path) -> None:
    core, initial, images = read_core_dir(exported)
    # decode 1/2/4, prefill 128/256, resume, admit, snapshot, restore
    assert len(core.graphs) == 3 + 2 + 4
    assert core.window.base == 0x200000000000
    kernels = [n.kernel for g in core.graphs for n in g.nodes if n.HasField("kernel")]
    assert kernels and {k.image_sha256 for k in kernels} <= set(images)
    regions = list(core.window.regions)
    for buffer in core.buffers:
        end = buffer.offset + buffer.size_bytes
        assert any(
            r.offset <= buffer.offset and end <= r.offset + r.backed_bytes for r in regions
        ), buffer.name
    assert "weight.rotary.cos" in initial and "state.stop_tokens" in initial
    steps = core.qualification.steps
    assert {s.graph for s in steps} == set(range(len(core.graphs)))
    assert core.identity.compute_capability_major >= 8 and core.identity.sm_count > 0
    assert pb.GRAPH_KIND_RESTORE in {g.kind for g in core.graphs}


@pytest.mark.gpu
def test_native_replay_matches_python(exported: Path, tmp_path: Path) -> None:
    flare = Path(os.environ.get("FLARE_BIN", ROOT / "target/release/flare"))
    if not flare.is_file():
        pytest.skip(f"no flare binary at {flare}")
    done = subprocess.run(
        [str(flare), "replay", str(exported), "--check", "--json", str(tmp_path / "check.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


@pytest.mark.gpu
def test_in_process_replay_through_heliopause(exported: Path) -> None:
    """The design's in-process diagnostic path: Helios replays the core inside a
    Python process (one that never opened the preparation window)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = (
        "import json, sys, flare_heliopause as hp\n"
        "report = json.loads(hp.replay_check(sys.argv[1]))\n"
        "q = report['qualification']\n"
        "print('RESULT', q['matched_steps'], q['total_steps'], q['allocation_free'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(exported)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:]
    matched, total, allocation_free = lines[-1].split()[1:]
    assert int(matched) == int(total) > 0 and allocation_free == "True"


@pytest.mark.gpu
def test_the_exporting_process_answers_as_a_fresh_harness(tmp_path: Path) -> None:
    """``prepare --out CORE --replay-out`` answers over the exported graphs after
    resetting them to the core's initial contents: the same tokens as the harness of a
    separate preparation (``replay``), so serving checks need one preparation."""
    checkpoint = write_tiny(tmp_path / "ckpt", "llama", hidden=128, head_dim=32)
    report = _export(
        checkpoint, tmp_path / "core", "--replay-out", str(tmp_path / "in.json"), *REQUESTS
    )
    assert report["timings"]["after_export_s"] > 0
    done = _ignition(
        "replay", str(checkpoint), *PREPARATION, *REQUESTS, "--out", str(tmp_path / "own.json")
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    exported = json.loads((tmp_path / "in.json").read_text())
    fresh = json.loads((tmp_path / "own.json").read_text())
    assert exported["sampling"] == fresh["sampling"]
    assert [r["tokens"] for r in exported["results"]] == [r["tokens"] for r in fresh["results"]]
    assert all(len(r["tokens"]) > 0 for r in exported["results"])


def test_replay_answers_need_an_export(tmp_path: Path) -> None:
    done = _ignition("prepare", "--replay-out", str(tmp_path / "answers.json"), "--device", "cpu")
    assert done.returncode == 2
    assert "--replay-out answers over exported graphs: it needs --out" in done.stderr
    assert not (tmp_path / "answers.json").exists()
