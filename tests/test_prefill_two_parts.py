"""A long prefill chunk's attention in two parts (``triton_attention.
triton_paged_prefill_attention_rope``): within the chunk by a library kernel (cuDNN's
on the GPU), over the history before it by the Triton kernel, merged in place.
Against the one Triton kernel it replaces (after the same rotary write) and the
float32 reference: the same cache bytes, outputs within the rounding of the library
kernel's bfloat16 output, padding rows zero, and with no history the library
kernel's rows untouched. Interpreted on the CPU (PyTorch's CPU flash kernel),
compiled on the GPU, where cuDNN's kernel is also held to flash's."""

from __future__ import annotations

import pytest
import torch

from ignition.components.attention import paged_prefill_attention_ref
from ignition.components.kv_cache import PagedKvCache, rope_prefill_attention
from ignition.components.triton_attention import (
    TWO_PARTS_MIN_TOKENS,
    RopeInputs,
    _chunk_attention,
    triton_paged_prefill_attention,
    triton_paged_prefill_attention_rope,
    two_parts_apply,
)
from ignition.components.triton_kv_write import triton_rope_write_kv

EPS = 1e-6


def _case(
    capacity: int, n_valid: int, start: int, heads: int, kv_heads: int, dim: int, page: int,
    norms: bool, seed: int, device: str,
) -> dict:  # fmt: skip
    """A chunk of ``capacity`` tokens, the first ``n_valid`` real, at absolute
    position ``start`` after a random history; padding tokens' rows in the null page,
    every unused cache byte random (nothing may read it)."""
    gen = torch.Generator().manual_seed(seed)
    total = start + n_valid
    count = max(1, -(-total // page))
    pages = 1 + count + 2
    table = torch.zeros(count + 1, dtype=torch.int32)
    table[:count] = (torch.randperm(pages - 1, generator=gen)[:count] + 1).to(torch.int32)
    positions = start + torch.arange(capacity)
    rows = table[(positions // page).clamp(max=count)].long() * page + positions % page
    rows[n_valid:] = 1 + torch.arange(capacity - n_valid) % (page - 1)
    kv = PagedKvCache.allocate(1, pages, page, kv_heads, dim, torch.bfloat16, torch.device("cpu"))
    layer = kv.kv[0]
    layer.copy_(torch.randn(layer.shape, generator=gen).to(torch.bfloat16))
    layer[:, 0].zero_()
    width = (heads + 2 * kv_heads) * dim
    angle = positions[:, None].float() * torch.rand(dim // 2, generator=gen)[None, :]
    cos = torch.cat([angle.cos(), angle.cos()], dim=1).to(torch.bfloat16)
    sin = torch.cat([angle.sin(), angle.sin()], dim=1).to(torch.bfloat16)
    weights = [torch.rand(dim, generator=gen).to(torch.bfloat16) + 0.5 for _ in range(2)]
    case = dict(
        qkv=torch.randn(capacity, width, generator=gen).to(torch.bfloat16),
        q_weight=weights[0] if norms else None,
        k_weight=weights[1] if norms else None,
        cos=cos, sin=sin, rows=rows, kv=layer, table=table,
        start=torch.tensor([start], dtype=torch.int32),
        n_valid=torch.tensor([n_valid], dtype=torch.int32),
        heads=heads, scale=dim**-0.5,
    )  # fmt: skip
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def _rope(case: dict) -> RopeInputs:
    return RopeInputs(
        case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"], case["sin"],
        case["rows"],
    )  # fmt: skip


def _both(case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(two-part output, its cache, the one kernel's output after the same write, its
    cache)."""
    args = (case["table"], case["start"], case["n_valid"], case["scale"])
    kv_two = case["kv"].clone()
    out_two = triton_paged_prefill_attention_rope(_rope(case), kv_two, *args, case["heads"])
    kv_one = case["kv"].clone()
    q = triton_rope_write_kv(
        kv_one, case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"],
        case["sin"], case["rows"], case["heads"],
    )  # fmt: skip
    out_one = triton_paged_prefill_attention(q, kv_one, *args)
    return out_two, kv_two, out_one, kv_one


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize(
    ("capacity", "n_valid", "start", "norms"),
    [(48, 48, 0, True), (48, 37, 0, False), (48, 40, 45, True), (32, 19, 70, False)],
)
def test_two_parts_match_the_one_kernel(
    capacity: int, n_valid: int, start: int, norms: bool
) -> None:
    case = _case(capacity, n_valid, start, 4, 2, 64, 16, norms, seed=capacity + start, device="cpu")
    out_two, kv_two, out_one, kv_one = _both(case)
    assert torch.equal(kv_two, kv_one)
    assert out_two.shape == out_one.shape == (capacity, 4, 64)
    assert torch.count_nonzero(out_two[n_valid:]) == 0
    assert _relative(out_two[:n_valid], out_one[:n_valid]) < 1e-2
    ref = paged_prefill_attention_ref(
        _both_q(case, kv_two), kv_two, case["table"], case["start"], case["n_valid"], case["scale"]
    )
    assert _relative(out_two[:n_valid], ref[:n_valid]) < 1e-2


def _both_q(case: dict, kv: torch.Tensor) -> torch.Tensor:
    """The chunk's finished queries (the write again, into a copy)."""
    return triton_rope_write_kv(
        kv.clone(), case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"],
        case["sin"], case["rows"], case["heads"],
    )  # fmt: skip


def test_without_history_the_flash_rows_stay_as_written() -> None:
    """Start 0: the history kernel reads no query and leaves every real row of the
    flash kernel's output as it was (bitwise), only zeroing padding."""
    case = _case(48, 41, 0, 4, 2, 64, 16, True, seed=9, device="cpu")
    out_two = _both(case)[0]
    finished = triton_rope_write_kv(
        case["kv"].clone(), case["qkv"], case["q_weight"], case["k_weight"], EPS,
        case["cos"], case["sin"], case["rows"], case["heads"], finished=True,
    )  # fmt: skip
    q, k, v = finished.split([4, 2, 2], dim=1)
    flash, _ = _chunk_attention(q, k, v, case["scale"])
    assert torch.equal(out_two[:41], flash[:41])


def test_finished_projection_holds_what_the_cache_holds() -> None:
    case = _case(32, 27, 20, 4, 2, 64, 16, True, seed=4, device="cpu")
    kv = case["kv"].clone()
    finished = triton_rope_write_kv(
        kv, case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"], case["sin"],
        case["rows"], case["heads"], finished=True,
    )  # fmt: skip
    kv_plain = case["kv"].clone()
    q = triton_rope_write_kv(
        kv_plain, case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"],
        case["sin"], case["rows"], case["heads"],
    )  # fmt: skip
    assert torch.equal(kv, kv_plain)
    assert torch.equal(finished[:, :4], q)
    flat = kv.view(2, -1, 2, 64)
    assert torch.equal(finished[:, 4:6], flat[0][case["rows"]])
    assert torch.equal(finished[:, 6:], flat[1][case["rows"]])
    assert torch.count_nonzero(finished[27:, 4:]) == 0


def test_the_rule_is_by_shape() -> None:
    """Long chunks that the single-pass kernel serves: the 8B's from 2,048 tokens;
    SmolLM2's 3 kv heads leave its chunks to the split kernels. Off by default
    until measured on the GPU (``TWO_PARTS_MIN_TOKENS``)."""
    cpu = torch.device("cpu")
    shape = (32, 8, 128)

    def applies(tokens: int, heads: int, kv_heads: int, dim: int, dtype: torch.dtype) -> bool:
        return two_parts_apply(tokens, heads, kv_heads, dim, dtype, cpu, min_tokens=1024)

    assert applies(4096, *shape, torch.bfloat16)
    assert applies(2048, *shape, torch.float16)
    assert not applies(1024, *shape, torch.bfloat16)
    assert not applies(4096, 9, 3, 64, torch.bfloat16)
    assert not applies(4096, *shape, torch.float32)
    assert not applies(4096, 32, 8, 512, torch.bfloat16)
    assert not applies(4096, 32, 8, 256, torch.bfloat16)  # wider than cuDNN's 128
    assert not two_parts_apply(4096, *shape, torch.bfloat16, cpu, min_tokens=None)
    assert two_parts_apply(4096, *shape, torch.bfloat16, cpu) == (TWO_PARTS_MIN_TOKENS is not None)


def test_without_the_mask_every_key_is_seen() -> None:
    """``causal=False`` over more keys than queries (the history part's form): the
    same output and log-sum-exp as the attention written out in float32."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(16, 4, 64, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(40, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    out, lse = _chunk_attention(q, k, v, 0.125, causal=False)
    scores = torch.einsum("thd,khd->htk", q.float(), k.float().repeat_interleave(2, dim=1))
    scores = scores * 0.125
    expected = torch.einsum(
        "htk,khd->thd", scores.softmax(-1), v.float().repeat_interleave(2, dim=1)
    )
    torch.testing.assert_close(out.float(), expected, rtol=0, atol=2**-7)
    torch.testing.assert_close(lse.float(), scores.logsumexp(-1), rtol=0, atol=1e-4)


def test_an_unknown_library_is_refused() -> None:
    q = torch.zeros(16, 4, 64, dtype=torch.bfloat16)
    k = torch.zeros(16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cudnn or flash"):
        _chunk_attention(q, k, k, 0.125, library="flash2")


def test_the_operator_matches_its_reference_composition() -> None:
    """The registered operator on the CPU (the references of the write and the
    attention) against the two-part kernel path. The written keys may differ by a
    bfloat16 step (2^-4 below 16: the kernel rounds as eager does, the reference's
    rotary products may fuse); with q/k norms, whose statistic the kernels sum in
    another order, random keys a step apart moved this case's outputs by 1.6%, the
    one kernel's as much as the two parts', so the case has none."""
    case = _case(48, 40, 45, 4, 2, 64, 16, False, seed=2, device="cpu")
    kv = case["kv"].clone()[None]
    out = rope_prefill_attention(
        kv, 0, case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"], case["sin"],
        case["rows"], case["heads"], case["table"], case["start"], case["n_valid"],
        case["scale"],
    )  # fmt: skip
    out_two, kv_two, _, _ = _both(case)
    assert kv_two.float().abs().max() < 16
    torch.testing.assert_close(kv[0].float(), kv_two.float(), rtol=0, atol=2**-4)
    assert _relative(out[:40], out_two[:40]) < 1e-2
    assert torch.count_nonzero(out[40:]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "norms"),
    [(32, 8, 128, True), (32, 8, 128, False)],  # Qwen3-8B's, Llama 3 8B's
)
@pytest.mark.parametrize(
    ("capacity", "n_valid", "start"),
    [(4096, 4096, 0), (4096, 3001, 0), (4096, 4000, 5000), (2048, 2048, 777)],
)
def test_two_parts_on_the_gpu(
    heads: int, kv_heads: int, dim: int, norms: bool, capacity: int, n_valid: int, start: int
) -> None:
    """Compiled, with the serving page: the shapes ``two_parts_apply`` takes."""
    assert two_parts_apply(
        capacity, heads, kv_heads, dim, torch.bfloat16, torch.device("cuda"), min_tokens=1024
    )
    case = _case(capacity, n_valid, start, heads, kv_heads, dim, 64, norms, seed=1, device="cuda")
    out_two, kv_two, out_one, kv_one = _both(case)
    assert torch.equal(kv_two, kv_one)
    assert torch.count_nonzero(out_two[n_valid:]) == 0
    assert _relative(out_two[:n_valid], out_one[:n_valid]) < 1e-2
    # Within a few bfloat16 steps of the one kernel, row by row.
    diff = (out_two[:n_valid].float() - out_one[:n_valid].float()).abs().max().item()
    assert diff < 2**-5 * max(1.0, out_one.float().abs().max().item()), diff


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "dim"), [(4096, 32, 8, 128), (2048, 32, 8, 128)]
)
def test_cudnn_within_the_chunk_agrees_with_flash(
    tokens: int, heads: int, kv_heads: int, dim: int
) -> None:
    """cuDNN's kernel (the two parts' within-chunk part) against PyTorch's flash
    kernel on the same strided views of one finished projection: outputs within a
    bfloat16 step of each other (0.0039 at the 8B's heads on an H100), each row's
    log-sum-exp within fp32 rounding of the sum (1.9e-6 there), and the output
    contiguous, as the operator declares it."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    finished = torch.randn(tokens, heads + 2 * kv_heads, dim, device="cuda", generator=gen).to(
        torch.bfloat16
    )
    q, k, v = finished.split([heads, kv_heads, kv_heads], dim=1)
    out, lse = _chunk_attention(q, k, v, dim**-0.5)
    flash_out, flash_lse = _chunk_attention(q, k, v, dim**-0.5, library="flash")
    assert out.shape == flash_out.shape and out.is_contiguous()
    assert lse.shape == flash_lse.shape == (heads, tokens)
    diff = (out.float() - flash_out.float()).abs().max().item()
    assert diff <= 2**-6, diff
    torch.testing.assert_close(lse, flash_lse, rtol=1e-5, atol=1e-5)
