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
    assert same["qualification_identical"]
    changed = compare(a, b)
    assert not changed["identical"]
    assert changed["buffer_tensors_differing"] == [name], changed
    assert changed["manifest_fields_differing"] == ["contract"], changed


def _with_kernel(core_dir: Path, params: bytes) -> None:
    """``core_dir``'s manifest with one kernel node appended to its first graph: a
    4-byte and an 8-byte parameter, ``params`` their bytes."""
    core = pb.Core()
    core.ParseFromString((core_dir / MANIFEST).read_bytes())
    kernel = core.graphs[0].nodes.add().kernel
    kernel.function = "functor_kernel"
    kernel.params = params
    kernel.param_offsets.extend([0, 8])
    kernel.param_sizes.extend([4, 8])
    (core_dir / MANIFEST).write_bytes(core.SerializeToString())


def test_parameter_bytes_that_differ_between_two_exports_of_one_tree_are_capture_noise(
    tmp_path: Path,
) -> None:
    # Byte 0 of the second parameter is an empty functor's slot: it differs between
    # the two exports of one tree (b, c), so A's difference there is noise; byte 4 of
    # it (a captured scalar) differs nowhere else, so A's difference there is not.
    a, b, c = (_fixture(tmp_path / name) for name in "abc")
    scalar = bytes([0] * 8 + [0x40, 0, 0, 0, 7, 0, 0, 0])
    _with_kernel(a, bytes([1] * 8) + scalar[8:])
    _with_kernel(b, bytes([1] * 8) + bytes([0x11]) + scalar[9:])
    _with_kernel(c, bytes([1] * 8) + bytes([0x22]) + scalar[9:])
    noise = compare(a, b, control=c)
    assert not noise["identical"]
    assert noise["control"]["bytes_differing"] == 1, noise
    assert noise["equal_but_for_capture_noise"], noise
    changed = bytearray(bytes([1] * 8) + bytes([0x11]) + scalar[9:])
    changed[12] = 8
    _with_kernel(a := _fixture(tmp_path / "a2"), bytes(changed))
    real = compare(a, b, control=c)
    assert not real["equal_but_for_capture_noise"], real
    assert real["control"]["unexplained"] == [
        {"graph": 0, "node": 1, "function": "functor_kernel", "param": 1, "byte": 4}
    ], real
    # The control shows noise in that parameter (its byte 0), not at that byte: the
    # byte stays unexplained and is counted as lying in a noisy parameter.
    assert real["control"]["unexplained_in_noisy_parameters"] == 1, real
    assert real["control"]["bytes_differing_by_kernel"] == {
        "functor_kernel": {"bytes": 1, "unexplained": 1}
    }, real
    assert real["graph_differences"][0]["nodes_differing_by_kernel"] == {"functor_kernel": 1}
    # A change in the first parameter, where the control shows no noise, is not.
    changed[1] = 9
    _with_kernel(a := _fixture(tmp_path / "a3"), bytes(changed))
    both = compare(a, b, control=c)["control"]
    assert both["unexplained_count"] == 2, both
    assert both["unexplained_in_noisy_parameters"] == 1, both


def test_a_control_of_another_structure_explains_nothing(tmp_path: Path) -> None:
    a, b, c = (_fixture(tmp_path / name) for name in "abc")
    for core in (a, b):
        _with_kernel(core, bytes(16))
    result = compare(a, b, control=c)
    assert result["identical"], result
    assert not result["control"]["control_valid"]
    assert not result["equal_but_for_capture_noise"]


def test_bytes_outside_the_recorded_parameters_are_compared(tmp_path: Path) -> None:
    # A parameter block without a recorded layout (offsets and sizes empty, as the
    # walk leaves some library kernels') is still compared, byte by byte.
    a, b, c = (_fixture(tmp_path / name) for name in "abc")
    for core in (a, b, c):
        manifest_path = core / MANIFEST
        manifest = pb.Core()
        manifest.ParseFromString(manifest_path.read_bytes())
        kernel = manifest.graphs[0].nodes.add().kernel
        kernel.function = "library_kernel"
        kernel.params = bytes([3] * 8) if core is not a else bytes([3] * 7 + [4])
        manifest_path.write_bytes(manifest.SerializeToString())
    result = compare(a, b, control=c)
    assert not result["equal_but_for_capture_noise"], result
    assert result["control"]["unexplained"] == [
        {"graph": 0, "node": 1, "function": "library_kernel", "param": -1, "byte": 7}
    ], result
