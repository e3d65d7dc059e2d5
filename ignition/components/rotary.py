"""Rotary embeddings as a prepared table: cos/sin of every servable position.

The canonical rotary module computes ``cos(position * inv_freq)`` inside the forward.
Compiled, that arithmetic is fused differently into graphs of different capacities
(and Inductor keeps fused low-precision intermediates in fp32), so a request's
cos/sin could round differently depending on how many requests shared its step, and
its tokens could then depend on batch packing. The table is computed once, eagerly,
by the canonical module itself (same formula, same dtype as Transformers' forward);
serving only gathers rows of it, which is exact and independent of the batch.
"""

from __future__ import annotations

import torch
from torch import nn

from ignition.components.kv_cache import computed_once

# Rows per eager evaluation while building the table: bounds the fp32 intermediates.
_BUILD_CHUNK = 8192


class RotaryTable:
    """``cos[p]``, ``sin[p]`` ([positions, head_dim], execution dtype) for p < positions."""

    def __init__(
        self,
        rotary: nn.Module,
        positions: int,
        dtype: torch.dtype,
        device: torch.device,
        position_rows: int = 1,
    ) -> None:
        """``position_rows``: the position-id rows the module takes (3 for interleaved
        mRoPE, whose rows are equal for text)."""
        if positions < 1:
            raise ValueError(f"a rotary table needs at least one position, got {positions}")
        probe = torch.empty(1, 1, dtype=dtype, device=device)
        cos_parts, sin_parts = [], []
        with torch.no_grad():
            for lo in range(0, positions, _BUILD_CHUNK):
                ids = torch.arange(lo, min(lo + _BUILD_CHUNK, positions), device=device)
                rows = ids.view(1, 1, -1).expand(position_rows, 1, -1)
                cos, sin = rotary(probe, rows[0] if position_rows == 1 else rows)
                cos_parts.append(cos[0])
                sin_parts.append(sin[0])
        self.cos = torch.cat(cos_parts).contiguous()
        self.sin = torch.cat(sin_parts).contiguous()

    @property
    def positions(self) -> int:
        return self.cos.shape[0]

    def nbytes(self) -> int:
        return 2 * self.cos.numel() * self.cos.element_size()

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for ``positions`` (any shape of int64). Positions past the table (only
        padding tokens of a chunk near the context limit have them) read its last row;
        their outputs are never used."""
        index = positions.clamp(max=self.positions - 1)
        return computed_once(self.cos[index]), computed_once(self.sin[index])
