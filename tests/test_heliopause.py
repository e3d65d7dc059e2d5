"""The ``flare_heliopause`` extension reports the workspace's engine version.

The extension must be installed (``maturin build`` then ``pip install`` of the
wheel); a missing module fails the test unless ``FLARE_SKIP_HELIOPAUSE=1``.
"""

import importlib
import os
import tomllib
from pathlib import Path

import pytest

WORKSPACE_MANIFEST = Path(__file__).resolve().parent.parent / "Cargo.toml"


def _workspace_version() -> str:
    with WORKSPACE_MANIFEST.open("rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def _import_heliopause():
    try:
        return importlib.import_module("flare_heliopause")
    except ImportError as exc:
        if os.environ.get("FLARE_SKIP_HELIOPAUSE") == "1":
            pytest.skip(f"FLARE_SKIP_HELIOPAUSE=1 and flare_heliopause is not importable: {exc}")
        pytest.fail(
            f"flare_heliopause is not importable ({exc}); build and install it with "
            "`maturin build --release -m heliopause/Cargo.toml -o target/wheels` and "
            "`pip install target/wheels/flare_heliopause-*.whl`, "
            "or set FLARE_SKIP_HELIOPAUSE=1",
            pytrace=False,
        )


def test_engine_version_matches_workspace():
    heliopause = _import_heliopause()
    assert heliopause.engine_version() == _workspace_version()


def test_in_process_replay_reports_a_missing_core_before_any_cuda_work(tmp_path: Path):
    heliopause = _import_heliopause()
    missing = tmp_path / "no-core"
    with pytest.raises(heliopause.ReplayError, match=r"manifest\.pb"):
        heliopause.replay_check(str(missing))
    with pytest.raises(heliopause.ReplayError, match=r"manifest\.pb"):
        heliopause.replay_check(str(missing), isolate=True)
