"""Continuation rows: a recipe's per-request state that is not paged.

A recipe whose model carries state beyond its KV pages (recurrent matrices,
convolution histories, token histories, selector rings) declares it as ``RowField``s:
a name, the shape of one request's value, a dtype and the admission value. Every
field is stored as one tensor ``[rows, *shape]``: the live rows are indexed by request
slot (row 0 is the null slot's, which padded rows read and write back unchanged),
and snapshot rows use the same declaration, so a checkpoint copies each field's row
whole and exactly, without knowing what it means.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowField:
    """One request's value of a continuation field: ``shape`` of ``dtype``, ``fill``
    at admission (and in the null row)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: float = 0.0

    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


class ContinuationRows:
    """``rows`` values of every declared field, each at its admission value."""

    def __init__(self, fields: Iterable[RowField], rows: int, device: torch.device) -> None:
        self.fields = tuple(fields)
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"continuation fields repeat a name: {names}")
        self.tensors: dict[str, torch.Tensor] = {
            f.name: torch.full((rows, *f.shape), f.fill, dtype=f.dtype, device=device)
            for f in self.fields
        }

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    @property
    def rows(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def row_bytes(self) -> int:
        return sum(f.nbytes() for f in self.fields)

    def nbytes(self) -> int:
        return self.rows * self.row_bytes()

    def reset(self, index: torch.Tensor, apply: torch.Tensor | None = None) -> None:
        """Rows ``index`` back to their admission values, in place (where ``apply``,
        a bool of ``index``'s shape, holds)."""
        for f in self.fields:
            t = self.tensors[f.name]
            if apply is None:
                t.index_fill_(0, index, f.fill)
                continue
            keep = apply.view(-1, *([1] * len(f.shape)))
            fill = torch.full((), f.fill, dtype=f.dtype, device=t.device)
            t.index_copy_(0, index, torch.where(keep, fill, t.index_select(0, index)))

    def copy_from(
        self,
        source: ContinuationRows,
        src: torch.Tensor,
        dst: torch.Tensor,
        apply: torch.Tensor | None = None,
    ) -> None:
        """Row ``src`` of ``source`` into row ``dst`` of every field (where ``apply``,
        a bool of ``dst``'s shape, holds; elsewhere the row keeps its value)."""
        if source.fields != self.fields:
            raise ValueError("continuation rows of different declarations")
        for f in self.fields:
            value = source.tensors[f.name].index_select(0, src)
            t = self.tensors[f.name]
            if apply is not None:
                keep = apply.view(-1, *([1] * len(f.shape)))
                value = torch.where(keep, value, t.index_select(0, dst))
            t.index_copy_(0, dst, value)


@torch.library.custom_op("flare::read_slot_rows", mutates_args=())
def read_slot_rows(field: torch.Tensor, layer: int, slots: torch.Tensor) -> torch.Tensor:
    """A copy of ``field[slots, layer]``, made where the read stands in the forward.
    Inductor inlines a plain ``index_select`` into its consumers and may realize a
    consumer after a later ``write_slot_rows`` of the same field; the consumer then
    reads the new rows (seen on CUDA: PLE's n-gram hash read the token history it had
    just replaced). An operator's output is materialized before any later mutation."""
    return field.select(1, layer).index_select(0, slots)


@read_slot_rows.register_fake
def _read_slot_rows_fake(field: torch.Tensor, layer: int, slots: torch.Tensor) -> torch.Tensor:
    return field.new_empty((slots.shape[0], *field.shape[2:]))


@torch.library.custom_op("flare::write_slot_rows", mutates_args=("field",))
def write_slot_rows(
    field: torch.Tensor, layer: int, slots: torch.Tensor, values: torch.Tensor
) -> None:
    """``field[slots, layer] = values`` in place (a field is ``[rows, layers, ...]``;
    the whole field is never copied, as a functionalized ``index_copy_`` of it would
    be). Padded rows name the null slot and write back its own value."""
    field.select(1, layer).index_copy_(0, slots, values.to(field.dtype))


@write_slot_rows.register_fake
def _write_slot_rows_fake(
    field: torch.Tensor, layer: int, slots: torch.Tensor, values: torch.Tensor
) -> None:
    return None
