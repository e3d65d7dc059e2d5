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
    import interpreter_patching

    interpreter_patching.install()

# Under pytest-xdist (scripts/test.sh runs ``-n auto``), each worker takes its share of
# the cores for torch's CPU threads, so that the workers do not oversubscribe them.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (runs in bench/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
