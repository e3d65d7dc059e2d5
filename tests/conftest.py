"""Test configuration shared by every test module.

Without a GPU, Triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``),
which must be set before Triton is first imported; tests marked ``gpu`` are skipped.
A skipped GPU test proves nothing: they run on the H200 through ``bench/gpu_check.sh``.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (runs in bench/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
