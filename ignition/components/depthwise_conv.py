"""A causal depthwise convolution's last outputs as a sum of taps, for decode rows.

``F.conv1d`` runs cuDNN, which picks its algorithm (and so its arithmetic) by the
problem's shape, and a decode step's shape holds its batch size: the same request's
convolution could round differently at capacity 1 and at capacity 4. Here each output
is its kernel's taps multiplied and added in tap order in float32, then rounded to
the weight's dtype once, as cuDNN rounds a bf16 convolution's float32 sum: pointwise
arithmetic whose value at a (row, channel, position) depends on nothing else.
"""

from __future__ import annotations

import torch


def causal_taps(
    ext: torch.Tensor, weight: torch.Tensor, dilation: int = 1, outputs: int = 1
) -> torch.Tensor:
    """The last ``outputs`` positions of the valid depthwise convolution of ``ext [...,
    channels, length]`` by ``weight [channels, kernel]`` (dilated): ``[...,
    channels, outputs]`` in the weight's dtype, as ``F.conv1d(ext, weight.unsqueeze(1),
    groups=channels, dilation=dilation)[..., -outputs:]`` computes them."""
    channels, kernel = weight.shape
    length = ext.shape[-1]
    span = (kernel - 1) * dilation
    if ext.shape[-2] != channels or length < span + outputs:
        raise ValueError(
            f"{tuple(ext.shape)} inputs for a [{channels}, {kernel}] kernel dilated "
            f"{dilation} and {outputs} outputs"
        )
    first = length - outputs - span
    total: torch.Tensor | None = None
    for k in range(kernel):
        start = first + k * dilation
        tap = ext[..., start : start + outputs].float() * weight[:, k : k + 1].float()
        total = tap if total is None else total + tap
    assert total is not None
    return total.to(weight.dtype)
