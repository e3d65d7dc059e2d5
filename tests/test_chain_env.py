"""``bench/chain_env.sh``: the shared start of a detached chain on the GPU machine,
sourced on the development CPU over an empty wheel folder (nothing to install) and
without nvidia-smi."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_chain_gets_its_environment_and_its_step_log(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    script = (
        f". bench/chain_env.sh {wheels} || exit 9\n"
        'echo "$PYTHONPATH|$WORK|$TRITON_CACHE_DIR|$TORCHINDUCTOR_CACHE_DIR"\n'
        "step prepare 0\nstep flare 3\n"
    )
    env = {"PATH": "/usr/bin:/bin", "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work")}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    site, work, triton_cache, inductor_cache = done.stdout.splitlines()[0].split("|")
    assert site == str(tmp_path / "site") and work == str(tmp_path / "work")
    assert (tmp_path / "work").is_dir()
    assert triton_cache == "/tmp/flare-triton" and inductor_cache == "/tmp/flare-inductor"
    lines = (out / "steps.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == ["prepare rc=0", "flare rc=3"]
    assert (out / "machine.txt").exists()
    assert not (out / "install.log").exists()  # no wheels: nothing installed


def test_sourcing_outside_a_detached_chain_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "-c", ". bench/chain_env.sh"], cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "bench/detached.sh" in done.stderr


def test_a_wheel_that_does_not_install_stops_the_chain(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip archive")
    env = {"PATH": "/usr/bin:/bin", "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work")}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", f". bench/chain_env.sh {wheels} || exit 9\necho ran on"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 9 and "ran on" not in done.stdout
    assert "installing" in done.stderr and (out / "install.log").exists()


def test_issue23_chain_logs_an_unknown_part_and_goes_on(tmp_path: Path) -> None:
    """``bench/issue23_chain.sh`` runs its parts in order; a part it does not know is
    a failed step (rc=2) in steps.txt, and the chain still ends."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work"), "FLARE": "/bin/true"}  # fmt: skip
    done = subprocess.run(
        ["bash", "bench/issue23_chain.sh", "bogus", "other"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "chain done"
    assert "unknown part bogus" in done.stderr
    lines = (out / "steps.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == ["bogus rc=2", "other rc=2"]
