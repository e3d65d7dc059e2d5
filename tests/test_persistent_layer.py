"""A decode layer in one persistent kernel (``ignition.components.persistent_layer``)
computes what the per-kernel chain of ``--decode-fusion norms`` computes: phase by
phase (the interpreter's only way, and the GPU's ``by_phase``), bit for bit; with its
grid barriers (GPU only), bit for bit the same kernel phase by phase, and again and
again from one captured graph (the barrier's state restores itself)."""

from __future__ import annotations

import pytest
import torch

from ignition.components import linear
from ignition.components.kv_cache import PagedKvCache
from ignition.components.persistent_layer import (
    PHASES,
    LayerStep,
    LayerWeights,
    chain_layer,
    layer_shape,
    phase_tiles,
    triton_persistent_layer,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _layer(
    lengths: list[int], hidden: int, heads: int, kv_heads: int, dim: int, inter: int,
    page: int, norms: bool, seed: int, device: str = DEVICE,
) -> tuple[torch.Tensor, torch.Tensor, LayerWeights, LayerStep]:  # fmt: skip
    """Rows of ``lengths`` cached tokens (0: padding), each row's newest token pending;
    random history in the cache, the null page zero; x and its partial squares."""
    gen = torch.Generator().manual_seed(seed)
    rows_n = len(lengths)
    max_pages = max(1, max(-(-n // page) for n in lengths))
    pages = 2 + sum(-(-n // page) for n in lengths)
    free = (torch.randperm(pages - 1, generator=gen) + 1).tolist()
    table = torch.zeros(rows_n, max_pages, dtype=torch.int32)
    rows = torch.zeros(rows_n, dtype=torch.int64)
    for b, n in enumerate(lengths):
        count = -(-n // page)
        table[b, :count] = torch.tensor(free[:count], dtype=torch.int32)
        free = free[count:]
        rows[b] = int(table[b, (n - 1) // page]) * page + (n - 1) % page if n else 2 + b % 2
    cache = PagedKvCache.allocate(
        1, pages, page, kv_heads, dim, torch.bfloat16, torch.device("cpu")
    )
    kv = cache.kv[0]
    kv.copy_(torch.randn(kv.shape, generator=gen).to(torch.bfloat16))
    kv[:, 0] = 0
    angles = torch.rand(rows_n, dim // 2, generator=gen) * 6.3
    angles = torch.cat((angles, angles), dim=-1)
    to = {"device": device, "dtype": torch.bfloat16}

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) / k**0.5).to(**to)

    norm = [(1 + torch.randn(dim, generator=gen) / 4).to(**to) for _ in range(2)]
    weights = LayerWeights(
        qkv=w((heads + 2 * kv_heads) * dim, hidden),
        o=w(hidden, heads * dim),
        gate_up=w(2 * inter, hidden),
        down=w(hidden, inter),
        q_norm=norm[0] if norms else None,
        k_norm=norm[1] if norms else None,
    )
    step = LayerStep(
        kv=kv.to(device),
        page_tables=table.to(device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        rows=rows.to(device),
        cos=angles.cos().to(**to),
        sin=angles.sin().to(**to),
    )
    x = (torch.randn(rows_n, hidden, generator=gen) * 2).to(**to)
    return x, linear.group_squares(x), weights, step


def _both(
    x: torch.Tensor,
    squares: torch.Tensor | None,
    weights: LayerWeights,
    step: LayerStep,
    heads: int,
    **kwargs: bool,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor]:
    """(chain's output, squares, cache), (persistent's output, squares, cache), each
    from the same cache."""
    dim = step.kv.shape[-1]
    shape = layer_shape(weights, heads, dim, x.shape[0], EPS, norm_eps=1e-6)
    chain_step = step._replace(kv=step.kv.clone())
    ours_step = step._replace(kv=step.kv.clone())
    state = torch.zeros(2, dtype=torch.int32, device=x.device)
    chain = chain_layer(x, squares, weights, chain_step, shape)
    ours = triton_persistent_layer(x, squares, weights, ours_step, shape, state, **kwargs)
    return (*chain, chain_step.kv), (*ours, ours_step.kv), state


GEOMETRIES = [
    # hidden, heads, kv heads, head_dim, intermediate, page
    (64, 4, 2, 16, 96, 16),
    (96, 6, 2, 16, 160, 16),  # a group of three, padded to the dot's 16 rows
]


@pytest.mark.parametrize("norms", [True, False])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_phase_by_phase_gives_the_chains_bits(norms: bool, geometry: tuple) -> None:
    hidden, heads, kv_heads, dim, inter, page = geometry
    lengths = [1, page, 0, 3 * page + 5]
    x, squares, weights, step = _layer(lengths, hidden, heads, kv_heads, dim, inter, page, norms, 7)
    chain, ours, state = _both(x, squares, weights, step, heads, by_phase=True)
    for a, b in zip(chain, ours, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(ours[2], step.kv), "the newest tokens were written"
    assert state.tolist() == [0, 0], "phase by phase never touches the barrier"


def test_the_first_layer_takes_its_rows_normalized() -> None:
    """No squares (the embeddings'): x is projected as it is, as the chain does."""
    x, _, weights, step = _layer([5, 17], 64, 4, 2, 16, 96, 16, False, 3)
    chain, ours, _ = _both(x, None, weights, step, 4, by_phase=True)
    for a, b in zip(chain, ours, strict=True):
        assert torch.equal(a, b)


def test_a_row_never_depends_on_its_batch() -> None:
    lengths = [40, 0, 17, 90]
    x, squares, weights, step = _layer(lengths, 64, 4, 2, 16, 96, 16, True, 11)
    _, (y_all, s_all, _), _ = _both(x, squares, weights, step, 4, by_phase=True)
    for b in (0, 2, 3):
        one = LayerStep(*(t[b : b + 1] if t.dim() < 5 else t for t in step))
        _, (y_one, s_one, _), _ = _both(
            x[b : b + 1], squares[b : b + 1], weights, one, 4, by_phase=True
        )
        assert torch.equal(y_one[0], y_all[b])
        assert torch.equal(s_one[0], s_all[b])


def test_every_phase_deals_its_tiles() -> None:
    weights = _layer([3, 9, 1], 64, 4, 2, 16, 96, 16, False, 1)[2]
    shape = layer_shape(weights, 4, 16, 3, EPS)
    counts = phase_tiles(3, shape, 64, 2, 16, 96)
    assert len(counts) == len(PHASES)
    qkv_n, _ = shape.tiles["qkv"]
    assert counts[0] == -(-(4 + 4) * 16 // qkv_n)
    assert counts[1:3] == (3 * 2 * shape.num_splits, 3 * 4)


def test_bad_inputs_are_refused() -> None:
    x, squares, weights, step = _layer([5, 0], 64, 4, 2, 16, 96, 16, False, 2)
    shape = layer_shape(weights, 4, 16, 2, EPS)
    state = torch.zeros(2, dtype=torch.int32, device=x.device)
    with pytest.raises(ValueError, match="contiguous"):
        triton_persistent_layer(x.t().contiguous().t(), squares, weights, step, shape, state)
    with pytest.raises(ValueError, match="does not pack"):
        triton_persistent_layer(x, squares, weights, step, shape._replace(heads=2), state)
    with pytest.raises(ValueError, match="two int32"):
        triton_persistent_layer(x, squares, weights, step, shape, state.long())
    with pytest.raises(ValueError, match="together"):
        odd = weights._replace(q_norm=torch.ones_like(step.cos[0]))
        triton_persistent_layer(x, squares, odd, step, shape, state)


@pytest.mark.gpu
@pytest.mark.parametrize("norms", [False, True])
@pytest.mark.parametrize("lengths", [[1], [40, 0, 17, 4090], [700] * 16])
def test_the_barriers_give_the_phase_by_phase_bits_on_the_gpu(
    norms: bool, lengths: list[int]
) -> None:
    """SmolLM2-135M's geometry (and Qwen3's q/k norms), compiled: one launch with its
    barriers (its weights prefetched into L2 or not) against the same kernel launched
    phase by phase, bit for bit; the chain
    within the rounding of its contracted attention arithmetic; and ten replays of one
    captured graph, each the same, with the barrier's count back at zero."""
    x, squares, weights, step = _layer(lengths, 576, 9, 3, 64, 1536, 64, norms, 5, "cuda")
    shape = layer_shape(weights, 9, 64, len(lengths), EPS)
    state = torch.zeros(2, dtype=torch.int32, device="cuda")
    chain, phased, _ = _both(x, squares, weights, step, 9, by_phase=True)
    ours_step = step._replace(kv=step.kv.clone())
    ours = triton_persistent_layer(x, squares, weights, ours_step, shape, state)
    for a, b in zip(phased, (*ours, ours_step.kv), strict=True):
        assert torch.equal(a, b)
    prefetch_step = step._replace(kv=step.kv.clone())
    prefetched = triton_persistent_layer(
        x, squares, weights, prefetch_step, shape, state, prefetch=True
    )
    for a, b in zip(phased, (*prefetched, prefetch_step.kv), strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(ours[0].float(), chain[0].float(), rtol=2**-6, atol=2**-6)
    assert state[0].item() == 0
    graph = torch.cuda.CUDAGraph()
    replay_step = step._replace(kv=step.kv.clone())
    with torch.cuda.graph(graph):
        y, y_squares = triton_persistent_layer(x, squares, weights, replay_step, shape, state)
    for _ in range(10):
        replay_step.kv.copy_(step.kv)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, ours[0]) and torch.equal(y_squares, ours[1])
        assert torch.equal(replay_step.kv, ours_step.kv)
    assert state[0].item() == 0
