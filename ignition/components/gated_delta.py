"""Gated DeltaNet over slot-indexed continuation rows: the causal short convolution
and the gated delta rule, for one request's prefill chunk and for decode rows.

A GDN layer's continuation state at consumed count S is its fp32 recurrent matrix
``[Hv, dk, dv]`` and the raw projected inputs of its last ``kernel - 1`` tokens (the
convolution history, model dtype), both in the request's continuation row. Every
operation here reads the row, computes, and writes the row back, so a chunk or a
decode step leaves exactly the state of the tokens it consumed:

- a prefill chunk is padded to its capacity; padded tokens get q = k = v = 0, g = 0
  and beta = 0, which leaves the recurrence unchanged (the same padding the
  chunked rule applies to reach its 64-token chunks), and the convolution history
  taken after the chunk is that of its last valid token;
- decode rows that are not live write back what they read.

The delta rule is one custom operator per form, with one implementation per device
fixed at preparation: on the CPU Transformers' torch references (its chunked rule
for chunks and its recurrent rule for decode rows, ``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``, with their in-kernel l2 norm), on CUDA the
same-named Triton kernels of fla-core 0.6 (``chunk_gated_delta_rule``,
``fused_recurrent_gated_delta_rule``), which Transformers itself dispatches to. fla
memoizes some index tensors by object identity; preparation turns that off in fla's
own configuration before any kernel runs (never through the user's environment).
The convolution is ``F.conv1d`` over the history and the new inputs, as
Transformers' cached path computes it. Chunks are relative to each invocation, so a
different prefill partition can change the recurrence's association (a numerical
bound, not an exact equality); a consumed endpoint is exact.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ignition.components.depthwise_conv import causal_taps

# The chunked rule's chunk (Transformers' default and fla's).
CHUNK = 64


@functools.cache
def _torch_rules() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Transformers' torch references themselves (chunked, recurrent): the names
    Transformers exports dispatch to fla's kernels whenever fla-core is importable,
    whatever the device. Imported on first use, never with this module: importing the
    canonical modeling module imports fla, which initializes CUDA, and an export must
    start recording kernel images before CUDA starts."""
    from transformers.models.qwen4_exp import modeling_qwen4_exp as canonical

    return (
        inspect.unwrap(canonical.torch_chunk_gated_delta_rule),
        inspect.unwrap(canonical.torch_recurrent_gated_delta_rule),
    )


def conv_prefill(
    x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor, n_valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU of the causal depthwise convolution of one request's chunk.

    ``x [tokens, channels]`` (its first ``n_valid`` real), ``history [channels,
    kernel - 1]`` the inputs before the chunk, ``weight [channels, kernel]``.
    Returns the outputs ``[tokens, channels]`` and the history after the last valid
    token."""
    kernel = weight.shape[-1]
    ext = torch.cat([history, x.transpose(0, 1).to(history.dtype)], dim=-1)  # [C, K-1+T]
    out = F.conv1d(ext.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), groups=ext.shape[0])
    out = F.silu(out[0]).transpose(0, 1).to(x.dtype)
    index = n_valid.to(torch.int64) + torch.arange(kernel - 1, device=x.device)
    return out, ext.index_select(1, index)


def conv_decode(
    x: torch.Tensor, history: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: ``x [rows, channels]``, ``history [rows, channels, kernel -
    1]``; the outputs ``[rows, channels]`` and every row's next history. The
    convolution is a sum of taps (``causal_taps``), so a row's output does not depend
    on how many rows the step has."""
    ext = torch.cat([history, x.unsqueeze(-1).to(history.dtype)], dim=-1)  # [R, C, K]
    out = causal_taps(ext.to(weight.dtype), weight)[..., 0]
    out = F.silu(out).to(x.dtype)
    return out, ext[..., 1:]


def _fla() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """fla's chunked and recurrent kernels, with its identity-keyed tensor cache off."""
    try:
        import fla.utils

        fla.utils.FLA_DISABLE_TENSOR_CACHE = True
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError as err:
        raise RuntimeError(
            "Gated DeltaNet on CUDA needs fla-core 0.6.0: pip install fla-core==0.6.0 einops"
        ) from err
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


@torch.library.custom_op("flare::gdn_chunk_rule", mutates_args=())
def chunk_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence ``[1, tokens, heads, dim]`` from ``state [1, Hv, dk, dv]``: the
    outputs and the final state (the canonical chunked rule with its l2 norm)."""
    out, final = _torch_rules()[0](
        q,
        k,
        v,
        g=g,
        beta=beta,
        chunk_size=CHUNK,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out.contiguous(), final.contiguous()


@chunk_rule.register_kernel("cuda")
def _chunk_rule_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    chunk, _ = _fla()
    out, final = chunk(
        q,
        k,
        v,
        g,
        beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out.contiguous(), final.contiguous()


@chunk_rule.register_fake
def _chunk_rule_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return v.new_empty(v.shape), state.new_empty(state.shape)


@torch.library.custom_op("flare::gdn_recurrent_rule", mutates_args=())
def recurrent_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence ``[rows, 1, heads, dim]`` from each row's ``state [rows,
    Hv, dk, dv]`` (the canonical recurrent rule with its l2 norm)."""
    out, final = _torch_rules()[1](
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out.contiguous(), final.contiguous()


@recurrent_rule.register_kernel("cuda")
def _recurrent_rule_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    _, recurrent = _fla()
    out, final = recurrent(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    return out.contiguous(), final.contiguous()


@recurrent_rule.register_fake
def _recurrent_rule_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    return v.new_empty(v.shape), state.new_empty(state.shape)


def delta_rule_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    valid: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over one request's chunk from ``state [Hv, dk, dv]``
    (fp32): ``q, k [tokens, Hv, dk]``, ``v [tokens, Hv, dv]``, ``g, beta [tokens,
    Hv]``, ``valid [tokens]`` (padding zeroed as the module docs say). Returns the
    outputs ``[tokens, Hv, dv]`` and the state after the last valid token."""
    live = valid.view(-1, 1)
    q, k, v = (torch.where(live.unsqueeze(-1), t, 0) for t in (q, k, v))
    g, beta = torch.where(live, g, 0), torch.where(live, beta, 0)
    out, final = chunk_rule(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        g.unsqueeze(0),
        beta.unsqueeze(0),
        state.unsqueeze(0).contiguous(),
    )
    return out[0], final[0]


def delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from each row's ``state [rows, Hv, dk, dv]``: the outputs
    ``[rows, Hv, dv]`` and every row's next state."""
    out, final = recurrent_rule(
        q.unsqueeze(1),
        k.unsqueeze(1),
        v.unsqueeze(1),
        g.unsqueeze(1),
        beta.unsqueeze(1),
        state.contiguous(),
    )
    return out[:, 0], final
