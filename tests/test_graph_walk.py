"""The graph walk's pure logic and the image recorder's bookkeeping (CPU), and one walk
of a real PyTorch graph (GPU).

On the CPU: pointer-word scanning against the window, refusals that name the graph
and node, node messages that round-trip through protobuf, the parameter layouts of
both launch modes, tracing a function to its image, and CUPTI callbacks simulated
with ctypes memory laid out as CUPTI lays it out. The GPU test runs in a fresh
interpreter because CUPTI must be subscribed before the process loads its first
kernel, which earlier GPU tests in the same session would already have done.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ignition.export import cupti
from ignition.export import flare_core_pb2 as pb
from ignition.export.cupti import ImageRecorder, elf_function_names, resolve_image
from ignition.export.graph_walk import (
    Copy3D,
    ExportError,
    KernelLaunch,
    Memset,
    PointerWord,
    check_layout_fits,
    check_node_type,
    check_params_in_window,
    check_window,
    edge_message,
    empty_node,
    graph_label,
    kernel_node,
    layout_params,
    memcpy_node,
    memset_node,
    parse_extra,
    pointer_words_outside,
    walk_graph,
)

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (0x2000_0000_0000, 1 << 30)
INSIDE = WINDOW[0] + 0x1000
OUTSIDE = 0x7F00_0000_0000
LABEL = "DECODE@4"


def _words(*values: int) -> bytes:
    return b"".join(struct.pack("<Q", v) for v in values)


def _allocated(value: int) -> bool:
    """A stand-in for the driver lookup: two allocations, one inside the window."""
    return WINDOW[0] <= value < WINDOW[0] + (1 << 20) or OUTSIDE <= value < OUTSIDE + (1 << 20)


# ---------------------------------------------------------------- pointer scanning


def test_scan_finds_pointers_outside_the_window_only() -> None:
    params = _words(INSIDE, OUTSIDE + 64, 12345, 0, OUTSIDE)
    assert pointer_words_outside(params, WINDOW, _allocated) == [
        PointerWord(8, OUTSIDE + 64),
        PointerWord(32, OUTSIDE),
    ]


def test_a_rank_may_point_into_its_peers_collectives_regions_only() -> None:
    # A tensor-parallel rank's kernels read its peer's collectives storage at the
    # peer's window address, which the serving process maps too; any other pointer
    # outside the window is still refused.
    peer = (OUTSIDE, 1 << 16)
    params = _words(INSIDE, OUTSIDE + 64, OUTSIDE + (1 << 16) + 8)
    assert pointer_words_outside(params, WINDOW, _allocated, [peer]) == [
        PointerWord(16, OUTSIDE + (1 << 16) + 8)
    ]
    check_params_in_window(_words(OUTSIDE, INSIDE), WINDOW, _allocated, LABEL, 0, "k", [peer])
    with pytest.raises(ExportError, match="1 device pointer"):
        check_params_in_window(params, WINDOW, _allocated, LABEL, 0, "k", [peer])


def test_scan_ignores_unaligned_bytes_and_a_short_tail() -> None:
    unaligned = b"\0" * 4 + struct.pack("<Q", OUTSIDE) + b"\0" * 4
    assert pointer_words_outside(unaligned, WINDOW, _allocated) == []
    tail = _words(7) + struct.pack("<I", 0xFFFF)
    assert pointer_words_outside(tail, WINDOW, _allocated) == []


def test_scan_never_looks_up_words_inside_the_window() -> None:
    looked_up: list[int] = []

    def lookup(value: int) -> bool:
        looked_up.append(value)
        return True

    assert pointer_words_outside(_words(INSIDE, 0, 5), WINDOW, lookup) == [PointerWord(16, 5)]
    assert looked_up == [5]


def test_pointer_outside_the_window_refuses_naming_graph_node_and_word() -> None:
    params = _words(INSIDE, 3, OUTSIDE + 8)
    with pytest.raises(ExportError) as refused:
        check_params_in_window(params, WINDOW, _allocated, LABEL, 7, "nvjet_sm90_tst")
    message = str(refused.value)
    assert "graph DECODE@4, node 7" in message
    assert "nvjet_sm90_tst" in message
    assert f"byte 16: {OUTSIDE + 8:#x}" in message
    assert f"[{WINDOW[0]:#x}, {WINDOW[0] + WINDOW[1]:#x})" in message
    check_params_in_window(_words(INSIDE, 3), WINDOW, _allocated, LABEL, 7, "k")


def test_window_is_checked() -> None:
    assert check_window((0, 2**64 - 1), LABEL) == (0, 2**64 - 1)
    for bad in [(0, 0), (-1, 4), (2**64 - 1, 2)]:
        with pytest.raises(ExportError, match="DECODE@4: invalid window"):
            check_window(bad, LABEL)


# ---------------------------------------------------------------- node types


@pytest.mark.parametrize("name", ["KERNEL", "MEMSET", "MEMCPY", "EMPTY"])
def test_supported_node_types_pass(name: str) -> None:
    assert check_node_type(f"CU_GRAPH_NODE_TYPE_{name}", LABEL, 0) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("HOST", "host node"),
        ("GRAPH", "child-graph node"),
        ("EVENT_RECORD", "event-record node"),
        ("WAIT_EVENT", "event-wait node"),
        ("CONDITIONAL", "conditional node"),
        ("MEM_ALLOC", "memory-allocation node"),
        ("FABRIC_CPY_BATCH", "unsupported node type CU_GRAPH_NODE_TYPE_FABRIC_CPY_BATCH"),
        ("UNKNOWN", "unsupported node type UNKNOWN"),
    ],
)
def test_other_node_types_refuse_naming_the_node(name: str, reason: str) -> None:
    type_name = name if name == "UNKNOWN" else f"CU_GRAPH_NODE_TYPE_{name}"
    with pytest.raises(ExportError) as refused:
        check_node_type(type_name, graph_label(pb.GRAPH_KIND_PREFILL, 256), 12)
    assert str(refused.value).startswith("cannot export graph PREFILL@256, node 12: ")
    assert reason in str(refused.value)


def test_graph_label() -> None:
    assert graph_label(pb.GRAPH_KIND_DECODE, 4) == "DECODE@4"
    assert graph_label(99, 1) == "kind 99@1"


# ---------------------------------------------------------------- parameters


def test_kernel_params_are_laid_out_at_their_device_offsets() -> None:
    layout = [(0, 4), (4, 1), (8, 16)]
    values = [b"\x01\x00\x00\x00", b"\x02", _words(INSIDE, INSIDE + 8)]
    blob = layout_params(values, layout)
    assert len(blob) == 24
    assert blob[:5] == b"\x01\x00\x00\x00\x02" and blob[5:8] == b"\0\0\0"
    assert blob[8:] == values[2]
    # The pointers of the 16-byte struct stay 8-byte aligned, so the scan sees them.
    assert pointer_words_outside(blob, (0, 1), _allocated) == [
        PointerWord(8, INSIDE),
        PointerWord(16, INSIDE + 8),
    ]
    assert layout_params([], []) == b""


@pytest.mark.parametrize(
    ("values", "layout", "error"),
    [
        ([b"\0" * 4], [(0, 8)], "holds 4 bytes, its layout says 8"),
        ([b"\0" * 8, b"\0"], [(0, 8)], "2 parameter values for 1 parameters"),
        ([b"\0" * 8, b"\0" * 4], [(0, 8), (4, 4)], "overlaps"),
    ],
)
def test_layout_mismatches_raise(
    values: list[bytes], layout: list[tuple[int, int]], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        layout_params(values, layout)


class _DriverWithoutParamCount:
    """cuda-bindings newer than the driver: the binding of cuFuncGetParamCount exists
    but calling it raises (driver 580 has no such entry point)."""

    def __init__(self, layout: list[tuple[int, int]]) -> None:
        self.layout = layout
        self.CUresult = SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1)

    def CUfunction(self, func: int) -> int:
        return func

    def cuFuncGetParamCount(self, func: int) -> tuple:
        raise RuntimeError('Function "cuFuncGetParamCount" not found')

    def cuFuncGetParamInfo(self, func: int, index: int) -> tuple:
        if index < len(self.layout):
            return 0, *self.layout[index]
        return 1, 0, 0


def test_param_layout_without_the_param_count_entry_point() -> None:
    from ignition.export.graph_walk import _param_layout

    layout = [(0, 8), (8, 4), (16, 16)]
    assert _param_layout(_DriverWithoutParamCount(layout), 7) == layout
    assert _param_layout(_DriverWithoutParamCount([]), 7) == []


def test_extra_array_parsing() -> None:
    assert parse_extra([1, 0x1000, 2, 0x2000, 0]) == (0x1000, 0x2000)
    assert parse_extra([2, 0x2000, 1, 0x1000, 0, 77]) == (0x1000, 0x2000)
    with pytest.raises(ValueError, match="unknown key 0x7"):
        parse_extra([7, 1, 0])
    with pytest.raises(ValueError, match="no END"):
        parse_extra([1, 0x1000, 2, 0x2000])
    with pytest.raises(ValueError, match="lacks"):
        parse_extra([1, 0x1000, 0])
    check_layout_fits(1720, [(0, 1720)])
    with pytest.raises(ValueError, match="past the 16-byte extra block"):
        check_layout_fits(16, [(8, 16)])


# ---------------------------------------------------------------- messages


def _launch(**changes: object) -> KernelLaunch:
    fields: dict[str, object] = {
        "image_sha256": "ab" * 32,
        "function": "triton_poi_fused_add_0",
        "grid": (128, 1, 1),
        "block": (128, 1, 1),
        "dynamic_shared_bytes": 0,
        "params": layout_params([_words(INSIDE), b"\x05\0\0\0"], [(0, 8), (8, 4)]),
        "param_offsets": (0, 8),
        "param_sizes": (8, 4),
    }
    fields.update(changes)
    return KernelLaunch(**fields)  # type: ignore[arg-type]


def test_graph_messages_round_trip_through_protobuf() -> None:
    gemm = _launch(
        function="nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT",
        grid=(2, 64, 1),
        block=(384, 1, 1),
        dynamic_shared_bytes=164308,
        params=bytes(range(256)) * 6 + bytes(184),
        param_offsets=(0,),
        param_sizes=(1720,),
        params_from_extra=True,
        cluster=(2, 1, 1),
        cluster_scheduling_policy=1,
        max_dynamic_shared_bytes=164308,
        non_portable_cluster_size_allowed=True,
    )
    nodes = [
        kernel_node(gemm),
        kernel_node(_launch()),
        memset_node(Memset(INSIDE, 0, 0xFF, 1, 4096, 1), WINDOW, LABEL, 2),
        memcpy_node(Copy3D(2, 2, INSIDE, INSIDE + 8192, 4096), WINDOW, LABEL, 3),
        empty_node(),
    ]
    edges = [
        edge_message(0, 1),
        edge_message(1, 2, 1, 0, 1),
        edge_message(2, 3),
        edge_message(3, 4),
    ]
    graph = pb.Graph(kind=pb.GRAPH_KIND_DECODE, capacity=4, nodes=nodes, edges=edges)
    parsed = pb.Graph()
    parsed.ParseFromString(graph.SerializeToString())
    assert parsed == graph
    assert [n.WhichOneof("op") for n in parsed.nodes] == [
        "kernel",
        "kernel",
        "memset",
        "memcpy",
        "empty",
    ]
    kernel = parsed.nodes[0].kernel
    assert kernel.params == gemm.params and len(kernel.params) == 1720
    assert kernel.params_from_extra and kernel.non_portable_cluster_size_allowed
    assert (kernel.cluster.x, kernel.cluster.y, kernel.cluster.z) == (2, 1, 1)
    assert (kernel.grid.x, kernel.grid.y, kernel.block.x) == (2, 64, 384)
    assert kernel.dynamic_shared_bytes == kernel.max_dynamic_shared_bytes == 164308
    assert kernel.cluster_scheduling_policy == 1
    small = parsed.nodes[1].kernel
    assert list(small.param_offsets) == [0, 8] and list(small.param_sizes) == [8, 4]
    assert not small.params_from_extra
    edge = parsed.edges[1]
    assert (getattr(edge, "from"), edge.to, edge.from_port, edge.to_port, edge.type) == (
        1,
        2,
        1,
        0,
        1,
    )
    copy = parsed.nodes[3].memcpy
    assert (copy.src, copy.dst, copy.size_bytes) == (INSIDE, INSIDE + 8192, 4096)
    memset = parsed.nodes[2].memset
    assert (memset.dst, memset.value, memset.element_size, memset.width) == (INSIDE, 255, 1, 4096)


def test_memcpy_offsets_fold_into_addresses() -> None:
    node = memcpy_node(
        Copy3D(2, 2, INSIDE, INSIDE, 64, src_offset=(16, 0, 0), dst_offset=(256, 0, 0)),
        WINDOW,
        LABEL,
        0,
    )
    assert (node.memcpy.src, node.memcpy.dst) == (INSIDE + 16, INSIDE + 256)


@pytest.mark.parametrize(
    ("copy", "reason"),
    [
        (Copy3D(1, 2, INSIDE, INSIDE, 64), "memcpy HOST to DEVICE"),
        (Copy3D(2, 4, INSIDE, INSIDE, 64), "memcpy DEVICE to UNIFIED"),
        (Copy3D(2, 2, INSIDE, INSIDE, 64, height=2), "64x2x1 bytes is not 1D"),
        (Copy3D(2, 2, INSIDE, INSIDE, 64, src_offset=(0, 1, 0)), "not 1D"),
        (Copy3D(2, 2, OUTSIDE, INSIDE, 64), "memcpy source of 64 bytes at 0x7f"),
        (Copy3D(2, 2, INSIDE, WINDOW[0] + WINDOW[1] - 32, 64), "memcpy destination"),
    ],
)
def test_memcpy_refusals_name_the_node(copy: Copy3D, reason: str) -> None:
    with pytest.raises(ExportError) as refused:
        memcpy_node(copy, WINDOW, LABEL, 5)
    assert "graph DECODE@4, node 5" in str(refused.value)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    ("memset", "reason"),
    [
        (Memset(INSIDE, 0, 0, 8, 16, 1), "memset element size 8"),
        (Memset(INSIDE, 0, 0, 4, 0, 1), "empty memset"),
        (Memset(INSIDE, 8, 0, 4, 16, 2), "pitch 8 below its row of 64"),
        (Memset(OUTSIDE, 0, 0, 4, 16, 1), "outside the window"),
        (Memset(WINDOW[0] + WINDOW[1] - 64, 128, 0, 4, 16, 2), "outside the window"),
    ],
)
def test_memset_refusals_name_the_node(memset: Memset, reason: str) -> None:
    with pytest.raises(ExportError) as refused:
        memset_node(memset, WINDOW, LABEL, 9)
    assert "graph DECODE@4, node 9" in str(refused.value)
    assert reason in str(refused.value)


# ---------------------------------------------------------------- images: ELF and tracing


def _elf(functions: list[str], objects: tuple[str, ...] = ("global_x",)) -> bytes:
    """A minimal ELF64 with a symbol table: the shape of a cubin, as far as tracing reads it."""
    strtab = b"\0"
    symbols = [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for name, kind, section in (
        [(f, 2, 4) for f in functions] + [(o, 1, 4) for o in objects] + [("extern_f", 2, 0)]
    ):
        symbols.append(struct.pack("<IBBHQQ", len(strtab), 0x10 | kind, 0x10, section, 0, 16))
        strtab += name.encode() + b"\0"
    symtab = b"".join(symbols)
    shstrtab = b"\0.shstrtab\0.strtab\0.symtab\0.text.k\0"
    text = b"\0" * 16
    body = shstrtab + strtab + symtab + text
    offsets = [64, 64 + len(shstrtab), 64 + len(shstrtab) + len(strtab)]
    offsets.append(offsets[2] + len(symtab))
    section_offset = 64 + len(body)
    headers = [
        struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, offsets[0], len(shstrtab), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 11, 3, 0, 0, offsets[1], len(strtab), 0, 0, 1, 0),
        struct.pack("<IIQQQQIIQQ", 19, 2, 0, 0, offsets[2], len(symtab), 2, 1, 8, 24),
        struct.pack("<IIQQQQIIQQ", 27, 1, 6, 0, offsets[3], len(text), 3, 0, 128, 0),
    ]
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, section_offset, 0, 64, 0, 0, 64, len(headers), 1
    )
    return header + body + b"".join(headers)


def test_elf_function_names_lists_defined_functions() -> None:
    image = _elf(["kernel_a", "_ZN2at6native6kernelEv"])
    assert elf_function_names(image) == {"kernel_a", "_ZN2at6native6kernelEv"}
    assert elf_function_names(b"// PTX .version 8.0") is None
    assert elf_function_names(image[:100]) is None


def test_resolve_image_trusts_traces_and_unique_names_only() -> None:
    symbols: dict[str, frozenset[str] | None] = {
        "a": frozenset({"triton_k", "only_in_a"}),
        "b": frozenset({"triton_k"}),
        "fatbin": None,
    }
    assert resolve_image("triton_k", [None, "b"], symbols) == "b"
    assert resolve_image("triton_k", ["a", "b"], symbols) == "a"
    assert resolve_image("triton_k", [None, None], symbols) is None  # ambiguous by name
    assert resolve_image("only_in_a", [None, None], symbols) == "a"
    assert resolve_image("only_in_a", [None, "b"], symbols) == "a"  # trace lacks the name
    assert resolve_image("anything", [None, "fatbin"], symbols) == "fatbin"  # not ELF
    assert resolve_image("missing", [None, None], symbols) is None
    assert resolve_image(None, [None, None], symbols) is None


# ---------------------------------------------------------------- recorder callbacks


class _ResourceData(ctypes.Structure):
    _fields_ = [
        ("context", ctypes.c_void_p),
        ("handle", ctypes.c_void_p),
        ("desc", ctypes.c_void_p),
    ]


class _ModuleData(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("size", ctypes.c_size_t), ("cubin", ctypes.c_void_p)]


class _CallbackData(ctypes.Structure):
    _fields_ = [
        ("site", ctypes.c_uint32),
        ("function_name", ctypes.c_void_p),
        ("params", ctypes.c_void_p),
        ("returned", ctypes.c_void_p),
        ("symbol", ctypes.c_void_p),
        ("context", ctypes.c_void_p),
        ("context_uid", ctypes.c_uint32),
        ("correlation_data", ctypes.c_void_p),
        ("correlation_id", ctypes.c_uint32),
    ]


class _Driver:
    """CUPTI's side of the conversation, in memory laid out as CUPTI lays it out."""

    def __init__(self, recorder: ImageRecorder) -> None:
        self.recorder = recorder
        self.keep: list[object] = []

    def load(self, image: bytes) -> None:
        buffer = ctypes.create_string_buffer(image, len(image))
        module = _ModuleData(1, len(image), ctypes.addressof(buffer))
        resource = _ResourceData(None, None, ctypes.addressof(module))
        self.keep += [buffer, module, resource]
        self.recorder._entry(None, cupti.DOMAIN_RESOURCE, 6, ctypes.addressof(resource))

    def call(
        self, cbid: int, params: ctypes.Structure, images: list[bytes], result: int = 0
    ) -> None:
        returned = ctypes.c_int(result)
        for site in (cupti.API_ENTER, cupti.API_EXIT):
            data = _CallbackData(site=site, params=ctypes.addressof(params))
            data.returned = ctypes.addressof(returned) if site == cupti.API_EXIT else None
            self.keep += [data, returned, params]
            if site == cupti.API_EXIT:
                for image in images:
                    self.load(image)
            self.recorder._entry(None, cupti.DOMAIN_DRIVER_API, cbid, ctypes.addressof(data))


class _LoadParams(ctypes.Structure):  # cuModuleLoadData_params
    _fields_ = [("module", ctypes.c_void_p), ("image", ctypes.c_void_p)]


class _GetFunctionParams(ctypes.Structure):  # cuModuleGetFunction_params
    _fields_ = [("hfunc", ctypes.c_void_p), ("hmod", ctypes.c_void_p), ("name", ctypes.c_void_p)]


def _module_load(driver: _Driver, handle: int, images: list[bytes], result: int = 0) -> None:
    out = ctypes.c_void_p(handle)
    driver.keep.append(out)
    driver.call(
        cupti.CBID_MODULE_LOAD_DATA, _LoadParams(ctypes.addressof(out), None), images, result
    )


def _sha(image: bytes) -> str:
    return hashlib.sha256(image).hexdigest()


def test_recorder_keeps_images_deduplicated_by_content() -> None:
    recorder = ImageRecorder()
    driver = _Driver(recorder)
    first, second = _elf(["triton_k"]), _elf(["triton_k"], objects=("other",))
    driver.load(first)
    driver.load(first)
    driver.load(second)
    assert recorder.images() == {_sha(first): first, _sha(second): second}
    assert recorder.images_defining("triton_k") == sorted([_sha(first), _sha(second)])
    assert recorder.errors == []


def test_recorder_traces_handles_of_the_call_that_loaded_an_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = ImageRecorder()
    driver = _Driver(recorder)
    first, second = _elf(["triton_k"]), _elf(["triton_k"], objects=("other",))
    _module_load(driver, 0xA000, [first])
    _module_load(driver, 0xB000, [second])
    _module_load(driver, 0xC000, [first, second])  # two images in one call: not traced
    _module_load(driver, 0xD000, [first], result=1)  # failed call: not traced
    function_out = ctypes.c_void_p(0xF000)
    driver.keep.append(function_out)
    driver.call(
        cupti.CBID_MODULE_GET_FUNCTION,
        _GetFunctionParams(ctypes.addressof(function_out), 0xE000, None),
        [second],
    )
    traced = {(kind, handle): sha for kind, handle, sha in recorder.traced_handles()}
    assert traced == {
        ("module", 0xA000): _sha(first),
        ("module", 0xB000): _sha(second),
        ("module", 0xE000): _sha(second),
        ("function", 0xF000): _sha(second),
    }
    modules = {0x1: 0xA000, 0x2: 0xB000, 0x3: 0xC000, 0xF000: 0xE000}
    monkeypatch.setattr(cupti, "_function_module", modules.get)
    monkeypatch.setattr(cupti, "_function_name", lambda handle: "triton_k")
    assert recorder.image_of_function(0x1) == _sha(first)
    assert recorder.image_of_function(0x2) == _sha(second)
    assert recorder.image_of_function(0x3) is None  # same name in two images, untraced
    assert recorder.image_of_function(0xF000) == _sha(second)


def test_recorder_callback_never_raises_into_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = ImageRecorder()

    def broken(image: bytes) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(recorder, "_record", broken)
    _Driver(recorder).load(b"\x7fELF")
    assert recorder.images() == {}
    assert len(recorder.errors) == 1 and "boom" in recorder.errors[0]


# ---------------------------------------------------------------- recorder start


def test_start_without_cupti_says_where_it_looked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cupti, "_mapped_cupti", lambda: None)
    monkeypatch.setattr(cupti, "_candidate_dirs", lambda: [tmp_path / "nvidia" / "cu13" / "lib"])
    recorder = ImageRecorder()
    with pytest.raises(ExportError) as refused:
        recorder.start()
    message = str(refused.value)
    assert "libcupti (CUPTI) not found" in message
    assert str(tmp_path / "nvidia" / "cu13" / "lib") in message
    assert "nvidia-cuda-cupti" in message
    assert not recorder.active


def test_start_with_a_missing_explicit_library(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="does not exist"):
        ImageRecorder(library=tmp_path / "libcupti.so.13").start()


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_driver(), reason="checks the refusal on a machine without a driver")
def test_start_on_a_machine_without_cuda_refuses_clearly() -> None:
    recorder = ImageRecorder()
    with pytest.raises(ExportError, match=r"libcuda|libcupti|CUPTI"):
        recorder.start()
    assert not recorder.active
    recorder.stop()  # harmless when never started


# ---------------------------------------------------------------- GPU


_GPU_SCENARIO = r"""
import json
import torch
from ignition.export import flare_core_pb2 as pb
from ignition.export.cupti import ImageRecorder
from ignition.export.graph_walk import ExportError, walk_graph

recorder = ImageRecorder()
recorder.start()  # before the first kernel of the process loads
a = torch.randn(256, 256, device="cuda")
b = torch.randn(256, 256, device="cuda")
# bf16 GEMMs that cuBLAS runs with (2, 4, 1)-block clusters on the H200.
narrow = [torch.randn(m, 64, device="cuda", dtype=torch.bfloat16) for m in (128, 512)]
wide = [torch.randn(n, 64, device="cuda", dtype=torch.bfloat16) for n in (128, 512)]


@torch.compile(dynamic=False)
def pointwise(x):
    return torch.tanh(x * 0.5 + 1.0) * torch.sigmoid(x)


def step():
    h = a @ b  # cuBLAS
    h = torch.relu(h) + a  # ATen elementwise
    for x in narrow:
        for w in wide:
            torch.nn.functional.linear(x, w)
    return pointwise(h)  # Inductor / Triton


stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    for _ in range(3):
        step()
torch.cuda.current_stream().wait_stream(stream)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph(keep_graph=True)
with torch.cuda.graph(graph):
    out = step()
torch.cuda.synchronize()
raw = graph.raw_cuda_graph()
walked = walk_graph(raw, recorder, (0, 2**64 - 1), pb.GRAPH_KIND_DECODE, 1)
try:
    walk_graph(raw, recorder, (1, 2), pb.GRAPH_KIND_DECODE, 1)
    refusal = None
except ExportError as error:
    refusal = str(error)
recorder.stop()
images = recorder.images()
kernels = [n.kernel for n in walked.nodes if n.WhichOneof("op") == "kernel"]
print("RESULT " + json.dumps({
    "nodes": len(walked.nodes),
    "edges": len(walked.edges),
    "kernels": [k.function for k in kernels],
    "clusters": [
        [k.function, [k.grid.x, k.grid.y, k.grid.z], [k.cluster.x, k.cluster.y, k.cluster.z]]
        for k in kernels
    ],
    "without_image": [k.function for k in kernels if k.image_sha256 not in images],
    "without_params": [k.function for k in kernels if not k.params],
    "round_trips": pb.Graph.FromString(walked.SerializeToString()) == walked,
    "refusal": refusal,
    "errors": recorder.errors,
}))
"""


@pytest.mark.gpu
def test_walk_of_a_captured_torch_graph(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _GPU_SCENARIO],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    kernels = result["kernels"]
    assert len(kernels) >= 3, result
    assert any(name.startswith("triton_") for name in kernels), result
    assert result["without_image"] == [], result
    assert result["without_params"] == [], result
    assert result["edges"] >= len(kernels) - 1, result
    assert result["round_trips"], result
    assert result["errors"] == [], result
    assert result["refusal"] is not None and "outside the window" in result["refusal"], result
    # cuBLAS's cluster kernels keep their cluster shape (one lost faults the rebuild with
    # an illegal instruction at its first cluster barrier), and a cluster tiles the grid.
    clustered = [
        (name, grid, cluster) for name, grid, cluster in result["clusters"] if any(cluster)
    ]
    assert any(
        name.startswith("nvjet") and cluster[0] * cluster[1] * cluster[2] > 1
        for name, _, cluster in clustered
    ), result["clusters"]
    for name, grid, cluster in clustered:
        assert all(g % c == 0 for g, c in zip(grid, cluster, strict=True)), (name, grid, cluster)


# ---------------------------------------------------------------- the walk, driver-shaped


class _FakeDriver:
    """The cuda.bindings calls walk_graph makes, answered from a scripted graph, with the
    bindings' own types and result shapes (this checks the walk's glue on the CPU; what
    a real driver answers is the GPU test's business)."""

    def __init__(self, cu: Any, nodes: list[tuple[str, Any]], edges: list[tuple]) -> None:
        self.cu = cu
        self.types = nodes
        self.edges = edges
        self.handles = [cu.CUgraphNode(0x100 + i) for i in range(len(nodes))]
        self.context = 1
        self.cooperative = 0
        self.allocations = [(INSIDE, 1 << 20), (OUTSIDE, 1 << 20)]
        self.functions: dict[int, tuple[str, list[tuple[int, int]], dict[int, int]]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cu, name)

    def _ok(self) -> Any:
        return self.cu.CUresult.CUDA_SUCCESS

    def _node(self, node: Any) -> Any:
        return self.types[int(node) - 0x100][1]

    def cuCtxGetCurrent(self) -> tuple:
        return self._ok(), self.cu.CUcontext(self.context)

    def cuGetErrorName(self, err: object) -> tuple:
        return self._ok(), str(getattr(err, "name", err)).encode()

    def cuGraphGetNodes(self, graph: object, count: int = 0) -> tuple:
        return self._ok(), self.handles[:count], len(self.handles)

    def cuGraphNodeGetType(self, node: Any) -> tuple:
        kind = self.types[int(node) - 0x100][0]
        return self._ok(), getattr(self.cu.CUgraphNodeType, f"CU_GRAPH_NODE_TYPE_{kind}")

    def cuGraphKernelNodeGetParams(self, node: Any) -> tuple:
        return self._ok(), self._node(node)[0]

    def cuGraphKernelNodeGetAttribute(self, node: Any, attribute: Any) -> tuple:
        # The value is a union (CUlaunchAttributeValue): fill only the queried member.
        value = self.cu.CUkernelNodeAttrValue()
        cluster, policy = self._node(node)[1]
        # Written as the union's bytes: the walk reads bytes, not the binding's members.
        if int(attribute) == 4:
            words = struct.pack("<3I", *cluster)
        elif int(attribute) == 5:
            words = struct.pack("<I", policy)
        elif int(attribute) == 2:
            words = struct.pack("<i", self.cooperative)
        else:
            words = b""
        ctypes.memmove(int(value.getPtr()), words, len(words))
        return self._ok(), value

    def cuGraphMemsetNodeGetParams(self, node: Any) -> tuple:
        return self._ok(), self._node(node)

    def cuGraphMemcpyNodeGetParams(self, node: Any) -> tuple:
        return self._ok(), self._node(node)

    def cuFuncGetName(self, func: Any) -> tuple:
        return self._ok(), self.functions[int(func)][0].encode()

    def cuFuncGetParamCount(self, func: Any) -> tuple:
        return self._ok(), len(self.functions[int(func)][1])

    def cuFuncGetParamInfo(self, func: Any, index: int) -> tuple:
        offset, size = self.functions[int(func)][1][index]
        return self._ok(), offset, size

    def cuFuncGetAttribute(self, attribute: Any, func: Any) -> tuple:
        return self._ok(), self.functions[int(func)][2].get(int(attribute), 0)

    def _lookup(self, value: int) -> Any:
        inside = any(start <= value < start + size for start, size in self.allocations)
        return self._ok() if inside else self.cu.CUresult.CUDA_ERROR_INVALID_VALUE

    def cuPointerGetAttribute(self, attribute: Any, pointer: Any) -> tuple:
        return self._lookup(int(pointer)), 0

    def cuMemGetAddressRange(self, pointer: Any) -> tuple:
        return self._lookup(int(pointer)), 0, 0

    def cuGraphGetEdges(self, graph: object, count: int = 0) -> tuple:
        data = []
        for _, _, from_port, kind in self.edges[:count]:
            datum = self.cu.CUgraphEdgeData()
            datum.from_port, datum.type = from_port, kind
            data.append(datum)
        sources = [self.handles[e[0]] for e in self.edges[:count]]
        targets = [self.handles[e[1]] for e in self.edges[:count]]
        return self._ok(), sources, targets, data, len(self.edges)


class _FakeRecorder:
    def __init__(self, images: dict[int, str]) -> None:
        self.by_function = images

    def image_of_function(self, func_handle: int) -> str | None:
        return self.by_function.get(func_handle)

    def images_defining(self, name: str) -> list[str]:
        return []


def _walk(recorder: _FakeRecorder, window: tuple[int, int], kind: int, capacity: int) -> pb.Graph:
    return walk_graph(0x1234, recorder, window, kind, capacity)  # type: ignore[arg-type]


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> tuple[_FakeDriver, list[object]]:
    """A graph of a kernelParams kernel, a cuBLAS-like extra-block kernel with a cluster,
    a memset and an empty node, chained, with one programmatic edge."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from ignition.export import graph_walk

    keep: list[object] = []

    def kernel(func: int, grid: int, kernel_params: int = 0, extra: int = 0) -> object:
        params = cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = cu.CUfunction(func)
        params.gridDimX, params.gridDimY, params.gridDimZ = grid, 1, 1
        params.blockDimX, params.blockDimY, params.blockDimZ = 128, 1, 1
        params.sharedMemBytes = 0 if func == 0xA0 else 164308
        params.kernelParams, params.extra = kernel_params, extra
        return params

    # kernelParams: (int n, bool flag, struct {char *p[2]}) at offsets 0, 4, 8
    values = [ctypes.c_int32(64), ctypes.c_bool(True), (ctypes.c_uint64 * 2)(INSIDE, INSIDE + 256)]
    pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in values])
    block = ctypes.create_string_buffer(_words(0, INSIDE + 512, 7, INSIDE + 1024), 32)
    size = ctypes.c_size_t(32)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(block), 2, ctypes.addressof(size), 0)
    keep += [values, pointers, block, size, extra]
    memset = cu.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.value, memset.elementSize, memset.width, memset.height = (
        cu.CUdeviceptr(INSIDE),
        0,
        4,
        256,
        1,
    )
    nodes: list[tuple[str, object]] = [
        ("KERNEL", (kernel(0xA0, 64, kernel_params=ctypes.addressof(pointers)), ((0, 0, 0), 0))),
        ("KERNEL", (kernel(0xB0, 2, extra=ctypes.addressof(extra)), ((2, 1, 1), 1))),
        ("MEMSET", memset),
        ("EMPTY", None),
    ]
    driver = _FakeDriver(cu, nodes, [(0, 1, 0, 0), (1, 2, 1, 1), (2, 3, 0, 0)])
    driver.functions = {
        0xA0: ("elementwise_kernel", [(0, 4), (4, 1), (8, 16)], {}),
        0xB0: ("nvjet_sm90_tst", [(0, 32)], {8: 164308, 14: 1}),
    }
    monkeypatch.setattr(graph_walk, "_driver", lambda label: driver)
    return driver, keep


def test_walk_builds_the_manifest_graph(scripted: tuple[_FakeDriver, list[object]]) -> None:
    recorder = _FakeRecorder({0xA0: "a" * 64, 0xB0: "b" * 64})
    graph = _walk(recorder, WINDOW, pb.GRAPH_KIND_PREFILL, 128)
    assert (graph.kind, graph.capacity) == (pb.GRAPH_KIND_PREFILL, 128)
    assert [n.WhichOneof("op") for n in graph.nodes] == ["kernel", "kernel", "memset", "empty"]
    first, gemm = graph.nodes[0].kernel, graph.nodes[1].kernel
    assert (first.function, first.image_sha256, first.grid.x) == (
        "elementwise_kernel",
        "a" * 64,
        64,
    )
    assert first.params == layout_params(
        [struct.pack("<i", 64), b"\x01", _words(INSIDE, INSIDE + 256)], [(0, 4), (4, 1), (8, 16)]
    )
    assert list(first.param_offsets) == [0, 4, 8] and not first.params_from_extra
    assert gemm.params_from_extra and gemm.params == _words(0, INSIDE + 512, 7, INSIDE + 1024)
    assert (gemm.cluster.x, gemm.cluster.y, gemm.cluster.z, gemm.cluster_scheduling_policy) == (
        2,
        1,
        1,
        1,
    )
    assert gemm.max_dynamic_shared_bytes == gemm.dynamic_shared_bytes == 164308
    assert gemm.non_portable_cluster_size_allowed
    assert graph.nodes[2].memset.dst == INSIDE and graph.nodes[2].memset.width == 256
    assert [(getattr(e, "from"), e.to, e.from_port, e.type) for e in graph.edges] == [
        (0, 1, 0, 0),
        (1, 2, 1, 1),
        (2, 3, 0, 0),
    ]


def test_walk_refuses_pointers_outside_a_small_window(
    scripted: tuple[_FakeDriver, list[object]],
) -> None:
    recorder = _FakeRecorder({0xA0: "a" * 64, 0xB0: "b" * 64})
    with pytest.raises(ExportError, match=r"graph DECODE@1, node 0: kernel elementwise_kernel"):
        _walk(recorder, (1, 2), pb.GRAPH_KIND_DECODE, 1)
    window = (INSIDE, 1024)  # holds the first kernel's pointers, not the extra block's last
    with pytest.raises(
        ExportError, match=r"node 1: kernel nvjet_sm90_tst: .*\(byte 24: 0x200000001400\)"
    ):
        _walk(recorder, window, pb.GRAPH_KIND_DECODE, 1)


def test_walk_refuses_unrecorded_images_and_missing_context(
    scripted: tuple[_FakeDriver, list[object]],
) -> None:
    driver, _ = scripted
    recorder = _FakeRecorder({0xA0: "a" * 64})
    with pytest.raises(ExportError, match=r"node 1: kernel nvjet_sm90_tst: image not recorded"):
        _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 1)
    driver.context = 0
    with pytest.raises(ExportError, match="no current CUDA context"):
        _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 1)


def test_walk_refuses_a_host_node(scripted: tuple[_FakeDriver, list[object]]) -> None:
    driver, _ = scripted
    driver.types[3] = ("HOST", None)
    recorder = _FakeRecorder({0xA0: "a" * 64, 0xB0: "b" * 64})
    with pytest.raises(ExportError, match=r"graph DECODE@2, node 3: host node"):
        _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 2)


def test_walk_reads_memcpy_nodes_and_refuses_cooperative_kernels(
    scripted: tuple[_FakeDriver, list[object]],
) -> None:
    from cuda.bindings import driver as cu

    driver, _ = scripted
    copy = cu.CUDA_MEMCPY3D()
    copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    copy.srcDevice, copy.dstDevice = cu.CUdeviceptr(INSIDE), cu.CUdeviceptr(INSIDE + 4096)
    copy.srcXInBytes, copy.WidthInBytes, copy.Height, copy.Depth = 64, 512, 1, 1
    driver.types[3] = ("MEMCPY", copy)
    recorder = _FakeRecorder({0xA0: "a" * 64, 0xB0: "b" * 64})
    graph = _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 1)
    node = graph.nodes[3].memcpy
    assert (node.src, node.dst, node.size_bytes) == (INSIDE + 64, INSIDE + 4096, 512)
    unset = cu.CUDA_MEMCPY3D()  # memory types 0: not even a valid CUmemorytype
    unset.WidthInBytes, unset.Height, unset.Depth = 512, 1, 1
    driver.types[3] = ("MEMCPY", unset)
    with pytest.raises(ExportError, match=r"node 3: memcpy 0 to 0: only DEVICE to DEVICE"):
        _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 1)
    driver.cooperative = 1
    with pytest.raises(ExportError, match=r"node 0: kernel elementwise_kernel: cooperative"):
        _walk(recorder, WINDOW, pb.GRAPH_KIND_DECODE, 1)


def test_cluster_dimensions_are_normalized() -> None:
    from ignition.export.graph_walk import normalize_cluster

    assert normalize_cluster((0, 0, 0)) == (0, 0, 0)
    assert normalize_cluster((1, 1, 1)) == (0, 0, 0)
    assert normalize_cluster((2, 1, 1)) == (2, 1, 1)
    assert normalize_cluster((2, 4, 1)) == (2, 4, 1)
    with pytest.raises(ValueError, match="zero axis"):
        normalize_cluster((1, 0, 0))
