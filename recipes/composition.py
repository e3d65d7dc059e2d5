"""Steps every recipe takes to put a canonical model, built on the meta device, over
execution storage: real tensors for its parameters, the prepared rotary table in
place of the rotary forward, and the check that no buffer was left on the meta
device."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from ignition.components.rotary import RotaryTable
from ignition.loading.source import CheckpointError


def set_parameter(root: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replaces parameter ``name`` of ``root`` by ``value`` (no gradient)."""
    owner_name, attr = name.rsplit(".", 1)
    setattr(root.get_submodule(owner_name), attr, nn.Parameter(value, requires_grad=False))


def place_rotary(
    model: nn.Module,
    config: PretrainedConfig,
    weights: dict[str, torch.Tensor],
    positions: int | None,
    dtype: torch.dtype,
    device: torch.device,
    position_rows: int = 1,
) -> RotaryTable:
    """The canonical rotary module's table of ``positions`` rows (by default
    ``max_position_embeddings``), registered in ``weights`` as ``rotary.cos`` and
    ``rotary.sin``; the module itself, on ``device``, replaces the meta one."""
    rotary = type(model.model.rotary_emb)(config=config).to(device)
    table = RotaryTable(
        rotary,
        positions or int(config.max_position_embeddings),
        dtype,
        device,
        position_rows=position_rows,
    )
    weights["rotary.cos"] = table.cos
    weights["rotary.sin"] = table.sin
    # Serving reads the table; the canonical module stays for reference comparisons.
    model.model.rotary_emb = rotary
    return table


def check_placed(model: nn.Module, device: torch.device) -> None:
    """Every buffer of ``model`` has execution storage on ``device``."""
    leftover = [n for n, b in model.named_buffers() if b.device.type != device.type]
    if leftover:
        raise CheckpointError(f"buffer {leftover[0]} has no execution storage")
