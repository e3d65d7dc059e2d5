"""Finishing the QKV projection: q/k norms and rotary embeddings with the canonical
arithmetic, K/V into their pages; padding leaves the null page zero whatever it
computed (the cache never depends on a write race); a token's result never depends
on the other tokens."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from ignition.components.kv_cache import PagedKvCache, rope_write_kv
from ignition.components.triton_kv_write import (
    PREFILL_ROWS,
    PREFILL_TOKENS,
    _rounded,
    rope_tile,
    triton_rope_write_kv,
)

PAGE = 16
HEADS, KV_HEADS, DIM = 4, 2, 32
EPS = 1e-6
# Three live tokens, four padding tokens sharing null-page rows.
ROWS = [PAGE * 2 + 3, PAGE * 5, PAGE * 1 + 15, 0, 0, 5, 0]


def _case(device: str, dtype: torch.dtype, norms: bool = True) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    tokens = len(ROWS)
    kv = PagedKvCache.allocate(2, 6, PAGE, KV_HEADS, DIM, dtype, torch.device(device)).kv
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, generator=gen) * 3
    angles = torch.rand(tokens, DIM // 2, generator=gen) * 6.3
    angles = torch.cat((angles, angles), dim=-1)
    weights = [1 + torch.randn(DIM, generator=gen) / 4 for _ in range(2)] if norms else [None] * 2
    to = {"device": device, "dtype": dtype}
    return dict(
        kv=kv,
        qkv=qkv.to(**to),
        q_weight=None if weights[0] is None else weights[0].to(**to),
        k_weight=None if weights[1] is None else weights[1].to(**to),
        eps=EPS,
        cos=angles.cos().to(**to),
        sin=angles.sin().to(**to),
        rows=torch.tensor(ROWS, device=device),
    )


def _canonical(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Transformers' own modules: q, and the keys and values of the live tokens."""
    qkv = case["qkv"]
    q, k, v = qkv.view(len(ROWS), -1, DIM).split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    if case["q_weight"] is not None:
        norms = []
        for weight in (case["q_weight"], case["k_weight"]):
            norm = Qwen3RMSNorm(DIM, eps=EPS).to(qkv.device, qkv.dtype)
            norm.weight.data.copy_(weight)
            norms.append(norm)
        q, k = norms[0](q), norms[1](k)
    q, k = apply_rotary_pos_emb(q, k, case["cos"], case["sin"], unsqueeze_dim=1)
    return q, k, v


def _run(case: dict, triton: bool, tile: tuple[int, int] | None = None) -> torch.Tensor:
    args = [case[n] for n in ("qkv", "q_weight", "k_weight", "eps", "cos", "sin", "rows")]
    if triton:
        return triton_rope_write_kv(case["kv"][1], *args, HEADS, tile)
    return rope_write_kv(case["kv"], 1, *args, HEADS)


def _check_pages(case: dict, k: torch.Tensor, v: torch.Tensor) -> None:
    kv, rows = case["kv"], case["rows"]
    flat = kv[1].view(2, -1, KV_HEADS, DIM)
    for t in range(3):
        assert torch.equal(flat[0, rows[t]], k[t]) and torch.equal(flat[1, rows[t]], v[t])
    assert not kv[:, :, 0].any(), "the null page must stay zero"
    assert not kv[0].any(), "other layers are untouched"
    assert int((kv[1] != 0).flatten(2).any(dim=2).sum()) == 6  # K and V of 3 pages


@pytest.mark.parametrize("norms", [True, False])
def test_the_reference_is_the_canonical_arithmetic_bitwise(norms: bool) -> None:
    case = _case("cpu", torch.bfloat16, norms)
    q = _run(case, triton=False)
    canonical_q, k, v = _canonical(case)
    assert torch.equal(q, canonical_q)
    _check_pages(case, k, v)


# fp32 throughout: only the norm's sum of squares is ordered differently.
@pytest.mark.parametrize("norms", [True, False])
def test_the_kernel_matches_the_reference_interpreted(norms: bool) -> None:
    case, reference = _case("cpu", torch.float32, norms), _case("cpu", torch.float32, norms)
    q = _run(case, triton=True)
    ref_q = _run(reference, triton=False)
    torch.testing.assert_close(q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(case["kv"], reference["kv"], rtol=1e-5, atol=1e-5)
    flat = case["kv"][1].view(2, -1, KV_HEADS, DIM)
    _check_pages(case, flat[0, case["rows"][:3]], flat[1, case["rows"][:3]])


def test_a_tokens_result_is_independent_of_the_others_interpreted() -> None:
    case = _case("cpu", torch.float32)
    q = _run(case, triton=True)
    alone = _case("cpu", torch.float32)
    for name in ("qkv", "cos", "sin", "rows"):
        alone[name] = alone[name][1:2].contiguous()
    assert torch.equal(_run(alone, triton=True), q[1:2])
    pages, row = case["kv"][1].view(2, -1, KV_HEADS, DIM), ROWS[1]
    assert torch.equal(alone["kv"][1].view(2, -1, KV_HEADS, DIM)[:, row], pages[:, row])


@pytest.mark.parametrize("norms", [True, False])
def test_tokens_a_program_change_no_bits_interpreted(norms: bool) -> None:
    """Decode's tile (one token a program) and a prefill chunk's blocks of tokens,
    the last block part-full (seven tokens in blocks of 4 and 8): the same queries and
    cache bytes, bit for bit (the sum of squares' order is spelled out per row)."""
    one = _case("cpu", torch.bfloat16, norms)
    q = _run(one, triton=True, tile=(1, 1))
    for tile in ((4, 2), (8, 4), (PREFILL_TOKENS, 4)):
        blocked = _case("cpu", torch.bfloat16, norms)
        assert torch.equal(_run(blocked, triton=True, tile=tile), q), tile
        assert torch.equal(blocked["kv"], one["kv"]), tile
    _check_pages(one, *one["kv"][1].view(2, -1, KV_HEADS, DIM)[:, one["rows"][:3]])


def test_a_prefill_chunk_takes_blocks_of_tokens() -> None:
    assert rope_tile(1) == rope_tile(PREFILL_ROWS - 1) == (1, 1)
    assert rope_tile(PREFILL_ROWS) == rope_tile(4096) == (PREFILL_TOKENS, 4)


@triton.jit
def _round_kernel(x_ptr, y_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(y_ptr + offs, _rounded(tl.load(x_ptr + offs), tl.bfloat16))


def test_the_kernels_bfloat16_rounding_is_torchs_interpreted() -> None:
    """The integer rounding the rotary products take (a cast pair would let the
    compiler fuse them into an FMA): torch's fp32 to bfloat16, ties to even included."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=gen) * torch.logspace(-30, 30, 4096)
    bits = x.view(torch.int32)
    ties = (bits & ~0xFFFF) | 0x8000  # exactly halfway, odd and even mantissas alike
    near = (bits & ~0xFFFF) | 0x7FFF
    # NaNs of every payload the GPU or the host makes (the GPU's fp32 arithmetic gives
    # 0x7FFFFFFF, which integer rounding alone carried into -0.0), and the infinities.
    special = torch.tensor([0x7FFFFFFF, -1, 0x7F800001, 0x7FC00000, 0x7F800000, -0x800000],
                           dtype=torch.int32).view(torch.float32)  # fmt: skip
    zeros = torch.zeros(4096 - special.numel())
    x = torch.cat([x, ties.view(torch.float32), near.view(torch.float32), zeros, special])
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y, N=x.numel())
    expected = x.to(torch.bfloat16).float()
    assert torch.equal(y.isnan(), expected.isnan()) and int(y.isnan().sum()) == 4
    assert torch.equal(y.nan_to_num(0.0), expected.nan_to_num(0.0))


def test_bad_operands_are_refused() -> None:
    case = _case("cpu", torch.float32)
    with pytest.raises(ValueError, match="packed projection"):
        triton_rope_write_kv(
            case["kv"][1], case["qkv"][:, :-1], None, None, 0.0, case["cos"], case["sin"],
            case["rows"], HEADS,
        )  # fmt: skip
    with pytest.raises(ValueError, match="together"):
        triton_rope_write_kv(
            case["kv"][1], case["qkv"], case["q_weight"], None, EPS, case["cos"], case["sin"],
            case["rows"], HEADS,
        )  # fmt: skip
    with pytest.raises(ValueError, match="power of two"):
        _run(case, triton=True, tile=(3, 1))


# bf16: the kernel's rounding is eager's; its sum of squares in another order can move
# a normalized element by one bf16 step (2^-8 relative), and the rotary sums after it.
@pytest.mark.gpu
@pytest.mark.parametrize("norms", [True, False])
def test_the_kernel_matches_the_canonical_modules_on_gpu(norms: bool) -> None:
    case = _case("cuda", torch.bfloat16, norms)
    q = _run(case, triton=True)
    canonical_q, k, v = _canonical(case)
    torch.testing.assert_close(q, canonical_q, rtol=2**-6, atol=2**-6)
    flat = case["kv"][1].view(2, -1, KV_HEADS, DIM)
    live = case["rows"][:3]
    torch.testing.assert_close(flat[0, live], k[:3], rtol=2**-6, atol=2**-6)
    assert torch.equal(flat[1, live], v[:3])
    assert not case["kv"][:, :, 0].any(), "the null page must stay zero"
    # No reduction: eager's arithmetic exactly. Before the products took integer
    # rounding, the compiler fused each with its sum into a bfloat16 FMA, and this
    # failed on the H200 (201 of 896 query elements one bfloat16 step off).
    if not norms:
        assert torch.equal(q, canonical_q) and torch.equal(flat[0, live], k[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("norms", [True, False])
def test_a_prefill_chunks_blocks_change_no_bits_on_gpu(norms: bool) -> None:
    """At the 8B geometry's heads (32 query, 8 kv, 128 wide) over a chunk of 1,000
    tokens: the prefill tile's queries and cache bytes are one token a program's."""
    gen = torch.Generator().manual_seed(2)
    tokens, heads, kv_heads, dim, page = 1000, 32, 8, 128, 64
    to = {"device": "cuda", "dtype": torch.bfloat16}
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen) * 3).to(**to)
    angles = torch.rand(tokens, dim // 2, generator=gen) * 6.3
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(**to), angles.sin().to(**to)
    weights = [(1 + torch.randn(dim, generator=gen) / 4).to(**to) for _ in range(2)]
    q_weight, k_weight = weights if norms else (None, None)
    rows = torch.randperm(tokens, generator=gen).cuda() + page
    outputs = []
    for tile in ((1, 1), None):
        kv = torch.zeros(2, tokens // page + 2, page, kv_heads, dim, **to)
        q = triton_rope_write_kv(kv, qkv, q_weight, k_weight, EPS, cos, sin, rows, heads, tile)
        outputs.append((q, kv))
    assert rope_tile(tokens) == (PREFILL_TOKENS, 4)
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert torch.equal(outputs[0][1], outputs[1][1])
