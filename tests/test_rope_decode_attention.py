"""Decode attention that finishes its rows' packed projection itself: the rotary write
(q/k norms, rotary, the newest token's K/V into its page) done inside the split
kernel, by the split that reads that page, gives the bits of the two launches it
replaces (``triton_rope_write_kv``, then ``triton_paged_decode_attention``): the
same output and the same cache. Interpreted on the CPU, compiled on the GPU."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from ignition.components.kv_cache import PagedKvCache, rope_decode_attention
from ignition.components.triton_attention import (
    RopeInputs,
    _newest_page_split,
    triton_paged_decode_attention,
    triton_paged_decode_attention_rope,
)
from ignition.components.triton_kv_write import triton_rope_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _case(
    lengths: list[int],
    heads: int,
    kv_heads: int,
    dim: int,
    page: int,
    norms: bool,
    seed: int,
    device: str = DEVICE,
) -> dict:
    """Rows of ``lengths`` cached tokens (0: padding), each token's newest position
    ``length - 1`` pending in ``qkv``; the cache holds random history before it and
    random bytes wherever no token lives (nothing may read those), the null page
    zero."""
    gen = torch.Generator().manual_seed(seed)
    rows_n = len(lengths)
    max_pages = max(1, max(-(-n // page) for n in lengths))
    needed = sum(-(-n // page) for n in lengths)
    pages = 1 + needed + 2
    free = (torch.randperm(pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(rows_n, max_pages, dtype=torch.int32)
    rows = torch.zeros(rows_n, dtype=torch.int64)
    for b, n in enumerate(lengths):
        count = -(-n // page)
        table[b, :count] = torch.tensor(free[:count], dtype=torch.int32)
        free = free[count:]
        if n:
            pos = n - 1
            rows[b] = int(table[b, pos // page]) * page + pos % page
        else:
            rows[b] = 3 + b % 2  # padding rows share null-page rows
    kv = PagedKvCache.allocate(1, pages, page, kv_heads, dim, torch.bfloat16, torch.device("cpu"))
    layer = kv.kv[0]
    layer.copy_(torch.randn(layer.shape, generator=gen).to(torch.bfloat16))
    layer[:, 0] = 0
    qkv = torch.randn(rows_n, (heads + 2 * kv_heads) * dim, generator=gen) * 3
    angles = torch.rand(rows_n, dim // 2, generator=gen) * 6.3
    angles = torch.cat((angles, angles), dim=-1)
    weights = [1 + torch.randn(dim, generator=gen) / 4 for _ in range(2)] if norms else [None] * 2
    to = {"device": device, "dtype": torch.bfloat16}
    return dict(
        kv=kv.kv.to(device),
        qkv=qkv.to(**to),
        q_weight=None if weights[0] is None else weights[0].to(**to),
        k_weight=None if weights[1] is None else weights[1].to(**to),
        cos=angles.cos().to(**to),
        sin=angles.sin().to(**to),
        rows=rows.to(device),
        table=table.to(device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        heads=heads,
        scale=dim**-0.5,
    )


def _rope(case: dict) -> RopeInputs:
    return RopeInputs(
        case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"], case["sin"], case["rows"]
    )


def _both(case: dict, num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(two launches' output, fused output, the cache before), the caches of the two
    left in ``case["two"]`` and ``case["fused"]``."""
    rope = _rope(case)
    before = case["kv"][0].clone()
    two, fused = before.clone(), before.clone()
    q = triton_rope_write_kv(
        two, rope.qkv, rope.q_weight, rope.k_weight, EPS, rope.cos, rope.sin, rope.rows,
        case["heads"],
    )  # fmt: skip
    out_two = triton_paged_decode_attention(
        q, two, case["table"], case["seq_lens"], case["scale"], num_splits=num_splits
    )
    out_fused = triton_paged_decode_attention_rope(
        rope, fused, case["table"], case["seq_lens"], case["scale"], case["heads"],
        num_splits=num_splits,
    )  # fmt: skip
    case["two"], case["fused"] = two, fused
    return out_two, out_fused, before


@pytest.mark.parametrize("norms", [True, False])
@pytest.mark.parametrize("num_splits", [1, 3, 16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "page"),
    [(4, 2, 32, 16), (6, 2, 32, 16), (9, 3, 64, 64)],  # groups of 2, 3 (padded), 3
)
def test_fused_rotary_write_gives_the_two_launches_bits(
    norms: bool, num_splits: int, heads: int, kv_heads: int, dim: int, page: int
) -> None:
    # A token alone, a page's last and next, padding between, several pages: the
    # newest token falls in the first, a middle and the last split.
    lengths = [1, page, 0, page + 1, 3 * page - 2, 0, 5 * page + 7]
    case = _case(lengths, heads, kv_heads, dim, page, norms, seed=num_splits + heads)
    out_two, out_fused, before = _both(case, num_splits)
    assert torch.equal(out_fused, out_two)
    assert torch.equal(case["fused"], case["two"])
    assert not torch.equal(case["fused"], before)  # the newest tokens were written
    assert not case["fused"][:, 0].any(), "the null page stays zero"
    assert not out_fused[[2, 5]].any(), "padding rows give zeros"


@triton.jit
def _newest_split_kernel(seq_lens_ptr, out_ptr, PAGE_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr):
    i = tl.program_id(0)
    num_pages = tl.cdiv(tl.load(seq_lens_ptr + i), PAGE_SIZE)
    per_split = tl.cdiv(num_pages, NUM_SPLITS)
    tl.store(out_ptr + i, _newest_page_split(num_pages, per_split))


@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_the_writing_split_is_the_one_that_reads_the_newest_page(num_splits: int) -> None:
    """Which split writes a row's newest K/V (the interpreter runs programs one after
    another, so a wrong choice would not show in the bits there; on the GPU it
    races): the one whose pages, as the split kernel ranges them, hold that token."""
    page = 16
    seq_lens = torch.arange(0, 40 * page + 3, dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(seq_lens)
    _newest_split_kernel[(len(seq_lens),)](seq_lens, out, PAGE_SIZE=page, NUM_SPLITS=num_splits)
    for n, split in zip(seq_lens.tolist(), out.tolist(), strict=True):
        if n == 0:
            assert split == 0
            continue
        pages = -(-n // page)
        per = -(-pages // num_splits)
        lo, hi = split * per, min(split * per + per, pages)
        assert lo <= (n - 1) // page < hi, (n, split)


def test_a_row_never_depends_on_its_batch() -> None:
    lengths = [40, 0, 17, 90]
    full = _case(lengths, 4, 2, 32, 16, True, seed=5)
    _, fused_all, _ = _both(full, 3)
    for b in (0, 2, 3):
        alone = {k: v for k, v in full.items()}
        for name in ("qkv", "cos", "sin", "rows", "table", "seq_lens"):
            alone[name] = full[name][b : b + 1]
        _, fused_one, _ = _both(alone, 3)
        assert torch.equal(fused_one[0], fused_all[b])


def test_the_operator_matches_the_reference_composition() -> None:
    """The registered operator (on the CPU the references of the two operators it
    replaces, on CUDA this kernel) against the kernel. The q/k norms' statistic is
    summed in another order by the kernels than by the reference (``triton_kv_write``),
    so the written keys may differ by a bfloat16 step (2^-4 at this case's largest
    magnitudes, below 16)."""
    lengths = [1, 0, 33, 70]
    case = _case(lengths, 4, 2, 32, 16, True, seed=3)
    kv = case["kv"].clone()
    out = rope_decode_attention(
        kv, 0, case["qkv"], case["q_weight"], case["k_weight"], EPS, case["cos"], case["sin"],
        case["rows"], case["heads"], case["table"], case["seq_lens"], case["scale"],
    )  # fmt: skip
    _, fused, _ = _both(case, 16)
    err = ((out.double() - fused.double()).norm() / fused.double().norm()).item()
    assert err < 1e-2, err
    assert case["fused"].float().abs().max() < 16
    torch.testing.assert_close(kv[0].float(), case["fused"].float(), rtol=0, atol=2**-4)


def test_bad_inputs_are_refused() -> None:
    case = _case([5, 0], 4, 2, 32, 16, False, seed=1)
    rope = _rope(case)
    args = (case["table"], case["seq_lens"], case["scale"], case["heads"])
    with pytest.raises(ValueError, match="int64"):
        triton_paged_decode_attention_rope(
            rope._replace(rows=rope.rows.to(torch.int32)), case["kv"][0], *args
        )
    with pytest.raises(ValueError, match="packed projection"):
        triton_paged_decode_attention_rope(
            rope._replace(qkv=rope.qkv[:, :-32]), case["kv"][0], *args
        )
    with pytest.raises(ValueError, match="contiguous"):
        triton_paged_decode_attention_rope(rope, case["kv"][0].transpose(1, 2), *args)
    with pytest.raises(ValueError, match="together"):
        triton_paged_decode_attention_rope(
            rope._replace(q_weight=torch.ones_like(rope.cos[0])), case["kv"][0], *args
        )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "norms"),
    [(32, 8, 128, True), (32, 8, 128, False), (9, 3, 64, False)],  # Qwen3-8B's, SmolLM2's
)
def test_fused_rotary_write_gives_the_two_launches_bits_on_the_gpu(
    heads: int, kv_heads: int, dim: int, norms: bool
) -> None:
    """Compiled, with the serving page and split count, up to 4096 tokens: the q/k
    norms' statistic is summed in one spelled-out order in both kernels
    (``triton_kv_write._sum_of_squares``), whose warps differ (a ``tl.sum`` there
    summed a 128-wide head in two orders), and no split reads the newest page before
    its writer has written it."""
    lengths = [1, 63, 64, 65, 0, 1000, 4096, 4095]
    for seed in range(4):
        case = _case(lengths, heads, kv_heads, dim, 64, norms, seed, device="cuda")
        out_two, out_fused, _ = _both(case, 16)
        assert torch.equal(out_fused, out_two), seed
        assert torch.equal(case["fused"], case["two"]), seed
