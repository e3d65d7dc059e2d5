"""Paged attention: the Triton kernels against the float32 torch references.

On a machine without CUDA the kernels run under Triton's interpreter (see conftest.py);
the ``gpu`` tests repeat the checks at serving geometry on the H200 and add CUDA-graph
capture and replay.

Every cache slot a kernel must not read (the null page, rows past a request's length,
pages of requests outside the batch, the chunk's unwritten padding) holds NaN, and so do
the q rows of padding: a single stray read would put NaN in the output.

Tolerance: operands are bf16 and accumulation fp32, but the kernels round the softmax
probabilities to bf16 for the P @ V product and round the output to bf16, each a
relative error of about 2^-9 per element; the relative L2 error lands around 3e-3.
1e-2 leaves margin for that while any indexing or masking bug gives errors of order 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pytest
import torch

from ignition.components import attention, triton_attention
from ignition.components.attention import (
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    triton_paged_decode_attention,
    triton_paged_prefill_attention,
)
from ignition.components.triton_attention import MAX_PREFILL_SPLITS, prefill_splits

TOLERANCE = 1e-2
# The small-geometry tests run on the GPU where there is one (the kernels only run
# interpreted on CPU tensors, and compiled on CUDA tensors).
LOCAL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Geometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


SMALL = Geometry(num_heads=4, num_kv_heads=2, head_dim=32, page_size=16)
SERVING = Geometry(num_heads=32, num_kv_heads=8, head_dim=128, page_size=64)
SMOL = Geometry(num_heads=9, num_kv_heads=3, head_dim=64, page_size=64)  # SmolLM2-135M


@dataclass
class Requests:
    """Token data and a shuffled, non-contiguous page assignment for some requests."""

    geometry: Geometry
    num_pages: int
    lengths: list[int]
    tables: list[torch.Tensor]  # int32 [max_pages]; unused entries point at null page 0
    data: list[torch.Tensor]  # bf16 [2, length, num_kv_heads, head_dim]

    def kv(self, written: Iterable[int], device: str | torch.device = "cpu") -> torch.Tensor:
        """A cache holding the tokens of the requests in ``written``, NaN elsewhere."""
        g = self.geometry
        shape = (2, self.num_pages, g.page_size, g.num_kv_heads, g.head_dim)
        kv = torch.full(shape, float("nan"), dtype=torch.bfloat16)
        for i in written:
            pos = torch.arange(self.lengths[i])
            pages = self.tables[i][pos // g.page_size].long()
            kv[:, pages, pos % g.page_size] = self.data[i]
        return kv.to(device)


def make_requests(
    geometry: Geometry,
    lengths: Sequence[int],
    *,
    max_pages: int,
    seed: int,
    num_pages: int | None = None,
) -> Requests:
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // geometry.page_size) for n in lengths]
    if num_pages is None:
        num_pages = 1 + sum(needed) + 3  # a few pages that nobody owns
    assert max(needed, default=0) <= max_pages and 1 + sum(needed) <= num_pages
    free = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()  # never page 0
    tables, data = [], []
    for n, count in zip(lengths, needed, strict=True):
        table = torch.zeros(max_pages, dtype=torch.int32)
        table[:count] = torch.tensor(free[:count], dtype=torch.int32)
        free = free[count:]
        tables.append(table)
        shape = (2, n, geometry.num_kv_heads, geometry.head_dim)
        data.append(torch.randn(shape, generator=gen).to(torch.bfloat16))
    return Requests(geometry, num_pages, list(lengths), tables, data)


def random_q(rows: int, geometry: Geometry, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, geometry.num_heads, geometry.head_dim)
    return torch.randn(shape, generator=gen).to(torch.bfloat16)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


DecodeFn = Callable[..., torch.Tensor]


def run_decode(
    fn: DecodeFn,
    reqs: Requests,
    order: Sequence[int],
    q_all: torch.Tensor,
    kv: torch.Tensor,
    **kwargs: object,
) -> torch.Tensor:
    """Runs requests ``order`` as one batch (row b is request order[b])."""
    device = kv.device
    q = q_all[list(order)].to(device)
    table = torch.stack([reqs.tables[i] for i in order]).to(device)
    seq_lens = torch.tensor([reqs.lengths[i] for i in order], dtype=torch.int32, device=device)
    return fn(q, kv, table, seq_lens, reqs.geometry.scale, **kwargs)


def decode_q(reqs: Requests, seed: int) -> torch.Tensor:
    q = random_q(len(reqs.lengths), reqs.geometry, seed)
    for i, n in enumerate(reqs.lengths):
        if n == 0:
            q[i] = float("nan")  # padding rows carry garbage
    return q


def check_decode(
    geometry: Geometry,
    lengths: Sequence[int],
    *,
    max_pages: int,
    seed: int,
    device: str = LOCAL_DEVICE,
    **kwargs: int,
) -> None:
    """Reference match, exact zeros for padding, no NaN, and batch invariance: each row
    equals, bitwise, the same request run alone (other requests' pages NaN) and the
    same request at the mirrored index of the reversed batch."""
    reqs = make_requests(geometry, lengths, max_pages=max_pages, seed=seed)
    q_all = decode_q(reqs, seed + 1)
    rows = range(len(lengths))
    kv = reqs.kv(rows, device)
    out = run_decode(triton_paged_decode_attention, reqs, rows, q_all, kv, **kwargs)
    ref = run_decode(paged_decode_attention_ref, reqs, rows, q_all, kv.cpu())

    assert out.shape == q_all.shape and out.dtype == torch.bfloat16
    assert not out.isnan().any()
    for b, n in enumerate(lengths):
        if n == 0:
            assert torch.all(out[b] == 0), f"padding row {b} is not zero"
        else:
            err = rel_l2(out[b], ref[b])
            assert err < TOLERANCE, f"row {b} (seq_len {n}): rel L2 {err:.2e}"

    for b in rows:
        alone = run_decode(
            triton_paged_decode_attention, reqs, [b], q_all, reqs.kv([b], device), **kwargs
        )
        assert torch.equal(alone[0], out[b]), f"row {b} differs between B=1 and B={len(rows)}"
    if len(lengths) > 1:
        order = list(reversed(rows))
        mirrored = run_decode(triton_paged_decode_attention, reqs, order, q_all, kv, **kwargs)
        assert torch.equal(mirrored.flip(0), out), "output depends on the row's batch index"


@dataclass
class PrefillInputs:
    q: torch.Tensor  # on the CPU: the reference reads it there
    kv: torch.Tensor
    table: torch.Tensor
    start: torch.Tensor
    n_valid: torch.Tensor


def prefill_inputs(
    geometry: Geometry, chunk: int, start: int, n_valid: int, *, seed: int, device: str
) -> PrefillInputs:
    """One chunk of ``chunk`` rows (the last ``chunk - n_valid`` NaN padding) after
    ``start`` cached tokens, on shuffled pages."""
    max_pages = -(-(start + chunk) // geometry.page_size) + 1
    # Request 0 is the prefilled one (history plus this chunk's real tokens); request 1
    # only owns pages, left NaN, that must never be read.
    reqs = make_requests(
        geometry, [start + n_valid, 2 * geometry.page_size], max_pages=max_pages, seed=seed
    )
    q = random_q(chunk, geometry, seed + 1)
    q[n_valid:] = float("nan")
    return PrefillInputs(
        q=q,
        kv=reqs.kv([0], device),
        table=reqs.tables[0].to(device),
        start=torch.tensor([start], dtype=torch.int32, device=device),
        n_valid=torch.tensor([n_valid], dtype=torch.int32, device=device),
    )


def run_prefill(
    inputs: PrefillInputs,
    geometry: Geometry,
    q: torch.Tensor | None = None,
    *,
    block_t: int | None = None,
    num_splits: int | None = None,
    key_pages: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    longest_first: bool = True,
) -> torch.Tensor:
    """The Triton kernel on ``inputs`` (with ``q`` in place of ``inputs.q`` if given)."""
    q = inputs.q if q is None else q
    return triton_paged_prefill_attention(
        q.to(inputs.kv.device),
        inputs.kv,
        inputs.table,
        inputs.start,
        inputs.n_valid,
        geometry.scale,
        block_t=block_t,
        num_splits=num_splits,
        key_pages=key_pages,
        num_warps=num_warps,
        num_stages=num_stages,
        longest_first=longest_first,
    )


def prefill_ref(inputs: PrefillInputs, geometry: Geometry) -> torch.Tensor:
    return paged_prefill_attention_ref(
        inputs.q,
        inputs.kv.cpu(),
        inputs.table.cpu(),
        inputs.start.cpu(),
        inputs.n_valid.cpu(),
        geometry.scale,
    )


def check_prefill(
    geometry: Geometry,
    chunk: int,
    start: int,
    n_valid: int,
    *,
    seed: int,
    device: str = LOCAL_DEVICE,
    block_t: int | None = None,
    num_splits: int | None = None,
    key_pages: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Reference match, exact zeros for padding rows, no NaN; padding rows (NaN in q)
    do not change the real rows. Returns the output."""
    inputs = prefill_inputs(geometry, chunk, start, n_valid, seed=seed, device=device)
    q = inputs.q
    tiling = dict(
        block_t=block_t,
        num_splits=num_splits,
        key_pages=key_pages,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    out = run_prefill(inputs, geometry, **tiling)
    ref = prefill_ref(inputs, geometry)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert not out.isnan().any()
    assert torch.all(out[n_valid:] == 0), "padding rows are not zero"
    if n_valid > 0:
        err = rel_l2(out[:n_valid], ref[:n_valid])
        assert err < TOLERANCE, f"rel L2 {err:.2e}"

    q_other = q.clone()
    q_other[n_valid:] = 1.0
    again = run_prefill(inputs, geometry, q_other, **tiling)
    assert torch.equal(again, out), "padding rows changed the real rows"
    return out


# --- small geometry: Triton interpreter on CPU, or the GPU where there is one ----------

P = SMALL.page_size


@pytest.mark.parametrize(
    "lengths",
    [
        [P + 1],
        [0],
        [P, 1],
        [P - 1, 0, P + 1],
        [0, P + 1, P, 1],
        [P - 1, 40, 0, 33],
    ],
)
def test_decode_small(lengths: list[int]) -> None:
    check_decode(SMALL, lengths, max_pages=4, seed=sum(lengths) + len(lengths))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_few_splits(num_splits: int) -> None:
    # 7 pages over 3 splits: [0, 3), [3, 6), [6, 7): several pages per split, one short.
    check_decode(SMALL, [100, 0, 47, 64], max_pages=8, seed=7, num_splits=num_splits)


def test_decode_page_64_head_dim_64() -> None:
    geometry = Geometry(num_heads=4, num_kv_heads=2, head_dim=64, page_size=64)
    check_decode(geometry, [65, 0, 64, 1], max_pages=3, seed=11)


def test_decode_group_not_power_of_two() -> None:
    # Qwen3-14B style: 40 heads over 8 kv heads; here 6 over 2 (group 3, padded to 16).
    geometry = Geometry(num_heads=6, num_kv_heads=2, head_dim=32, page_size=16)
    check_decode(geometry, [33, 0, 16], max_pages=3, seed=13, num_splits=4)


@pytest.mark.parametrize("key_pages", [1, 2])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_t", [None, 8])
@pytest.mark.parametrize(
    ("start", "n_valid"),
    [
        (0, 32),  # whole chunk, from the first token
        (0, 17),  # n_valid < T, ends one past a page
        (0, 1),
        (0, 0),  # nothing real: all zeros
        (16, 16),  # history of exactly one page
        (15, 32),  # history ends one short of a page
        (17, 15),  # history one past a page, chunk ends on a boundary
        (47, 9),
    ],
)
def test_prefill_small(
    start: int, n_valid: int, block_t: int | None, num_splits: int, key_pages: int
) -> None:
    # key_pages 2: steps of two pages, the last of which may lie past the chunk's range.
    check_prefill(
        SMALL,
        32,
        start,
        n_valid,
        seed=start * 64 + n_valid,
        block_t=block_t,
        num_splits=num_splits,
        key_pages=key_pages,
    )


@pytest.mark.parametrize("num_splits", [1, 2])
def test_prefill_page_64_head_dim_64(num_splits: int) -> None:
    geometry = Geometry(num_heads=4, num_kv_heads=2, head_dim=64, page_size=64)
    check_prefill(geometry, 48, 63, 40, seed=5, block_t=8, num_splits=num_splits)
    check_prefill(geometry, 48, 63, 40, seed=5, block_t=8, num_splits=num_splits, key_pages=2)


@pytest.mark.parametrize(("start", "n_valid"), [(0, 32), (17, 27)])
def test_prefill_tile_order_changes_no_bits(start: int, n_valid: int) -> None:
    # Four tiles of 8 tokens, longest first (the default) and in launch order: each
    # program's tile, rows and keys are the same, so are the bits.
    inputs = prefill_inputs(SMALL, 32, start, n_valid, seed=11, device=LOCAL_DEVICE)
    first = run_prefill(inputs, SMALL, block_t=8, num_splits=1)
    in_order = run_prefill(inputs, SMALL, block_t=8, num_splits=1, longest_first=False)
    assert torch.equal(first, in_order)
    assert torch.all(first[n_valid:] == 0)


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize(("start", "n_valid"), [(0, 32), (17, 27), (47, 9)])
def test_prefill_scale_inside_exp2(num_splits: int, start: int, n_valid: int) -> None:
    # The scale inside exp2's argument (one FMA an element on the GPU), the row maxima
    # scaled after the max: the reference's values, padding rows zero and without
    # effect, in both the single-pass and the split kernels, a chunk with and without
    # history, the masked steps included.
    check_prefill(SMALL, 32, start, n_valid, seed=start + n_valid, block_t=8, num_splits=num_splits)


def test_prefill_group_not_power_of_two() -> None:
    geometry = Geometry(num_heads=6, num_kv_heads=2, head_dim=32, page_size=16)
    check_prefill(geometry, 24, 5, 20, seed=6, block_t=4, num_splits=1)


# Split-KV prefill after a long history: tiles of 8 tokens, so the tiles' page counts
# differ and split boundaries fall in different places per tile. Split s of a tile takes
# pages [s * pps, (s + 1) * pps) of its total_pages, pps = cdiv(total_pages, num_splits).
#   start 95, n_valid 32: tile 0 (positions 95..102) has 6 full pages and 1 tail page, so
#     with 3 or 7 splits the last split is page 6 alone, which position 95 cannot see
#     (a row with no visible key in its split); with 2, split 1 mixes full pages and the
#     tail. Tiles 2 and 3 have 8 pages: with 7 splits (pps 2) splits 4..6 are empty.
#   start 95, n_valid 21: as above, tile 3 is padding only (no pages in any split).
#   start 108, n_valid 13: tile 0's tail spans 2 pages; tiles 2 and 3 are padding only.
@pytest.mark.parametrize("key_pages", [1, 2, 4])
@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize(("start", "n_valid"), [(95, 32), (95, 21), (108, 13)])
def test_prefill_split_long_history(
    start: int, n_valid: int, num_splits: int, key_pages: int
) -> None:
    # With key_pages > 1 the split boundaries fall on steps of that many pages.
    check_prefill(
        SMALL,
        32,
        start,
        n_valid,
        seed=start + n_valid,
        block_t=8,
        num_splits=num_splits,
        key_pages=key_pages,
    )


@pytest.mark.parametrize("num_splits", [3, 7])
def test_prefill_split_group_not_power_of_two(num_splits: int) -> None:
    # Group 3 padded to 4, tiles of 4 tokens. Position 79 ends page 4, so tile 0 has 5
    # full pages and page 5 as its tail, which its first row cannot see; with 7 splits
    # that page is a split of its own and the last split is empty.
    geometry = Geometry(num_heads=6, num_kv_heads=2, head_dim=32, page_size=16)
    check_prefill(geometry, 24, 79, 19, seed=8, block_t=4, num_splits=num_splits)


def test_prefill_split_default() -> None:
    # One tile of 32 tokens x 2 kv heads: the default asks for the most splits; 8 pages
    # give one page per split and leave splits 8..15 empty.
    assert prefill_splits(32, 32, SMALL.num_kv_heads) == MAX_PREFILL_SPLITS == 16
    check_prefill(SMALL, 32, 95, 21, seed=9)


def test_prefill_tiling_rule() -> None:
    # Long chunks of Qwen3-8B's group shape take the tiling measured for them; shorter
    # chunks and other shapes keep the general one.
    long = triton_attention.LONG_CHUNK_TILING
    assert triton_attention.prefill_tiling(4096, 4, 128) == long
    assert triton_attention.prefill_tiling(8192, 4, 128) == long
    general = triton_attention.prefill_tiling(2048, 4, 128)
    assert general.rows == triton_attention.DEFAULT_PREFILL_ROWS and general.key_pages == 1
    assert triton_attention.prefill_tiling(4096, 4, 64) == general  # SmolLM2's head size
    assert triton_attention.prefill_tiling(4096, 8, 128) == general
    # The long tiling fills the grid alone: one split for 4,096 tokens and 8 kv heads.
    assert prefill_splits(4096, long.rows // 4, 8) == 1


@pytest.mark.gpu
def test_prefill_long_chunk_default_gpu() -> None:
    # The default tiling of a 4,096-token chunk (the long-chunk tiling for this shape)
    # after a history that ends mid-page, against SDPA in float32 over the same keys.
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    chunk, start, n_valid = 4096, 4129, 4000
    inputs = prefill_inputs(SERVING, chunk, start, n_valid, seed=21, device="cuda")
    assert triton_attention.prefill_tiling(chunk, 4, SERVING.head_dim).rows == 128
    out = run_prefill(inputs, SERVING)
    total = start + n_valid
    k, v = attention._gather_history(inputs.kv, inputs.table, total)
    q = inputs.q[:n_valid].to(out.device).float().permute(1, 0, 2).unsqueeze(0)
    ref = F.scaled_dot_product_attention(
        q,
        k.permute(1, 0, 2).unsqueeze(0),
        v.permute(1, 0, 2).unsqueeze(0),
        causal_lower_right(n_valid, total),
        scale=SERVING.scale,
        enable_gqa=True,
    )[0].permute(1, 0, 2)
    assert not out.isnan().any()
    assert torch.all(out[n_valid:] == 0), "padding rows are not zero"
    err = rel_l2(out[:n_valid], ref)
    assert err < TOLERANCE, f"rel L2 {err:.2e}"
    # The tiles longest first (the default) and in launch order: the same bits.
    assert torch.equal(out, run_prefill(inputs, SERVING, longest_first=False))


def test_prefill_splits_rule() -> None:
    # SmolLM2-135M (3 kv heads, group 3 padded to 4: tiles of 16 tokens): 8 tiles x 3 kv
    # heads = 24 programs -> 16 splits (capped); 96 -> 11; 1,536 programs need no split.
    assert prefill_splits(128, 16, 3) == 16
    assert prefill_splits(512, 16, 3) == 11
    assert prefill_splits(8192, 16, 3) == 1
    # 8 kv heads: 64 programs -> 16; 256 -> 4; 1,024 (the target) -> 1.
    assert prefill_splits(128, 16, 8) == 16
    assert prefill_splits(512, 16, 8) == 4
    assert prefill_splits(2048, 16, 8) == 1
    assert prefill_splits(1, 16, 3) == MAX_PREFILL_SPLITS
    assert prefill_splits(0, 16, 3) == 1
    for kv_heads in (1, 2, 3, 8):
        for tokens in range(1, 3000, 7):
            assert 1 <= prefill_splits(tokens, 16, kv_heads) <= MAX_PREFILL_SPLITS


def test_prefill_default_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default runs the single-pass kernel when the grid is wide enough and the split
    kernel otherwise, bitwise as the explicit choice. "Wide enough" is 1,024 programs, too
    many for the interpreter, so the target is lowered to 8 here."""
    monkeypatch.setattr(triton_attention, "PREFILL_TARGET_PROGRAMS", 8)
    inputs = prefill_inputs(SMALL, 32, 95, 21, seed=10, device=LOCAL_DEVICE)
    assert prefill_splits(32, 8, SMALL.num_kv_heads) == 1  # 4 tiles x 2 kv heads
    default = run_prefill(inputs, SMALL, block_t=8)
    assert torch.equal(default, run_prefill(inputs, SMALL, block_t=8, num_splits=1))
    assert prefill_splits(32, 16, SMALL.num_kv_heads) == 2  # 2 tiles x 2 kv heads
    default = run_prefill(inputs, SMALL, block_t=16)
    assert torch.equal(default, run_prefill(inputs, SMALL, block_t=16, num_splits=2))


def test_num_splits_default_matches_kernels() -> None:
    assert attention.DEFAULT_NUM_SPLITS == triton_attention.DEFAULT_NUM_SPLITS


# --- GPU (H200) -----------------------------------------------------------------------

GPU_MAX_PAGES = 4096 // SERVING.page_size + 2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lengths",
    [
        [1],
        [63],
        [64],
        [65],
        [1000],
        [4096],
        [4096, 1],
        [65, 0],
        [1000, 63, 0, 4096],
        [64, 4096, 1, 65],
    ],
)
def test_decode_gpu(lengths: list[int]) -> None:
    check_decode(
        SERVING, lengths, max_pages=GPU_MAX_PAGES, seed=sum(lengths) + len(lengths), device="cuda"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [128, 512])
@pytest.mark.parametrize("start", [0, 4096])
@pytest.mark.parametrize("short", [0, 37])
def test_prefill_gpu(chunk: int, start: int, short: int) -> None:
    check_prefill(SERVING, chunk, start, chunk - short, seed=chunk + start + short, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("rows", "key_pages", "num_warps", "num_stages"),
    [(64, 2, 4, 2), (128, 1, 8, 2), (128, 2, 8, 2), (128, 2, 8, 3), (128, 2, 4, 3), (128, 1, 4, 2)],
)
@pytest.mark.parametrize(("start", "n_valid"), [(0, 512), (4129, 500)])
def test_prefill_tilings_gpu(
    rows: int, key_pages: int, num_warps: int, num_stages: int, start: int, n_valid: int
) -> None:
    # The compiled kernel at the tilings the prefill bench sweeps (the Qwen3-8B shape:
    # a group of 4, so rows / 4 tokens per tile), single pass and split.
    for num_splits in (1, 3):
        check_prefill(
            SERVING,
            512,
            start,
            n_valid,
            seed=start + n_valid + rows + key_pages,
            device="cuda",
            block_t=rows // 4,
            num_splits=num_splits,
            key_pages=key_pages,
            num_warps=num_warps,
            num_stages=num_stages,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, MAX_PREFILL_SPLITS])
@pytest.mark.parametrize("start", [8000, 8033])
@pytest.mark.parametrize(("chunk", "n_valid"), [(128, 11), (512, 370)])
@pytest.mark.parametrize("geometry", [SMOL, SERVING], ids=["smol", "serving"])
def test_prefill_split_gpu(
    geometry: Geometry, chunk: int, n_valid: int, start: int, num_splits: int | None
) -> None:
    # The prefix-cache case: a short chunk after a long cached history. By default SmolLM2
    # gets 11 splits at capacity 128 and 3 at 512; the serving geometry 5 and 2.
    check_prefill(
        geometry,
        chunk,
        start,
        n_valid,
        seed=start + chunk + n_valid + geometry.head_dim,
        device="cuda",
        num_splits=num_splits,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", [SMOL, SERVING], ids=["smol", "serving"])
def test_prefill_large_chunk_single_pass_gpu(geometry: Geometry) -> None:
    # A chunk whose tiles of 16 tokens times its kv heads reach the target grid
    # (5,472 tokens for 3 kv heads, 2,048 for 8): the default is the single-pass
    # kernel, bitwise.
    tiles = -(-triton_attention.PREFILL_TARGET_PROGRAMS // geometry.num_kv_heads)
    chunk = 16 * tiles
    assert prefill_splits(chunk, 16, geometry.num_kv_heads) == 1
    assert prefill_splits(chunk - 16, 16, geometry.num_kv_heads) > 1
    out = check_prefill(geometry, chunk, 4096, chunk - 48, seed=21, device="cuda")
    inputs = prefill_inputs(geometry, chunk, 4096, chunk - 48, seed=21, device="cuda")
    assert torch.equal(out, run_prefill(inputs, geometry, num_splits=1))


def _capture(fn: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warms ``fn`` up on a side stream (Triton compiles there), then captures it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.gpu
def test_decode_cuda_graph_replay() -> None:
    g = SERVING
    batch, max_pages = 4, GPU_MAX_PAGES
    num_pages = 1 + batch * max_pages + 8
    scenarios = [
        [100, 0, 5, 64],  # captured with this one
        [4096, 1, 0, 65],
        [63, 1000, 4096, 0],
        [1, 64, 2000, 3000],
    ]
    q = torch.empty((batch, g.num_heads, g.head_dim), dtype=torch.bfloat16, device="cuda")
    kv = torch.empty(
        (2, num_pages, g.page_size, g.num_kv_heads, g.head_dim),
        dtype=torch.bfloat16,
        device="cuda",
    )
    table = torch.empty((batch, max_pages), dtype=torch.int32, device="cuda")
    seq_lens = torch.empty((batch,), dtype=torch.int32, device="cuda")

    def load(step: int) -> Requests:
        # New contents written into the captured tensors in place.
        reqs = make_requests(
            g, scenarios[step], max_pages=max_pages, num_pages=num_pages, seed=100 + step
        )
        kv.copy_(reqs.kv(range(batch)))
        q.copy_(decode_q(reqs, 200 + step))
        table.copy_(torch.stack(reqs.tables))
        seq_lens.copy_(torch.tensor(reqs.lengths, dtype=torch.int32))
        return reqs

    def step() -> torch.Tensor:
        return triton_paged_decode_attention(q, kv, table, seq_lens, g.scale)

    load(0)
    graph, out = _capture(step)
    for i in range(1, len(scenarios)):
        reqs = load(i)
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_decode_attention_ref(q.cpu(), kv.cpu(), table.cpu(), seq_lens.cpu(), g.scale)
        assert not out.isnan().any()
        for b, n in enumerate(reqs.lengths):
            if n == 0:
                assert torch.all(out[b] == 0), f"replay {i}: padding row {b} is not zero"
            else:
                err = rel_l2(out[b], ref[b])
                assert err < TOLERANCE, f"replay {i} row {b} (seq_len {n}): rel L2 {err:.2e}"
        assert torch.equal(out, step()), f"replay {i} differs from an eager call"


def check_prefill_replay(
    g: Geometry, chunk: int, scenarios: Sequence[tuple[int, int]], num_splits: int | None
) -> None:
    """Captures one call with ``scenarios[0]`` (start, n_valid), replays the graph with
    each other scenario written into the captured tensors, and checks every replay."""
    max_start = max(first for first, _ in scenarios)
    max_pages = -(-(max_start + chunk) // g.page_size) + 1
    num_pages = 1 + max_pages + 8
    q = torch.empty((chunk, g.num_heads, g.head_dim), dtype=torch.bfloat16, device="cuda")
    kv = torch.empty(
        (2, num_pages, g.page_size, g.num_kv_heads, g.head_dim),
        dtype=torch.bfloat16,
        device="cuda",
    )
    table = torch.empty((max_pages,), dtype=torch.int32, device="cuda")
    start = torch.empty((1,), dtype=torch.int32, device="cuda")
    n_valid = torch.empty((1,), dtype=torch.int32, device="cuda")

    def load(step: int) -> None:
        first, count = scenarios[step]
        reqs = make_requests(
            g, [first + count], max_pages=max_pages, num_pages=num_pages, seed=300 + step
        )
        kv.copy_(reqs.kv([0]))
        q_new = random_q(chunk, g, 400 + step)
        q_new[count:] = float("nan")
        q.copy_(q_new)
        table.copy_(reqs.tables[0])
        start.fill_(first)
        n_valid.fill_(count)

    def step() -> torch.Tensor:
        return triton_paged_prefill_attention(
            q, kv, table, start, n_valid, g.scale, num_splits=num_splits
        )

    load(0)
    graph, out = _capture(step)
    for i in range(1, len(scenarios)):
        load(i)
        graph.replay()
        torch.cuda.synchronize()
        count = scenarios[i][1]
        ref = paged_prefill_attention_ref(
            q.cpu(), kv.cpu(), table.cpu(), start.cpu(), n_valid.cpu(), g.scale
        )
        assert not out.isnan().any()
        assert torch.all(out[count:] == 0), f"replay {i}: padding rows are not zero"
        if count > 0:
            err = rel_l2(out[:count], ref[:count])
            assert err < TOLERANCE, f"replay {i}: rel L2 {err:.2e}"
        assert torch.equal(out, step()), f"replay {i} differs from an eager call"


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, None])
def test_prefill_cuda_graph_replay(num_splits: int | None) -> None:
    # (start, n_valid); the default gives 5 splits here.
    scenarios = [(0, 128), (4096, 128), (1000, 77), (63, 1), (64, 0)]
    check_prefill_replay(SERVING, 128, scenarios, num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [128, 512])
def test_prefill_split_cuda_graph_replay(chunk: int) -> None:
    # SmolLM2 with its default splits (11 at capacity 128, 3 at 512), captured on a
    # short chunk after a long history and replayed with other histories and lengths.
    scenarios = [(8000, 11), (6000, chunk - 1), (0, chunk), (8191, 1), (4096, 0), (63, 77)]
    check_prefill_replay(SMOL, chunk, scenarios, None)
