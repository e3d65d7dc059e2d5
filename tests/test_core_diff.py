"""bench/core_diff.py over CPU fixture cores: two preparations of one checkpoint
write the same core, byte for byte, and a changed tensor or manifest field is named
(the re-export check's comparison, bench/reexport_check.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import BUFFERS, MANIFEST

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from core_diff import compare

ROOT = Path(__file__).resolve().parents[1]


def _fixture(out: Path) -> Path:
    command = [sys.executable, "-m", "ignition.export.manifest", "--fixture", str(out)]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True, timeout=300)
    return out


def test_two_exports_of_one_checkpoint_are_identical_and_changes_are_named(
    tmp_path: Path,
) -> None:
    a, b = _fixture(tmp_path / "a"), _fixture(tmp_path / "b")
    same = compare(a, b)
    assert same["identical"], same
    tensors = load_file(b / BUFFERS)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1
    save_file(tensors, b / BUFFERS)
    core = pb.Core()
    core.ParseFromString((b / MANIFEST).read_bytes())
    core.contract.kv_pages += 1
    (b / MANIFEST).write_bytes(core.SerializeToString())
    changed = compare(a, b)
    assert not changed["identical"]
    assert changed["buffer_tensors_differing"] == [name], changed
    assert changed["manifest_fields_differing"] == ["contract"], changed
