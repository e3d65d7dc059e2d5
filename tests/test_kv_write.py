"""Writing K/V into pages: live tokens land in their rows, padding leaves the null
page zero whatever it computed (the cache never depends on a write race)."""

from __future__ import annotations

import pytest
import torch

from ignition.components.kv_cache import PagedKvCache, write_kv

PAGE = 16


def _case(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    kv = PagedKvCache.allocate(2, 6, PAGE, 2, 32, torch.bfloat16, torch.device(device)).kv
    # k and v as views of one packed projection, like the attention's split.
    qkv = torch.randn(7, 4 * 64, generator=gen).to(torch.bfloat16).to(device)
    k = qkv[:, 128:192].view(7, 2, 32)
    v = qkv[:, 192:256].view(7, 2, 32)
    # Three live tokens, four padding tokens sharing null-page rows.
    rows = torch.tensor([PAGE * 2 + 3, PAGE * 5, PAGE * 1 + 15, 0, 0, 5, 0], device=device)
    return kv, k, v, rows


def _check(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor) -> None:
    write_kv(kv, 1, k, v, rows)
    flat = kv[1].view(2, -1, 2, 32)
    for t in range(3):
        assert torch.equal(flat[0, rows[t]], k[t]) and torch.equal(flat[1, rows[t]], v[t])
    assert not kv[:, :, 0].any(), "the null page must stay zero"
    assert not kv[0].any(), "other layers are untouched"
    assert int((kv[1] != 0).flatten(2).any(dim=2).sum()) == 6  # K and V of 3 pages


def test_write_kv_reference() -> None:
    _check(*_case("cpu"))


@pytest.mark.gpu
def test_write_kv_triton_matches_the_reference_bitwise() -> None:
    kv, k, v, rows = _case("cuda")
    _check(kv, k, v, rows)
    ref = _case("cpu")
    _check(*ref)
    assert torch.equal(kv.cpu(), ref[0])
