"""QSA's Triton kernels (block scores, attention over selected blocks) against the torch
references of ``ignition.components.selector``, under Triton's interpreter on a
machine without CUDA (conftest.py).

Every K/V slot a token must not read (tokens of unselected blocks, the open group
past the query, pages outside its table, the null page) holds NaN, and so do
unreachable selector entries: one stray read puts NaN in the output.

Tolerances: the scores are fp32 sums of exact products in both, only their order
differs (relative 1e-6). Attention in fp32 differs from the reference by reduction
order alone (1e-5); in bf16 the reference rounds scores and probabilities to bf16
as eager attention does and the kernel keeps scores in fp32, each about 2^-9
relative per element (the dense kernels' bound, relative L2 1e-2).
"""

from __future__ import annotations

import pytest
import torch

from ignition.components import selector, triton_selector

# The interpreter's device without CUDA; on the H200 the ``gpu`` copies run there too.
LOCAL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEVICES = [LOCAL_DEVICE, pytest.param("cuda", marks=pytest.mark.gpu, id="gpu")]
RATIO, PAGE, PER_PAGE = 4, 64, 16
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
INDEX_HEADS, INDEX_DIM = 2, 16
PAGES = 12


def _tables(rows: int, pages_each: int) -> torch.Tensor:
    """Distinct, shuffled physical pages per row (never the null page 0)."""
    perm = torch.randperm(PAGES - 1, generator=torch.Generator().manual_seed(1)) + 1
    return perm[: rows * pages_each].view(rows, pages_each).to(torch.int32)


def _relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows,tokens_per_row", [(3, 1), (1, 64)])
def test_block_scores_match_the_reference(rows: int, tokens_per_row: int, device: str) -> None:
    gen = torch.Generator().manual_seed(2)
    tables = _tables(rows, 2)
    selectors = torch.full((PAGES, PER_PAGE, INDEX_DIM), float("nan"))
    for page in tables.flatten().tolist():
        selectors[page] = torch.randn(PER_PAGE, INDEX_DIM, generator=gen)
    n = rows * tokens_per_row
    q = torch.randn(n, INDEX_HEADS, INDEX_DIM, generator=gen)
    positions = torch.randint(0, 2 * PAGE, (n,), generator=gen)
    valid = torch.ones(n, dtype=torch.bool)
    valid[-1] = False
    q, selectors, tables, positions, valid = (
        t.to(device) for t in (q, selectors, tables, positions, valid)
    )
    want = selector.block_scores_ref(q, selectors, tables, tokens_per_row, positions, valid, RATIO)
    got = triton_selector.triton_block_scores(
        q, selectors, tables, tokens_per_row, positions, valid.to(torch.int32), RATIO
    )
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-6, atol=1e-6)
    # The top-k of either picks the same blocks.
    geometry = selector.SelectorGeometry(RATIO, 8, PAGE)
    assert torch.equal(
        selector.select_blocks(got, positions, valid, geometry),
        selector.select_blocks(want, positions, valid, geometry),
    )


def _case(
    rows: int, tokens_per_row: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, poisoned kv, tables, block lists and positions: each token selects up to 6
    complete blocks (some -1) of its row and its open group."""
    gen = torch.Generator().manual_seed(3)
    tables = _tables(rows, 3)
    kv = torch.full((2, PAGES, PAGE, KV_HEADS, HEAD_DIM), float("nan"), dtype=dtype)
    n = rows * tokens_per_row
    positions = torch.randint(30, 3 * PAGE, (n,), generator=gen)
    lists = []
    for token in range(n):
        row, pos = token // tokens_per_row, int(positions[token])
        complete = (pos + 1) // RATIO
        picked = torch.randperm(complete, generator=gen)[:6].tolist()
        picked += [-1] * (7 - len(picked))
        picked[4] = -1  # a hole in the list
        tail = complete if (pos + 1) % RATIO else -1
        lists.append([*picked, tail])
        for block in [b for b in picked if b >= 0] + ([tail] if tail >= 0 else []):
            for member in range(RATIO):
                p = block * RATIO + member
                if p > pos:
                    continue
                page = int(tables[row, p // PAGE])
                kv[:, page, p % PAGE] = torch.randn(2, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    blocks = torch.tensor(lists, dtype=torch.int32)
    blocks[0] = -1  # a token that selects nothing
    q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
    return q, kv, tables, blocks, positions


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,tokens_per_row", [(3, 1), (1, 16)])
def test_selected_attention_matches_the_reference(
    rows: int, tokens_per_row: int, dtype: torch.dtype, device: str
) -> None:
    q, kv, tables, blocks, positions = (t.to(device) for t in _case(rows, tokens_per_row, dtype))
    scale = HEAD_DIM**-0.5
    # The reference gathers whole pages: unread NaN would reach its masked scores as
    # NaN, so it reads the pages with the poison zeroed (the kernel reads the poison).
    clean = torch.nan_to_num(kv, nan=0.0)
    want = selector.selected_attention_ref(
        q, clean, tables, tokens_per_row, blocks, positions, RATIO, scale
    )
    got = triton_selector.triton_selected_attention(
        q, kv, tables, tokens_per_row, blocks, positions, RATIO, scale
    )
    assert torch.isfinite(got).all()
    assert not got[0].any()  # selects nothing: zeros
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert _relative_l2(got, want) < 1e-2


def test_splits_depend_on_the_list_alone() -> None:
    # Decode: one split per 16-block tile up to 16, whatever the batch; prefill: one.
    assert triton_selector.selected_splits(1, 513) == triton_selector.MAX_SPLITS
    assert triton_selector.selected_splits(1, 40) == 3
    assert triton_selector.selected_splits(1, 9) == 1
    assert triton_selector.selected_splits(4096, 513) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_decode_token_attends_alike_at_every_capacity(device: str) -> None:
    # A token selecting 40 blocks (three tiles, three splits) gives the same bits
    # alone and as the first of 100 decode rows: the split count follows its list,
    # not the batch (it once followed the batch: two splits at 100 rows, three alone,
    # which changed the token's rounding).
    gen = torch.Generator().manual_seed(5)
    kv = torch.randn(2, PAGES, PAGE, KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    tables = _tables(1, 3).expand(4, -1).contiguous()  # the rows read the same pages
    positions = torch.tensor([180, 190, 170, 175])
    blocks = torch.stack(
        [torch.randperm(int(p + 1) // RATIO, generator=gen)[:40] for p in positions]
    ).to(torch.int32)
    q = torch.randn(4, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    rows = 100
    q, tables, blocks, positions = (
        t.repeat(rows // 4, *([1] * (t.dim() - 1))) for t in (q, tables, blocks, positions)
    )
    q, kv, tables, blocks, positions = (t.to(device) for t in (q, kv, tables, blocks, positions))
    scale = HEAD_DIM**-0.5
    four = triton_selector.triton_selected_attention(
        q, kv, tables, 1, blocks, positions, RATIO, scale
    )
    one = triton_selector.triton_selected_attention(
        q[:1], kv, tables[:1], 1, blocks[:1], positions[:1], RATIO, scale
    )
    assert torch.equal(one[0], four[0]) and torch.equal(four[0], four[4])
    want = selector.selected_attention_ref(q, kv, tables, 1, blocks, positions, RATIO, scale)
    assert _relative_l2(four, want) < 1e-2


@pytest.mark.parametrize("device", DEVICES)
def test_equal_scores_pick_the_earlier_blocks_at_any_table_width(device: str) -> None:
    # Scores are sums of ReLUs, so blocks often score exactly 0 (-0.0 among them):
    # the top 3 of one strong block and ties are it and the two earliest tied blocks
    # (then the open group's block, 12), whether the table reaches 16 blocks or 64
    # (torch.topk alone answers each width differently), on every row alike.
    geometry = selector.SelectorGeometry(RATIO, 3 * RATIO, PAGE)
    positions = torch.full((3,), 12 * RATIO, device=device)  # 12 complete blocks
    valid = torch.ones(3, dtype=torch.bool, device=device)
    picks = []
    for width in (16, 64):
        scores = torch.zeros(3, width, device=device)
        scores[:, 0] = -0.0
        scores[:, 7] = 1.5
        scores[:, 12:] = float("-inf")
        picks.append(selector.select_blocks(scores, positions, valid, geometry))
    want = torch.tensor([[7, 0, 1, 12]] * 3, dtype=torch.int32, device=device)
    assert torch.equal(picks[0], want) and torch.equal(picks[1], want)
    # Fewer complete blocks than the budget: the -inf ones are never picked.
    few = torch.full((1, 16), float("-inf"), device=device)
    few[0, :2] = 0.0
    one = torch.tensor([9], device=device)
    got = selector.select_blocks(few, one, valid[:1], geometry)
    assert got.tolist() == [[0, 1, -1, 2]]


def test_the_selection_ranks_any_float_score_by_its_value() -> None:
    # Negative and positive scores, a NaN and a -inf: the keys order them as floats
    # (NaN first, as torch.topk puts it), -inf never picked.
    geometry = selector.SelectorGeometry(RATIO, 5 * RATIO, PAGE)
    scores = torch.tensor([[1.0, -2.0, 0.5, float("-inf"), -0.25, float("nan"), 3.0]])
    positions = torch.tensor([7 * RATIO - 1])  # every block complete, no open group
    valid = torch.ones(1, dtype=torch.bool)
    got = selector.select_blocks(scores, positions, valid, geometry)
    assert got.tolist() == [[5, 6, 0, 2, 4, -1]]
    with pytest.raises(TypeError, match="float32"):
        selector.select_blocks(scores.bfloat16(), positions, valid, geometry)
