"""The bounded-memory safetensors writer (``ignition.export.tensor_file``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ignition.export.tensor_file import write_tensors


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 10, generator=gen)
    return {
        "w.bf16": torch.randn(7, 5, generator=gen).to(torch.bfloat16),
        "a.f32": torch.randn(3, 4, 2, generator=gen),
        "ids.i64": torch.arange(-5, 6, dtype=torch.int64),
        "tags.i32": torch.tensor([[-1, 2], [3, -4]], dtype=torch.int32),
        "bytes.u8": torch.arange(13, dtype=torch.uint8),
        "flags.bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": wide[:, ::3],  # not contiguous
    }


def test_a_written_file_reads_back_as_safetensors(tmp_path: Path) -> None:
    tensors = _tensors()
    write_tensors(tmp_path / "t.safetensors", tensors, metadata={"note": "x"})
    back = load_file(str(tmp_path / "t.safetensors"))
    assert back.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape, name
        assert torch.equal(back[name], tensor), name
    with safe_open(str(tmp_path / "t.safetensors"), "pt") as file:
        assert file.metadata() == {"format": "pt", "note": "x"}


def test_pieces_smaller_than_a_tensor_write_the_same_bytes(tmp_path: Path) -> None:
    tensors = _tensors()
    write_tensors(tmp_path / "whole", tensors)
    write_tensors(tmp_path / "pieces", tensors, chunk_bytes=3)
    assert (tmp_path / "pieces").read_bytes() == (tmp_path / "whole").read_bytes()
    # The header is padded to 8 bytes, and each tensor starts aligned to its element
    # size (a u8 tensor of 13 bytes comes after the wider ones), as safetensors writes.
    data = (tmp_path / "whole").read_bytes()
    length = int.from_bytes(data[:8], "little")
    assert length % 8 == 0
    entries = json.loads(data[8 : 8 + length])
    for name, tensor in tensors.items():
        assert entries[name]["data_offsets"][0] % tensor.element_size() == 0, name


def test_a_dtype_without_a_safetensors_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="complex64"):
        write_tensors(tmp_path / "bad", {"z": torch.zeros(2, dtype=torch.complex64)})


@pytest.mark.parametrize("writers", [1, 3])
def test_pieces_written_by_threads_at_their_offsets_make_the_same_file(
    tmp_path: Path, writers: int
) -> None:
    # Many pieces in flight at once, written out of order by several threads.
    gen = torch.Generator().manual_seed(1)
    tensors = {f"t{i}": torch.randn(37 + i, generator=gen) for i in range(12)}
    tensors.update(_tensors())
    write_tensors(tmp_path / "one", tensors, chunk_bytes=1 << 20, writers=1)
    write_tensors(tmp_path / "many", tensors, chunk_bytes=5, writers=writers)
    assert (tmp_path / "many").read_bytes() == (tmp_path / "one").read_bytes()
    back = load_file(str(tmp_path / "many"))
    assert all(torch.equal(back[name], tensor) for name, tensor in tensors.items())


def test_a_failed_write_is_raised_and_stops_the_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def failing(fd: int, data: memoryview, offset: int) -> int:
        calls.append(offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ignition.export.tensor_file.os.pwrite", failing)
    with pytest.raises(OSError, match="No space left"):
        write_tensors(tmp_path / "full", _tensors(), chunk_bytes=2, writers=2)
    assert 0 < len(calls) < 40  # stopped early: the tensors make far more pieces
