"""``bench/chain_env.sh``: the shared start of a detached chain on the GPU machine,
sourced on the development CPU over an empty wheel folder (nothing to install) and
without nvidia-smi."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_chain_gets_its_environment_and_its_step_log(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    script = (
        ". bench/chain_env.sh || exit 9\n"
        'echo "$PYTHONPATH|$WORK|$TRITON_CACHE_DIR|$TORCHINDUCTOR_CACHE_DIR"\n'
        "step prepare 0\nstep flare 3\n"
    )
    env = {"PATH": "/usr/bin:/bin", "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work"), "CHAIN_WHEELS": str(wheels)}  # fmt: skip
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
           "WORK": str(tmp_path / "work"), "CHAIN_WHEELS": str(wheels)}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", ". bench/chain_env.sh || exit 9\necho ran on"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 9 and "ran on" not in done.stdout
    assert "installing" in done.stderr and (out / "install.log").exists()


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel of one empty package, written by hand (no build backend)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{file},,\n" for file in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for file, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(file, text)
    return path


def _source(tmp_path: Path, wheels: Path, path: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {"PATH": path, "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work"), "CHAIN_WHEELS": str(wheels)}  # fmt: skip
    return subprocess.run(
        ["bash", "-c", ". bench/chain_env.sh || exit 9\necho ran on"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_carried_wheels_land_in_site(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "flare_probe", "0.1.0")
    python = Path(sys.executable).parent
    done = _source(tmp_path, wheels, f"{python}:/usr/bin:/bin")
    assert done.returncode == 0 and "ran on" in done.stdout, done.stderr
    assert (tmp_path / "site" / "flare_probe-0.1.0.dist-info").is_dir()


def test_a_wheel_missing_after_a_quiet_install_stops_the_chain(tmp_path: Path) -> None:
    """A chain once went on after an install that printed nothing and left one wheel's
    package out of SITE; each step that imported it failed minutes later. A pip that
    succeeds and installs nothing stands in for that install here."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "flare_probe", "0.1.0")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\necho fake python 3.12\n")
    fake.chmod(0o755)
    done = _source(tmp_path, wheels, f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 9 and "ran on" not in done.stdout
    assert "flare_probe-0.1.0 not installed" in done.stderr
    log = (tmp_path / "out" / "install.log").read_text()
    assert "missing from" in log and "flare_probe-0.1.0-py3-none-any.whl" in log


def test_issue23_chain_logs_an_unknown_part_and_goes_on(tmp_path: Path) -> None:
    """``bench/issue23_chain.sh`` runs its parts in order; a part it does not know is
    a failed step (rc=2) in steps.txt, and the chain still ends."""
    out = tmp_path / "out"
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "DETACHED_OUT": str(out), "SITE": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work"), "FLARE": "/bin/true",
           "CHAIN_WHEELS": str(tmp_path / "no-wheels")}  # fmt: skip
    done = subprocess.run(
        ["bash", "bench/issue23_chain.sh", "bogus", "other"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "chain done"
    assert "unknown part bogus" in done.stderr
    lines = (out / "steps.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == ["bogus rc=2", "other rc=2"]


def test_issue23_chain_stops_at_preflight_without_its_wheels(tmp_path: Path) -> None:
    """A part that serves needs the carried wheels and the binary: without them the
    chain logs a failed preflight and ends before the part's first step."""
    out = tmp_path / "out"
    out.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"  # every import fails; nothing else would run on a CPU
    fake.write_text("#!/bin/sh\necho No module named flare_heliopause >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DETACHED_OUT": str(out),
           "SITE": str(tmp_path / "site"), "WORK": str(tmp_path / "work"),
           "FLARE": "/bin/true", "CHAIN_WHEELS": str(tmp_path / "no-wheels")}  # fmt: skip
    done = subprocess.run(
        ["bash", "bench/issue23_chain.sh", "8b", "smol"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "chain done" not in done.stdout
    assert "preflight failed" in done.stderr
    lines = (out / "steps.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == ["preflight rc=1"]
    assert "flare_heliopause" in (out / "preflight.log").read_text()


def test_issue23_chain_installs_the_wheels_whatever_its_parts(tmp_path: Path) -> None:
    """The chain is called with its parts as arguments; its wheels are still
    ``CHAIN_WHEELS``' (a first session's chain took its first part for the folder and
    installed nothing)."""
    out = tmp_path / "out"
    out.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "flare_probe", "0.1.0")
    python = Path(sys.executable).parent
    env = {"PATH": f"{python}:/usr/bin:/bin", "DETACHED_OUT": str(out),
           "SITE": str(tmp_path / "site"), "WORK": str(tmp_path / "work"),
           "CHAIN_WHEELS": str(wheels), "FLARE": "/bin/true"}  # fmt: skip
    done = subprocess.run(
        ["bash", "bench/issue23_chain.sh", "bogus"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "flare_probe-0.1.0.dist-info").is_dir()
