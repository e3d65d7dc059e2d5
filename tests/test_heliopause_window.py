"""The fixed-address preparation window of ``flare_heliopause``.

Without a GPU: the Python API fails with clear ``WindowError``s instead of crashing
(no driver, bad requests, nothing open) and the extension exports the C entry points
that ``torch.cuda.memory.CUDAPluggableAllocator`` loads. With a GPU (``gpu`` marker,
run through ``bench/gpu_check.sh``): PyTorch allocations and a captured CUDA graph
land inside the selected regions of a window at a fixed address.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

MIB = 1 << 20
BASE = 0x200000000000
SIZE = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
REGIONS = [("weights", 256 * MIB), ("state", 128 * MIB), ("scratch", 256 * MIB)]


@pytest.fixture(scope="module")
def hp():
    try:
        return importlib.import_module("flare_heliopause")
    except ImportError as exc:
        if os.environ.get("FLARE_SKIP_HELIOPAUSE") == "1":
            pytest.skip(f"FLARE_SKIP_HELIOPAUSE=1 and flare_heliopause is not importable: {exc}")
        pytest.fail(f"flare_heliopause is not importable ({exc}); see tests/test_heliopause.py")


def _entry_points(path: str):
    """The C entry points, typed as ``CUDAPluggableAllocator`` calls them."""
    lib = ctypes.CDLL(path)
    alloc, free = lib.flare_window_alloc, lib.flare_window_free
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free


def test_library_path_exports_the_allocator(hp):
    path = hp.library_path()
    assert Path(path).is_file(), path
    assert Path(path).name.startswith("flare_heliopause") and ".so" in Path(path).name, path
    alloc, free = _entry_points(path)
    assert alloc is not None and free is not None
    # The same library the interpreter imported: loading it again shares its state.
    assert Path(path).parent == Path(hp.__file__).parent, (path, hp.__file__)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_c_entry_points_fail_cleanly_without_a_window(hp):
    alloc, free = _entry_points(hp.library_path())
    hp.window_last_error(clear=True)
    assert alloc(4096, 0, None) is None
    message = hp.window_last_error()
    assert message is not None and "no window is open" in message and "4096" in message
    free(0x1234, 16, 0, None)
    assert "flare_window_free" in hp.window_last_error(clear=True)
    assert hp.window_last_error() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver path")
def test_window_open_without_a_driver_raises(hp):
    assert issubclass(hp.WindowError, RuntimeError)
    with pytest.raises(hp.WindowError, match="CUDA driver cannot be loaded"):
        hp.window_open(BASE, SIZE, REGIONS)
    assert hp.window_info() is None


def test_bad_requests_raise_before_touching_the_driver(hp):
    with pytest.raises(hp.WindowError, match=r"16777216 bytes is below .*32 MiB"):
        hp.window_open(BASE, 16 * MIB, [("weights", MIB)])
    with pytest.raises(hp.WindowError, match="regions need 1342177280 bytes"):
        hp.window_open(BASE, SIZE, [("weights", SIZE), ("state", 256 * MIB)])
    with pytest.raises(hp.WindowError, match="`state` is listed twice"):
        hp.window_open(BASE, SIZE, [("state", MIB), ("state", MIB)])
    with pytest.raises(hp.WindowError, match="at least one region"):
        hp.window_open(BASE, SIZE, [])
    with pytest.raises(OverflowError):
        hp.window_open(-1, SIZE, REGIONS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="no window may be open on the GPU path")
def test_nothing_open(hp):
    assert hp.window_info() is None
    calls = (lambda: hp.window_select("weights"), hp.window_usage, hp.window_close,
             lambda: hp.window_export_region("collectives"))  # fmt: skip
    for call in calls:
        with pytest.raises(hp.WindowError, match="no window is open"):
            call()


def _region(usage: list[dict], name: str) -> dict:
    return next(r for r in usage if r["name"] == name)


def _inside(ptr: int, region: dict, nbytes: int = 1) -> bool:
    return region["base"] <= ptr and ptr + nbytes <= region["base"] + region["capacity"]


@pytest.mark.gpu
def test_pytorch_allocations_and_graph_land_in_the_window(hp):
    # The window's fixed range belongs to the whole process: after earlier GPU tests
    # of the same session (CUDA's own reservations after their allocations, or a
    # window PyTorch still holds blocks of) it may be mapped already. A fresh
    # interpreter starts with nothing there, as a preparation run does.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parent), str(ROOT), env.get("PYTHONPATH")])
    )
    code = "import test_heliopause_window as t; t.window_scenario()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "window scenario passed" in done.stdout, done.stdout[-3000:]
    if "window left open" in done.stderr:
        warnings.warn(done.stderr[-2000:], stacklevel=1)


def window_scenario() -> None:
    """PyTorch's allocations and a captured graph land in the selected regions of a
    window at a fixed address; run in its own process by the test above."""
    hp = importlib.import_module("flare_heliopause")
    hp.window_open(BASE, SIZE, REGIONS, device=torch.cuda.current_device())
    try:
        info = hp.window_info()
        assert info["base"] == BASE and info["size"] == SIZE
        usage = hp.window_usage()
        assert [r["name"] for r in usage] == [n for n, _ in REGIONS]
        assert usage[0]["base"] == BASE
        assert all(r["base"] % info["granularity"] == 0 for r in usage)

        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            hp.library_path(), "flare_window_alloc", "flare_window_free"
        )
        # One pool per region: the caching allocator reuses cached segments within
        # a pool regardless of which region is selected.
        pools = {name: torch.cuda.MemPool(allocator.allocator()) for name, _ in REGIONS}

        tensors: dict[str, list[torch.Tensor]] = {}
        for name, shapes in (
            ("weights", [(1024, 1024), (4096, 1024), (7,)]),
            ("state", [(64, 1024), (3, 5)]),
        ):
            hp.window_select(name)
            with torch.cuda.use_mem_pool(pools[name]):
                tensors[name] = [torch.randn(*s, device="cuda") for s in shapes]
        usage = hp.window_usage()
        for name, ts in tensors.items():
            region = _region(usage, name)
            for t in ts:
                nbytes = t.numel() * t.element_size()
                assert _inside(t.data_ptr(), region, nbytes), (name, hex(t.data_ptr()), region)
            assert region["live_blocks"] >= 1 and region["mapped"] == region["high_water"]
        assert hp.window_last_error() is None

        # A small graph: its intermediates and output come from the scratch pool.
        w, x = tensors["weights"][0], tensors["state"][0]
        hp.window_select("scratch")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.cuda.use_mem_pool(pools["scratch"]):
            for _ in range(2):
                torch.softmax(x @ w + 1.0, dim=-1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pools["scratch"].id):
            out = torch.softmax(x @ w + 1.0, dim=-1)
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.softmax(x @ w + 1.0, dim=-1)
        torch.testing.assert_close(out, expected)

        usage = hp.window_usage()
        scratch = _region(usage, "scratch")
        assert _inside(out.data_ptr(), scratch, out.numel() * out.element_size())
        assert scratch["live_blocks"] >= 1 and scratch["allocations"] >= 1
        assert hp.window_last_error() is None, hp.window_last_error()
        for r in usage:
            assert r["live_bytes"] + r["free_bytes"] == r["high_water"] <= r["capacity"]

        # Everything PyTorch holds must be given back before the window closes.
        with pytest.raises(hp.WindowError, match="live blocks"):
            hp.window_close()
        del graph, out, expected, tensors, w, x
        torch.cuda.synchronize()
        pools.clear()
        del allocator
        gc.collect()
        torch._C._cuda_clearCublasWorkspaces()  # cuBLAS keeps workspaces per stream
        torch.cuda.empty_cache()
    finally:
        info = hp.window_info()
        if info is not None and info["live_blocks"] == 0:
            hp.window_close()
    if hp.window_info() is not None:
        # Placement is what this test is about; a teardown PyTorch does not let go
        # of is reported, not failed.
        warnings.warn(
            f"window left open, PyTorch still holds blocks: {hp.window_usage()}", stacklevel=1
        )
    print("window scenario passed")
