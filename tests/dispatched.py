"""What a prepared graph's step dispatches, for tests that a decode step runs no op whose
kernel (and so a row's reduction order) follows the batch: cuBLAS and cuDNN pick theirs
by the problem's shape, Flare's batch-invariant kernels are custom ops."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ignition.preparation.catalog import GraphKey
from ignition.preparation.prepared import PreparedModel

# GEMMs and convolutions: their library kernels are chosen by the problem's shape.
SHAPE_CHOSEN = {"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.convolution"}


class Recorder(TorchDispatchMode):
    """The top-level ops a step dispatches (a custom op's own body is not seen), each
    with its first tensor argument's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.ops.append((name, tuple(first.shape) if first is not None else ()))
        return func(*args, **(kwargs or {}))


def step_ops(prepared: PreparedModel, key: GraphKey) -> list[tuple[str, tuple[int, ...]]]:
    """The ops ``prepared`` dispatches executing ``key`` (uncaptured preparation)."""
    with Recorder() as recorder:
        prepared.execute(key)
    return recorder.ops


def batch_shaped(ops: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """The ops among ``ops`` whose kernel follows the shape."""
    return [(name, shape) for name, shape in ops if name in SHAPE_CHOSEN]


# Reductions whose CUDA strategy (and so a row's summation order, where it rounds: of
# floating-point operands) PyTorch picks by the problem's shape, rows included.
REDUCTIONS = {"aten.sum", "aten.mean"}


class ReductionRecorder(TorchDispatchMode):
    """Each floating-point sum or mean a step dispatches (integer sums, the sampler's
    counts, are exact in any order): its name and how many elements it adds into each
    output."""

    def __init__(self) -> None:
        super().__init__()
        self.reductions: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in REDUCTIONS and first is not None and first.is_floating_point():
            shape = first.shape
            dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else None
            extent = 1
            for d in dims if dims else range(len(shape)):
                extent *= shape[d]
            self.reductions.append((name, extent))
        return func(*args, **(kwargs or {}))


def step_reductions(prepared: PreparedModel, key: GraphKey) -> list[tuple[str, int]]:
    """The sums and means ``prepared`` dispatches executing ``key`` (uncaptured
    preparation), each with the elements it adds into one output."""
    with ReductionRecorder() as recorder:
        prepared.execute(key)
    return recorder.reductions
