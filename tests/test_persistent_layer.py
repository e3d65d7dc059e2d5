"""A decode layer in one persistent kernel (``ignition.components.persistent_layer``)
computes what the per-kernel chain of ``--decode-fusion norms`` computes: phase by
phase (the interpreter's only way, and the GPU's ``by_phase``), bit for bit; with its
grid barriers (GPU only), bit for bit the same kernel phase by phase, and again and
again from one captured graph (the barrier's state restores itself)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ignition.components import linear
from ignition.components.kv_cache import PagedKvCache, rope_decode_attention
from ignition.components.persistent_layer import (
    PHASES,
    STATE_WORDS,
    LayerShape,
    LayerStep,
    LayerWeights,
    chain_layer,
    default_tiles,
    layer_shape,
    phase_tiles,
    stack_layers,
    triton_persistent_layer,
    triton_persistent_step,
)
from ignition.components.programmatic_launch import programmatic_launch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
NORM_EPS = 1e-6


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


def _shape(weights: LayerWeights, heads: int, dim: int, rows: int, **widths: int) -> LayerShape:
    return layer_shape(weights, heads, dim, rows, EPS, norm_eps=NORM_EPS, widths=widths)


def _state(device: torch.device) -> torch.Tensor:
    return torch.zeros(STATE_WORDS, dtype=torch.int32, device=device)


def _both(
    x: torch.Tensor,
    squares: torch.Tensor | None,
    weights: LayerWeights,
    step: LayerStep,
    heads: int,
    widths: dict[str, int] | None = None,
    **kwargs: object,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor]:
    """(chain's output, squares, cache), (persistent's output, squares, cache), each
    from the same cache, and the barrier's state."""
    shape = _shape(weights, heads, step.kv.shape[-1], x.shape[0], **(widths or {}))
    chain_step = step._replace(kv=step.kv.clone())
    ours_step = step._replace(kv=step.kv.clone())
    state = _state(x.device)
    chain = chain_layer(x, squares, weights, chain_step, shape)
    ours = triton_persistent_layer(x, squares, weights, ours_step, shape, state, **kwargs)
    return (*chain, chain_step.kv), (*ours, ours_step.kv), state


def _eager(
    x: torch.Tensor, weights: LayerWeights, step: LayerStep, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer in float32 torch (the norms' gains are ones, folded or not), the
    attention by the registered operator's CPU reference: its output and cache."""

    def norm(h: torch.Tensor) -> torch.Tensor:
        h = h.float()
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)

    def mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return a.float() @ w.float().T

    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    kv = step.kv.cpu().unsqueeze(0).clone()
    qkv = mm(norm(x), weights.qkv).to(x.dtype)
    attn = rope_decode_attention(
        kv, 0, qkv.cpu(), cpu(weights.q_norm), cpu(weights.k_norm), NORM_EPS, step.cos.cpu(),
        step.sin.cpu(), step.rows.cpu(), heads, step.page_tables.cpu(), step.seq_lens.cpu(),
        step.kv.shape[-1] ** -0.5,
    ).to(x.device)  # fmt: skip
    h = x.float() + mm(attn.reshape(len(x), -1), weights.o)
    gate, up = mm(norm(h), weights.gate_up).chunk(2, dim=-1)
    return h + mm(F.silu(gate) * up, weights.down), kv[0].to(x.device)


GEOMETRIES = [
    # hidden, heads, kv heads, head_dim, intermediate, page
    (64, 4, 2, 16, 96, 16),
    (96, 6, 2, 16, 160, 16),  # a group of three, padded to the dot's 16 rows
]


def test_the_gated_phase_takes_the_chains_gated_tile_on_many_sms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As the chain's gated kernel: on 132 SMs a packed gate/up of 2 x 512 rows takes
    # 64 columns (32 a half), where a plain weight that narrow takes 16.
    monkeypatch.setattr(linear, "_sm_count", lambda device: 132)
    tiles = default_tiles(576, 960, 576, 512, 1, torch.device("cpu"))
    assert tiles["gate/up"][0] == 2 * linear.DOT_MIN
    assert tiles["o"][0] == tiles["qkv"][0] == 16


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
    assert not state.any(), "phase by phase never touches the barrier"
    # And what both compute is the layer: against float32 torch, within the bfloat16
    # roundings of its intermediates (qkv, the attention, h, the activation).
    y, kv = _eager(x, weights, step, heads)
    err = ((ours[0].float() - y).norm() / y.norm()).item()
    assert err < 2e-2, err
    # The newest keys: qkv rounded once apart, then normed and rotated (a bfloat16
    # step is 2^-5 at these magnitudes, below 8: four steps allowed).
    written = (kv != step.kv).any(dim=(0, 2, 3, 4))
    assert kv[:, written].float().abs().max() < 8
    torch.testing.assert_close(
        ours[2][:, written].float(), kv[:, written].float(), rtol=0, atol=2**-3
    )


def test_one_program_walks_every_tile_of_every_phase() -> None:
    """One program (or two), narrow tiles: each deals itself several tiles of every
    phase, the chain's bits still."""
    x, squares, weights, step = _layer([9, 1, 33], 64, 4, 2, 16, 96, 16, True, 13)
    for programs in (1, 2):
        chain, ours, _ = _both(
            x, squares, weights, step, 4, {"qkv": 16, "o": 16, "down": 16}, programs=programs
        )
        for a, b in zip(chain, ours, strict=True):
            assert torch.equal(a, b)


def _stack(layers: int, lengths: list[int], norms: bool, device: str = DEVICE) -> tuple:
    """x, its squares, ``layers`` layers' weights and one cache of them all, a step."""
    x, squares, first, step = _layer(lengths, 64, 4, 2, 16, 96, 16, norms, 21, device)
    weights = [first] + [_layer(lengths, 64, 4, 2, 16, 96, 16, norms, 22 + i, device)[2]
                         for i in range(layers - 1)]  # fmt: skip
    kv = torch.stack([step.kv] + [step.kv.roll(i + 1, dims=1) for i in range(layers - 1)])
    kv[:, :, 0] = 0  # the null page
    return x, squares, weights, kv, step


@pytest.mark.parametrize("layers", [1, 2, 3])  # the output in either buffer
def test_a_stacked_step_gives_its_layers_bits_one_by_one(layers: int) -> None:
    """Several layers in one kernel (their weights by address tables, their caches one
    tensor, their rows through two buffers in turn) compute what the chain computes
    layer after layer."""
    x, squares, weights, kv, step = _stack(layers, [5, 0, 40], True)
    shape = _shape(weights[0], 4, 16, len(x))
    chain_kv = kv.clone()
    h, s = x, squares
    for i, w in enumerate(weights):
        h, s = chain_layer(h, s, w, step._replace(kv=chain_kv[i]), shape)
    ours_kv = kv.clone()
    y, y_squares = triton_persistent_step(
        x, squares, stack_layers(weights), ours_kv, step, shape, _state(x.device)
    )
    assert torch.equal(y, h) and torch.equal(y_squares, s)
    assert torch.equal(ours_kv, chain_kv)


def test_stacking_refuses_unlike_layers() -> None:
    _, _, weights, _, _ = _stack(2, [5], False)
    with pytest.raises(ValueError, match="differ"):
        stack_layers([weights[0], weights[1]._replace(o=weights[1].o[:, :32].contiguous())])


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
    shape = _shape(weights, 4, 16, 3)
    counts = phase_tiles(3, shape, 64, 2, 16, 96)
    assert len(counts) == len(PHASES)
    qkv_n, _ = shape.tiles["qkv"]
    assert counts[0] == -(-(4 + 4) * 16 // qkv_n)
    assert counts[1:3] == (3 * 2 * shape.num_splits, 3 * 4)


def test_bad_inputs_are_refused() -> None:
    x, squares, weights, step = _layer([5, 0], 64, 4, 2, 16, 96, 16, False, 2)
    shape = _shape(weights, 4, 16, 2)
    state = _state(x.device)
    with pytest.raises(ValueError, match="contiguous"):
        triton_persistent_layer(x.t().contiguous().t(), squares, weights, step, shape, state)
    with pytest.raises(ValueError, match="does not pack"):
        triton_persistent_layer(x, squares, weights, step, shape._replace(heads=2), state)
    with pytest.raises(ValueError, match="int32"):
        triton_persistent_layer(x, squares, weights, step, shape, state.long())
    with pytest.raises(ValueError, match="partial squares"):
        triton_persistent_layer(x, squares[:, :2], weights, step, shape, state)
    with pytest.raises(ValueError, match="int64"):
        triton_persistent_layer(
            x, squares, weights, step._replace(rows=step.rows.int()), shape, state
        )
    with pytest.raises(ValueError, match="programs"):
        triton_persistent_layer(x, squares, weights, step, shape, state, programs=0)
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
    barriers (its weights prefetched into L2 or not, launched programmatically or
    not) against the same kernel launched phase by phase, bit for bit; the chain
    within the rounding of its contracted attention arithmetic; and ten replays of one
    captured graph, each the same, with the barrier's count back at zero."""
    x, squares, weights, step = _layer(lengths, 576, 9, 3, 64, 1536, 64, norms, 5, "cuda")
    shape = _shape(weights, 9, 64, len(lengths))
    state = _state(torch.device("cuda"))
    chain, phased, _ = _both(x, squares, weights, step, 9, by_phase=True)
    ours_step = step._replace(kv=step.kv.clone())
    ours = triton_persistent_layer(x, squares, weights, ours_step, shape, state)
    for a, b in zip(phased, (*ours, ours_step.kv), strict=True):
        assert torch.equal(a, b)
    for launch in ("prefetch", "programmatic"):
        other_step = step._replace(kv=step.kv.clone())
        with programmatic_launch(launch == "programmatic"):
            other = triton_persistent_layer(
                x, squares, weights, other_step, shape, state, prefetch=launch == "prefetch"
            )
        for a, b in zip(phased, (*other, other_step.kv), strict=True):
            assert torch.equal(a, b), launch
    torch.testing.assert_close(ours[0].float(), chain[0].float(), rtol=2**-6, atol=2**-6)
    assert state[0].item() == 0 and not state[1:32].any()
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


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_stacked_step_gives_its_phase_by_phase_bits_on_the_gpu(prefetch: bool) -> None:
    """Four of SmolLM2-135M's layers in one kernel (a barrier between layers too),
    prefetching each next layer's weights or not, launched programmatically: the
    same kernel launched layer by layer and phase by phase, bit for bit, also when
    replayed from a graph."""
    lengths = [1, 300, 0, 4000]
    x, squares, first, step = _layer(lengths, 576, 9, 3, 64, 1536, 64, True, 8, "cuda")
    weights = [first] + [
        _layer(lengths, 576, 9, 3, 64, 1536, 64, True, 9 + i, "cuda")[2] for i in range(3)
    ]
    kv = torch.stack([step.kv.roll(i, dims=1) for i in range(4)])
    kv[:, :, 0] = 0
    tables = stack_layers(weights)
    shape = _shape(first, 9, 64, len(lengths))
    state = _state(torch.device("cuda"))
    phased_kv = kv.clone()
    phased = triton_persistent_step(
        x, squares, tables, phased_kv, step, shape, state, by_phase=True
    )
    ours_kv = kv.clone()
    with programmatic_launch(True):
        ours = triton_persistent_step(
            x, squares, tables, ours_kv, step, shape, state, prefetch=prefetch
        )
    assert torch.equal(ours[0], phased[0]) and torch.equal(ours[1], phased[1])
    assert torch.equal(ours_kv, phased_kv)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, y_squares = triton_persistent_step(
            x, squares, tables, ours_kv, step, shape, state, prefetch=prefetch
        )
    for _ in range(5):
        ours_kv.copy_(kv)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, phased[0]) and torch.equal(y_squares, phased[1])
        assert torch.equal(ours_kv, phased_kv)
    assert state[0].item() == 0


@pytest.mark.gpu
def test_a_stacked_step_reaches_caches_past_two_giga_elements() -> None:
    """Two of SmolLM2-135M's layers whose caches hold 2^31 elements and more (over
    4 GiB each, as a served cache's are): the stacked kernel finds layer 1's cache
    ``stride_layer`` elements on (once an int32 product that wrapped), and gives the
    bits of the one-layer kernel run on each layer's cache in turn."""
    lengths = [70, 1]
    x, squares, first, step = _layer(lengths, 576, 9, 3, 64, 1536, 64, False, 4, "cuda")
    second = _layer(lengths, 576, 9, 3, 64, 1536, 64, False, 5, "cuda")[2]
    used = step.kv.shape[1]
    pages = (1 << 31) // (2 * 64 * 3 * 64) + 2  # each layer's cache past 2^31 elements
    kv = torch.zeros(2, 2, pages, 64, 3, 64, dtype=torch.bfloat16, device="cuda")
    kv[0, :, :used] = step.kv
    kv[1, :, :used] = step.kv.roll(1, dims=1)
    kv[:, :, 0] = 0
    assert kv[1].data_ptr() - kv.data_ptr() >= 2 * (1 << 31)
    shape = _shape(first, 9, 64, len(lengths))
    state = _state(torch.device("cuda"))
    one_kv = kv[:, :, :used].clone()
    y, y_squares = triton_persistent_step(
        x, squares, stack_layers([first, second]), kv, step, shape, state
    )
    h, s = x, squares
    for i, weights in enumerate((first, second)):
        h, s = triton_persistent_layer(h, s, weights, step._replace(kv=one_kv[i]), shape, state)
    assert torch.equal(y, h) and torch.equal(y_squares, s)
    assert torch.equal(kv[:, :, :used], one_kv)
