"""Paged KV cache storage and the operators that write and read it inside graphs.

Layout: one tensor ``[layers, 2, pages, page_size, kv_heads, head_dim]``; page 0 is
the null page that padded and inactive rows write (zeros) to and nothing valid reads.
The operators are registered as custom ops so that Inductor treats them as opaque
calls that mutate (or read) the whole cache buffer in place: a functionalized
copy of the cache per step would be a disaster. Each op has one implementation per
device type, fixed at preparation: Triton on CUDA, the torch reference on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch._inductor.inductor_prims  # registers prims.inductor_force_stride_order

from ignition.components import attention
from ignition.components.triton_kv_write import triton_rope_write_kv

NULL_PAGE = 0
# The axis of the cache's shape that indexes pages. The axes before it (layer, K/V)
# are slabs of ``pages`` pages each, so a loader can back pages [0, n) of every slab
# alone (the runtime core's ``kv_page_axis``).
PAGE_AXIS = 2


@dataclass
class AttentionStep:
    """Per-step attention metadata, all device tensors derived inside the graph."""

    rows: torch.Tensor  # int64 [tokens]: flat cache row of each token's K/V
    page_tables: torch.Tensor  # decode: int32 [rows, max_pages]; prefill: int32 [max_pages]
    seq_lens: torch.Tensor | None  # decode: int32 [rows]
    start: torch.Tensor | None  # prefill: int32 [1]
    n_valid: torch.Tensor | None  # prefill: int32 [1]
    # Request slot of each row (decode: int64 [rows]; prefill: [1]), for models with
    # continuation rows (``ignition.components.continuation``).
    slots: torch.Tensor | None = None


@dataclass(frozen=True)
class PagedField:
    """A paged tensor besides K/V that a recipe's model keeps per page (QSA's block
    keys): ``[layers, pages, *page_shape]`` of ``dtype``, addressed by the same
    physical page ids as the K/V pages, so one page allocation identifies a token
    range's storage in all of them (its page axis is 1)."""

    name: str
    layers: int
    page_shape: tuple[int, ...]
    dtype: torch.dtype

    def bytes_per_page(self) -> int:
        count = self.layers
        for size in self.page_shape:
            count *= size
        return count * self.dtype.itemsize

    def allocate(self, pages: int, device: torch.device) -> torch.Tensor:
        shape = (self.layers, pages, *self.page_shape)
        return torch.zeros(shape, dtype=self.dtype, device=device)


@dataclass
class PagedKvCache:
    kv: torch.Tensor  # [layers, 2, pages, page_size, kv_heads, head_dim]
    # Further paged tensors by name (``PagedField``), page axis 1.
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @staticmethod
    def allocate(
        layers: int,
        pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKvCache:
        slabs = (layers, 2)  # the axes before PAGE_AXIS
        shape = (*slabs, pages, page_size, kv_heads, head_dim)
        return PagedKvCache(torch.zeros(shape, dtype=dtype, device=device))

    @property
    def page_size(self) -> int:
        return self.kv.shape[PAGE_AXIS + 1]

    @property
    def pages(self) -> int:
        return self.kv.shape[PAGE_AXIS]

    @staticmethod
    def bytes_per_page(
        layers: int, page_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return layers * 2 * page_size * kv_heads * head_dim * dtype.itemsize

    def nbytes(self) -> int:
        """The K/V pages' bytes (``extra`` is counted with request state, where it is
        placed)."""
        return self.kv.numel() * self.kv.element_size()

    def extra_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.extra.values())


def computed_once(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as it is, computed into a buffer of its own under Inductor. A step's
    small tables that every layer reads (the decode rows' sequence lengths and cache
    rows, the rotary rows) are pointwise results, and Inductor computes a pointwise
    result that an extern operator (a Flare kernel) takes into a copy for each such
    operator: Qwen3-8B's decode graphs launched the sequence lengths' kernel 36
    times a step and the rows' and rotary rows' 28 (about 100 us of kernels and the
    gaps between them). Forcing the stride order of its own strides makes Inductor
    compute it into one buffer that every layer reads. Inductor forces no stride order
    on a tensor of one element (a decode graph's lengths and rows at capacity 1), so
    such a tensor is computed twice over into a buffer of two, and read as that
    buffer's first element. Run eagerly (``--no-compile``) it is the tensor itself,
    with no kernel added to the step."""
    if not torch.compiler.is_compiling():
        return tensor
    if tensor.numel() != 1:
        return torch.ops.prims.inductor_force_stride_order(tensor, tensor.stride())
    flat = tensor.reshape(1)
    twice = torch.ops.prims.inductor_force_stride_order(torch.cat([flat, flat]), (1,))
    return twice[:1].view(tensor.shape)


def slot_mapping(
    page_table_rows: torch.Tensor, positions: torch.Tensor, live: torch.Tensor, page_size: int
) -> torch.Tensor:
    """Flat cache row (page * page_size + offset) for each token; rows that are not
    live go to the null page, at their offset so they stay in bounds."""
    positions = torch.where(live, positions, 0)
    logical = (positions // page_size).unsqueeze(1)
    page = page_table_rows.gather(1, logical).squeeze(1).to(torch.int64)
    page = torch.where(live, page, NULL_PAGE)
    return computed_once(page * page_size + positions % page_size)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's ``RMSNorm`` over the last axis, eager rounding."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb`` of ``x [tokens, heads, head_dim]``, eager rounding."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.unsqueeze(1) + torch.cat((-x2, x1), dim=-1) * sin.unsqueeze(1)


@torch.library.custom_op("flare::write_layer_rows", mutates_args=("buffer",))
def write_layer_rows(
    buffer: torch.Tensor, layer: int, index: torch.Tensor, values: torch.Tensor
) -> None:
    """Rows ``index`` of ``buffer[layer]``, viewed as ``[-1, *values.shape[1:]]``,
    become ``values``, in place (a paged buffer's token or block rows: the whole
    buffer is never copied, as a functionalized ``index_copy_`` of it would be)."""
    flat = buffer[layer].view(-1, *values.shape[1:])
    flat.index_copy_(0, index, values.to(buffer.dtype))


@write_layer_rows.register_fake
def _write_layer_rows_fake(
    buffer: torch.Tensor, layer: int, index: torch.Tensor, values: torch.Tensor
) -> None:
    return None


def write_kv(
    kv: torch.Tensor, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """K/V ``[tokens, kv_heads, head_dim]`` of one layer to flat cache ``rows``; tokens
    whose row lies in the null page write zeros there."""
    _, _, pages, page_size, _, _ = kv.shape
    live = (rows >= page_size).view(-1, 1, 1)
    values = torch.cat([torch.where(live, k, 0), torch.where(live, v, 0)])
    write_layer_rows(kv, layer, torch.cat([rows, rows + pages * page_size]), values)


@torch.library.custom_op("flare::rope_write_kv", mutates_args=("kv",))
def rope_write_kv(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """The packed projection ``qkv [tokens, (heads + 2 * kv_heads) * head_dim]``
    finished: q and k normalized (``q_weight``/``k_weight``, when the model has the
    norms) and rotated by ``cos``/``sin [tokens, head_dim]``; K/V of one layer written
    to flat cache ``rows``; the queries ``[tokens, heads, head_dim]`` returned.
    Tokens whose row lies in the null page write zeros there (several may share a
    row), so the null page stays zero and the cache never depends on a write race."""
    _, _, pages, page_size, kv_heads, head_dim = kv.shape
    tokens = qkv.shape[0]
    q, k, v = qkv.view(tokens, heads + 2 * kv_heads, head_dim).split(
        [heads, kv_heads, kv_heads], dim=1
    )
    if q_weight is not None and k_weight is not None:
        q, k = _rms_norm(q, q_weight, eps), _rms_norm(k, k_weight, eps)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    flat = kv[layer].view(2, pages * page_size, kv_heads, head_dim)
    live = (rows >= page_size).view(-1, 1, 1)
    flat[0].index_copy_(0, rows, torch.where(live, k, 0).to(kv.dtype))
    flat[1].index_copy_(0, rows, torch.where(live, v, 0).to(kv.dtype))
    return q.contiguous()


@rope_write_kv.register_kernel("cuda")
def _rope_write_kv_cuda(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    return triton_rope_write_kv(kv[layer], qkv, q_weight, k_weight, eps, cos, sin, rows, heads)


@rope_write_kv.register_fake
def _rope_write_kv_fake(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    head_dim = kv.shape[-1]
    return qkv.new_empty(qkv.shape[0], heads, head_dim)


@torch.library.custom_op("flare::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Paged attention of one query token per row; rows with seq_len 0 give zeros."""
    return attention.paged_decode_attention_ref(q, kv[layer], page_tables, seq_lens, scale)


@decode_attention.register_kernel("cuda")
def _decode_attention_cuda(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return attention.triton_paged_decode_attention(q, kv[layer], page_tables, seq_lens, scale)


@decode_attention.register_fake
def _decode_attention_fake(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("flare::rope_decode_attention", mutates_args=("kv",))
def rope_decode_attention(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``rope_write_kv`` then ``decode_attention`` of decode rows (one token a row,
    ``rows[b]`` the row of position ``seq_lens[b] - 1``, or the null page's for a
    padding row): on CUDA in attention's two kernels, the rotary write done by the
    split that reads the token's page."""
    q = rope_write_kv(kv, layer, qkv, q_weight, k_weight, eps, cos, sin, rows, heads)
    return decode_attention(q, kv, layer, page_tables, seq_lens, scale)


@rope_decode_attention.register_kernel("cuda")
def _rope_decode_attention_cuda(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return attention.triton_paged_decode_attention_rope(
        qkv, q_weight, k_weight, eps, cos, sin, rows, kv[layer], page_tables, seq_lens, scale, heads
    )


@rope_decode_attention.register_fake
def _rope_decode_attention_fake(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return qkv.new_empty(qkv.shape[0], heads, kv.shape[-1])


@torch.library.custom_op("flare::rope_prefill_attention", mutates_args=("kv",))
def rope_prefill_attention(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``rope_write_kv`` then ``prefill_attention`` of one request's chunk. On CUDA, a
    long chunk (``triton_attention.two_parts_apply``, by shapes) attends within
    itself by a library kernel and to its history by the Triton kernel, merged
    (``attention.triton_paged_prefill_attention_rope``)."""
    q = rope_write_kv(kv, layer, qkv, q_weight, k_weight, eps, cos, sin, rows, heads)
    return prefill_attention(q, kv, layer, page_table_row, start, n_valid, scale)


@rope_prefill_attention.register_kernel("cuda")
def _rope_prefill_attention_cuda(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    from ignition.components.triton_attention import two_parts_apply

    kv_heads, head_dim = kv.shape[-2], kv.shape[-1]
    if not two_parts_apply(qkv.shape[0], heads, kv_heads, head_dim, kv.dtype, kv.device):
        q = triton_rope_write_kv(kv[layer], qkv, q_weight, k_weight, eps, cos, sin, rows, heads)
        return attention.triton_paged_prefill_attention(
            q, kv[layer], page_table_row, start, n_valid, scale
        )
    return attention.triton_paged_prefill_attention_rope(
        qkv, q_weight, k_weight, eps, cos, sin, rows, kv[layer], page_table_row, start,
        n_valid, scale, heads,
    )  # fmt: skip


@rope_prefill_attention.register_fake
def _rope_prefill_attention_fake(
    kv: torch.Tensor,
    layer: int,
    qkv: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rows: torch.Tensor,
    heads: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return qkv.new_empty(qkv.shape[0], heads, kv.shape[-1])


@torch.library.custom_op("flare::prefill_attention", mutates_args=())
def prefill_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal paged attention for one request's chunk; padded rows give zeros."""
    return attention.paged_prefill_attention_ref(
        q, kv[layer], page_table_row, start, n_valid, scale
    )


@prefill_attention.register_kernel("cuda")
def _prefill_attention_cuda(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return attention.triton_paged_prefill_attention(
        q, kv[layer], page_table_row, start, n_valid, scale
    )


@prefill_attention.register_fake
def _prefill_attention_fake(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    page_table_row: torch.Tensor,
    start: torch.Tensor,
    n_valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return torch.empty_like(q)
