"""``scripts/serve.sh`` on a machine without an NVIDIA driver: it must say so in one
line and stop before it installs anything (it once installed and built for about 15
minutes, then failed on CUPTI).

The script runs from a copy laid out like the repository (``TMP/scripts/serve.sh``,
so it works in ``TMP``: a ``.venv`` it created would appear there), with ``python3``,
``pip`` and ``cargo`` shims first on ``PATH`` that record any call. Where a driver is
present the test skips: the script would start a real install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serve.sh"
SHIMS = ("python3", "python", "pip", "pip3", "cargo", "maturin")


def _linker_cache_has_libcuda() -> bool:
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        listed = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return "libcuda.so.1 " in listed.stdout


def _driver_signs() -> list[str]:
    """Any sign of an NVIDIA driver (wider than the script's check, so that the test
    never starts a real install)."""
    signs = []
    if shutil.which("nvidia-smi"):
        signs.append("nvidia-smi on PATH")
    if Path("/proc/driver/nvidia/version").exists():
        signs.append("/proc/driver/nvidia/version")
    if _linker_cache_has_libcuda():
        signs.append("libcuda.so.1 in ldconfig -p")
    return signs


@pytest.fixture
def repo_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """``(repo, calls, bin)``: the script in ``repo/scripts``, a log the shims append
    their names to, and the folder of the shims."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "serve.sh")
    calls = tmp_path / "calls.log"
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in SHIMS:
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\nexit 1\n')
        shim.chmod(0o755)
    return repo, calls, shims


@pytest.mark.serial
def test_serve_refuses_in_one_line_without_an_nvidia_driver(
    repo_copy: tuple[Path, Path, Path],
) -> None:
    signs = _driver_signs()
    if signs:
        pytest.skip(f"an NVIDIA driver may be present ({', '.join(signs)})")
    repo, calls, shims = repo_copy
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FLARE_SKIP_GPU_CHECK", None)
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(repo / "scripts" / "serve.sh"), "--port", "0"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert elapsed < 5, elapsed
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("serve.sh: no NVIDIA driver found"), lines[0]
    assert "scripts/test.sh" in lines[0]
    assert done.stdout == ""
    assert not (repo / ".venv").exists()
    assert not (repo / ".flare").exists()
    assert not calls.exists(), calls.read_text()
