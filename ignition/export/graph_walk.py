"""Walk a captured CUDA graph into the manifest's ``Graph`` message.

The runtime core rebuilds each captured graph in a process that has no Python and
no PyTorch, through the CUDA driver API alone: it loads the recorded kernel images,
adds one node per captured node with the same launch configuration and the same
parameter bytes, and joins them with the same edges. That only reproduces the
computation if everything a node depends on travels with it, so the walk copies
what the rebuild needs and refuses, naming the graph and node, whatever it cannot
reproduce faithfully:

- host, event, child-graph, conditional, memory-allocation and other node types
  (a CPU callback or a graph-owned allocation has no meaning in the rebuilt process);
- a kernel whose image was not recorded (or cannot be told apart from another);
- a memcpy that is not a plain device-to-device 1D copy;
- any address that lies outside the fixed virtual-address window. Kernel parameters
  hold raw device addresses, some inside opaque blocks (cuBLAS passes TMA descriptors
  in its ``extra`` buffer), so they cannot be relocated: every buffer a graph touches
  must sit in the window, which the rebuilt process maps at the same addresses. An
  8-byte-aligned parameter word that resolves to a CUDA allocation but lies outside
  the window is the evidence that one does not.

Parameter bytes use one layout in both launch modes: the device-side parameter
buffer, parameter ``i`` at ``param_offsets[i]`` with ``param_sizes[i]`` bytes (zero
padding between them). With ``kernelParams`` the loader passes pointers into it;
with ``params_from_extra`` it passes the whole buffer as the one ``extra`` block,
which is how cuBLAS launched it.

The pure parts (node-type checks, parameter layout, pointer-word scanning, message
assembly) take plain values and are unit-tested on the CPU; the driver calls are
kept in small functions below them and need the H200.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ignition.export import flare_core_pb2 as pb

if TYPE_CHECKING:
    from ignition.export.cupti import ImageRecorder


class ExportError(RuntimeError):
    """Something a runtime core cannot carry faithfully; the message names what and where."""


Window = tuple[int, int]
Dim = tuple[int, int, int]

WORD_BYTES = 8
MAX_PARAM_BYTES = 32768  # the driver's limit on a kernel's parameter space is 32764 bytes
MAX_PARAMS = 4096
MAX_EXTRA_ENTRIES = 64
SHOWN_POINTERS = 4
# Values outside [64 KiB, 2**57) cannot be user-space (hence unified) addresses on
# x86-64 or aarch64, even with 5-level paging: such words are not looked up.
LOWEST_ADDRESS = 1 << 16
ADDRESS_LIMIT = 1 << 57

# CU_LAUNCH_PARAM_* keys of a kernel node's `extra` array (cuda.h).
EXTRA_END = 0x00
EXTRA_BUFFER_POINTER = 0x01
EXTRA_BUFFER_SIZE = 0x02

# CUmemorytype values (cuda.h).
MEMORY_TYPE_NAMES = {1: "HOST", 2: "DEVICE", 3: "ARRAY", 4: "UNIFIED"}
MEMORY_TYPE_DEVICE = 2

# CUlaunchAttributeID values used as kernel-node attributes (cuda.h).
ATTRIBUTE_COOPERATIVE = 2
ATTRIBUTE_CLUSTER_DIMENSION = 4
ATTRIBUTE_CLUSTER_SCHEDULING_POLICY = 5

SUPPORTED_NODE_TYPES = ("KERNEL", "MEMSET", "MEMCPY", "EMPTY")
_REFUSED_NODE_TYPES = {
    "HOST": "host node: a CPU callback cannot run in the rebuilt process",
    "GRAPH": "child-graph node: nested graphs are not exported, capture a flat graph",
    "EVENT_RECORD": "event-record node: events do not exist in the rebuilt process",
    "WAIT_EVENT": "event-wait node: events do not exist in the rebuilt process",
    "CONDITIONAL": "conditional node: conditional graphs are not exported",
    "MEM_ALLOC": "memory-allocation node: every buffer must live in the fixed window",
    "MEM_FREE": "memory-free node: every buffer must live in the fixed window",
    "EXT_SEMAS_SIGNAL": "external-semaphore node: no external semaphores in the rebuilt process",
    "EXT_SEMAS_WAIT": "external-semaphore node: no external semaphores in the rebuilt process",
    "BATCH_MEM_OP": "batched memory-operation node: not exported",
}


# ---------------------------------------------------------------- pure: naming and checks


def graph_label(kind: int, capacity: int) -> str:
    """``DECODE@4``: how refusals name a graph."""
    try:
        name = pb.GraphKind.Name(kind).removeprefix("GRAPH_KIND_")
    except ValueError:
        name = f"kind {kind}"
    return f"{name}@{capacity}"


def node_refusal(label: str, index: int, reason: str) -> ExportError:
    return ExportError(f"cannot export graph {label}, node {index}: {reason}")


def check_window(window: Window, label: str) -> Window:
    """The window as (base, size), checked: [base, base + size) within 64-bit addresses."""
    base, size = (int(v) for v in window)
    if base < 0 or size <= 0 or base + size > 1 << 64:
        raise ExportError(
            f"cannot export graph {label}: invalid window (base {base:#x}, size {size})"
        )
    return base, size


def range_in_window(start: int, length: int, window: Window) -> bool:
    """Whether [start, start + length) lies inside the window."""
    base, size = window
    return base <= start and start + length <= base + size


def check_node_type(type_name: str, label: str, index: int) -> str:
    """The short node type (``KERNEL``, ``MEMSET``, ``MEMCPY``, ``EMPTY``) of a node the
    export supports; any other type is refused, with why."""
    short = type_name.removeprefix("CU_GRAPH_NODE_TYPE_")
    if short in SUPPORTED_NODE_TYPES:
        return short
    reason = _REFUSED_NODE_TYPES.get(short, f"unsupported node type {type_name}")
    raise node_refusal(label, index, reason)


# ---------------------------------------------------------------- pure: parameters


def layout_params(values: Sequence[bytes], layout: Sequence[tuple[int, int]]) -> bytes:
    """Lay the values of a kernelParams launch out as the device-side parameter buffer:
    value ``i`` at ``layout[i]``'s offset. Raises ValueError when they disagree."""
    if len(values) != len(layout):
        raise ValueError(f"{len(values)} parameter values for {len(layout)} parameters")
    buffer = bytearray(max((offset + size for offset, size in layout), default=0))
    end = 0
    for i, (value, (offset, size)) in enumerate(zip(values, layout, strict=True)):
        if len(value) != size:
            raise ValueError(f"parameter {i} holds {len(value)} bytes, its layout says {size}")
        if offset < end:
            raise ValueError(f"parameter {i} at offset {offset} overlaps the one before")
        buffer[offset : offset + size] = value
        end = offset + size
    return bytes(buffer)


def check_layout_fits(block_size: int, layout: Sequence[tuple[int, int]]) -> None:
    """An ``extra`` block must hold every parameter the function declares."""
    for i, (offset, size) in enumerate(layout):
        if offset + size > block_size:
            raise ValueError(
                f"parameter {i} ends at byte {offset + size}, past the {block_size}-byte "
                "extra block"
            )


def parse_extra(entries: Sequence[int]) -> tuple[int, int]:
    """(buffer address, address of its size) from a kernel node's ``extra`` array: key,
    value pairs ending with END. Raises ValueError on any other shape."""
    buffer = size = None
    for position in range(0, len(entries), 2):
        key = entries[position]
        if key == EXTRA_END:
            break
        if position + 1 >= len(entries):
            raise ValueError("extra array ends inside a key/value pair")
        value = entries[position + 1]
        if key == EXTRA_BUFFER_POINTER:
            buffer = value
        elif key == EXTRA_BUFFER_SIZE:
            size = value
        else:
            raise ValueError(f"extra array holds unknown key {key:#x}")
    else:
        raise ValueError(f"extra array has no END within {len(entries)} entries")
    if not buffer or not size:
        raise ValueError("extra array lacks the buffer pointer or its size")
    return buffer, size


@dataclass(frozen=True)
class PointerWord:
    """An 8-byte parameter word that resolves to a CUDA allocation."""

    offset: int
    value: int


def pointer_words_outside(
    params: bytes,
    window: Window,
    is_device_pointer: Callable[[int], bool],
    peers: Sequence[Window] = (),
) -> list[PointerWord]:
    """Every 8-byte-aligned word of ``params`` that ``is_device_pointer`` accepts but
    that lies outside the window and outside every range of ``peers`` (a tensor-parallel
    rank's view of its peers' collectives regions, which the serving process maps at
    the same addresses with every rank's window). Words inside are not looked up: any
    value there is reproduced by the mapping, pointer or not."""
    base, size = window
    found = []
    for offset in range(0, len(params) - WORD_BYTES + 1, WORD_BYTES):
        (value,) = struct.unpack_from("<Q", params, offset)
        if value == 0 or base <= value < base + size:
            continue
        if any(start <= value < start + length for start, length in peers):
            continue
        if is_device_pointer(value):
            found.append(PointerWord(offset, value))
    return found


def check_params_in_window(
    params: bytes,
    window: Window,
    is_device_pointer: Callable[[int], bool],
    label: str,
    index: int,
    function: str,
    peers: Sequence[Window] = (),
) -> None:
    """Refuse a kernel whose parameters point at memory outside the window (and
    outside ``peers``' ranges: ``pointer_words_outside``)."""
    outside = pointer_words_outside(params, window, is_device_pointer, peers)
    if not outside:
        return
    base, size = window
    shown = ", ".join(f"byte {w.offset}: {w.value:#x}" for w in outside[:SHOWN_POINTERS])
    more = f" and {len(outside) - SHOWN_POINTERS} more" if len(outside) > SHOWN_POINTERS else ""
    raise node_refusal(
        label,
        index,
        f"kernel {function}: parameters hold {len(outside)} device pointer(s) outside the "
        f"window [{base:#x}, {base + size:#x}) ({shown}{more}); addresses inside parameters "
        "cannot be relocated, so every buffer the graph touches must be allocated in the window",
    )


# ---------------------------------------------------------------- pure: messages


@dataclass(frozen=True)
class KernelLaunch:
    """Everything the rebuild needs to add one kernel node, as plain values."""

    image_sha256: str
    function: str
    grid: Dim
    block: Dim
    dynamic_shared_bytes: int
    params: bytes
    param_offsets: tuple[int, ...]
    param_sizes: tuple[int, ...]
    params_from_extra: bool = False
    cluster: Dim = (0, 0, 0)
    cluster_scheduling_policy: int = 0
    max_dynamic_shared_bytes: int = 0
    non_portable_cluster_size_allowed: bool = False


def _dim(values: Dim) -> pb.Dim3:
    x, y, z = values
    return pb.Dim3(x=x, y=y, z=z)


def kernel_node(launch: KernelLaunch) -> pb.Node:
    return pb.Node(
        kernel=pb.KernelNode(
            image_sha256=launch.image_sha256,
            function=launch.function,
            grid=_dim(launch.grid),
            block=_dim(launch.block),
            dynamic_shared_bytes=launch.dynamic_shared_bytes,
            params=launch.params,
            param_offsets=list(launch.param_offsets),
            param_sizes=list(launch.param_sizes),
            params_from_extra=launch.params_from_extra,
            cluster=_dim(launch.cluster),
            cluster_scheduling_policy=launch.cluster_scheduling_policy,
            max_dynamic_shared_bytes=launch.max_dynamic_shared_bytes,
            non_portable_cluster_size_allowed=launch.non_portable_cluster_size_allowed,
        )
    )


@dataclass(frozen=True)
class Memset:
    """A memset node's parameters (CUDA_MEMSET_NODE_PARAMS) as plain values."""

    dst: int
    pitch: int
    value: int
    element_size: int
    width: int
    height: int


def memset_node(memset: Memset, window: Window, label: str, index: int) -> pb.Node:
    """A memset node, refused unless well-formed and entirely inside the window."""
    if memset.element_size not in (1, 2, 4):
        raise node_refusal(label, index, f"memset element size {memset.element_size}")
    if memset.width == 0 or memset.height == 0:
        raise node_refusal(label, index, "empty memset")
    row = memset.width * memset.element_size
    if memset.height > 1 and memset.pitch < row:
        raise node_refusal(label, index, f"memset pitch {memset.pitch} below its row of {row}")
    extent = (memset.height - 1) * memset.pitch + row
    if not range_in_window(memset.dst, extent, window):
        raise node_refusal(
            label,
            index,
            f"memset of {extent} bytes at {memset.dst:#x} lies outside the window "
            f"[{window[0]:#x}, {window[0] + window[1]:#x})",
        )
    return pb.Node(
        memset=pb.MemsetNode(
            dst=memset.dst,
            pitch=memset.pitch,
            value=memset.value,
            element_size=memset.element_size,
            width=memset.width,
            height=memset.height,
        )
    )


@dataclass(frozen=True)
class Copy3D:
    """The CUDA_MEMCPY3D fields a device-to-device copy uses, as plain values."""

    src_type: int
    dst_type: int
    src_device: int
    dst_device: int
    width: int
    height: int = 1
    depth: int = 1
    src_offset: Dim = (0, 0, 0)  # srcXInBytes, srcY, srcZ
    dst_offset: Dim = (0, 0, 0)
    src_lod: int = 0
    dst_lod: int = 0


def memcpy_node(copy: Copy3D, window: Window, label: str, index: int) -> pb.Node:
    """A memcpy node, refused unless a 1D device-to-device copy inside the window."""
    if (copy.src_type, copy.dst_type) != (MEMORY_TYPE_DEVICE, MEMORY_TYPE_DEVICE):
        src = MEMORY_TYPE_NAMES.get(copy.src_type, str(copy.src_type))
        dst = MEMORY_TYPE_NAMES.get(copy.dst_type, str(copy.dst_type))
        raise node_refusal(label, index, f"memcpy {src} to {dst}: only DEVICE to DEVICE")
    flat = copy.height <= 1 and copy.depth <= 1 and copy.src_lod == 0 and copy.dst_lod == 0
    if not flat or copy.src_offset[1:] != (0, 0) or copy.dst_offset[1:] != (0, 0):
        raise node_refusal(
            label,
            index,
            f"memcpy of {copy.width}x{copy.height}x{copy.depth} bytes is not 1D",
        )
    src = copy.src_device + copy.src_offset[0]
    dst = copy.dst_device + copy.dst_offset[0]
    for what, address in (("source", src), ("destination", dst)):
        if not range_in_window(address, copy.width, window):
            raise node_refusal(
                label,
                index,
                f"memcpy {what} of {copy.width} bytes at {address:#x} lies outside the "
                f"window [{window[0]:#x}, {window[0] + window[1]:#x})",
            )
    return pb.Node(memcpy=pb.MemcpyNode(dst=dst, src=src, size_bytes=copy.width))


def empty_node() -> pb.Node:
    return pb.Node(empty=pb.EmptyNode())


def edge_message(
    source: int, target: int, from_port: int = 0, to_port: int = 0, kind: int = 0
) -> pb.Edge:
    """One dependency, by node index, with the driver's edge data (ports and type: a
    programmatic edge must stay programmatic)."""
    return pb.Edge(
        **{"from": source, "to": target, "from_port": from_port, "to_port": to_port, "type": kind}
    )


# ---------------------------------------------------------------- the walk (CUDA)


def walk_graph(
    raw_graph: int,
    recorder: ImageRecorder,
    window: tuple[int, int],
    kind: int,
    capacity: int,
    peers: Sequence[Window] = (),
) -> pb.Graph:
    """The manifest ``Graph`` for one captured graph (``CUDAGraph.raw_cuda_graph()``
    with ``keep_graph=True``). ``window`` is (base, size) of the fixed address window;
    ``peers`` the (base, size) of a tensor-parallel rank's peers' collectives regions,
    which its kernels may also point into; ``recorder`` must have been recording since
    before the graph's kernels loaded. Call it on the thread that captured, whose CUDA
    context is current."""
    label = graph_label(kind, capacity)
    window = check_window(window, label)
    cu = _driver(label)
    _require_context(cu, label)
    graph = cu.CUgraph(int(raw_graph))
    nodes = _graph_nodes(cu, graph, label)
    is_device_pointer = _pointer_predicate(cu, label)
    messages = []
    for index, node in enumerate(nodes):
        node_type = check_node_type(_node_type_name(cu, node, label, index), label, index)
        if node_type == "KERNEL":
            launch = _kernel_launch(cu, node, recorder, label, index)
            check_params_in_window(
                launch.params, window, is_device_pointer, label, index, launch.function, peers
            )
            messages.append(kernel_node(launch))
        elif node_type == "MEMSET":
            messages.append(memset_node(_memset(cu, node, label, index), window, label, index))
        elif node_type == "MEMCPY":
            messages.append(memcpy_node(_memcpy(cu, node, label, index), window, label, index))
        else:
            messages.append(empty_node())
    index_of = {int(node): index for index, node in enumerate(nodes)}
    edges = _graph_edges(cu, graph, index_of, label)
    return pb.Graph(kind=kind, capacity=capacity, nodes=messages, edges=edges)


def _driver(label: str) -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise ExportError(
            f"cannot export graph {label}: cuda-bindings (cuda.bindings.driver) is not "
            f"installed ({error})"
        ) from error
    return driver


def _error_name(cu: Any, err: Any) -> str:
    try:
        status, name = cu.cuGetErrorName(err)
        if status == cu.CUresult.CUDA_SUCCESS:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    return str(err)


def _call(cu: Any, result: Any, what: str, where: str) -> list[Any]:
    """The values of a cuda-bindings call, or ExportError naming the call and place."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise ExportError(f"cannot export {where}: {what} failed with {_error_name(cu, err)}")
    return values


def _node_at(label: str, index: int) -> str:
    return f"graph {label}, node {index}"


def _require_context(cu: Any, label: str) -> None:
    """Pointer lookups without a current context fail for every address, which would
    make every parameter look pointer-free: refuse instead."""
    err, context = cu.cuCtxGetCurrent()
    if err != cu.CUresult.CUDA_SUCCESS or int(context) == 0:
        raise ExportError(
            f"cannot export graph {label}: no current CUDA context on this thread "
            f"({_error_name(cu, err)}); walk on the thread that captured the graph"
        )


def _graph_nodes(cu: Any, graph: Any, label: str) -> list[Any]:
    where = f"graph {label}"
    (_, count) = _call(cu, cu.cuGraphGetNodes(graph, 0), "cuGraphGetNodes", where)
    if not int(count):
        return []
    nodes, returned = _call(cu, cu.cuGraphGetNodes(graph, int(count)), "cuGraphGetNodes", where)
    return list(nodes)[: int(returned)]


def _graph_edges(cu: Any, graph: Any, index_of: dict[int, int], label: str) -> list[pb.Edge]:
    """Edges with their edge data (``cuGraphGetEdges`` returns it since CUDA 13;
    ``cuGraphGetEdges_v2`` where the bindings still name it so)."""
    where = f"graph {label}"
    get_edges = getattr(cu, "cuGraphGetEdges_v2", None) or cu.cuGraphGetEdges
    count = int(_call(cu, get_edges(graph, 0), "cuGraphGetEdges", where)[-1])
    if not count:
        return []
    values = _call(cu, get_edges(graph, count), "cuGraphGetEdges", where)
    sources, targets, returned = values[0], values[1], int(values[-1])
    data = values[2] if len(values) == 4 else None
    edges = []
    for j in range(returned):
        source = index_of.get(int(sources[j]))
        target = index_of.get(int(targets[j]))
        if source is None or target is None:
            raise ExportError(f"cannot export {where}: edge {j} joins a node outside the graph")
        datum = data[j] if data else None
        if datum is None:
            edges.append(edge_message(source, target))
        else:
            edges.append(
                edge_message(
                    source, target, int(datum.from_port), int(datum.to_port), int(datum.type)
                )
            )
    return edges


def _node_type_name(cu: Any, node: Any, label: str, index: int) -> str:
    try:
        (node_type,) = _call(
            cu, cu.cuGraphNodeGetType(node), "cuGraphNodeGetType", _node_at(label, index)
        )
    except ValueError:  # a type these bindings do not know
        return "UNKNOWN"
    return str(node_type.name)


def _pointer_predicate(cu: Any, label: str) -> Callable[[int], bool]:
    """Whether a value lies in any CUDA allocation this process knows (device, VMM or
    registered host memory). A lookup that fails means "not a pointer"; a failure of
    the driver itself (no context, deinitialized) is an ExportError, never a pass."""
    fatal = {
        cu.CUresult.CUDA_ERROR_NOT_INITIALIZED,
        cu.CUresult.CUDA_ERROR_DEINITIALIZED,
        cu.CUresult.CUDA_ERROR_INVALID_CONTEXT,
        cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,
    }
    range_start = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    cache: dict[int, bool] = {}

    def settled(err: Any, value: int) -> bool:
        if err in fatal:
            raise ExportError(
                f"cannot export graph {label}: looking up {value:#x} failed with "
                f"{_error_name(cu, err)}, so parameter pointers cannot be checked"
            )
        return err == cu.CUresult.CUDA_SUCCESS

    def is_device_pointer(value: int) -> bool:
        if not LOWEST_ADDRESS <= value < ADDRESS_LIMIT:
            return False  # never a mapped user-space address: skip the driver
        known = cache.get(value)
        if known is not None:
            return known
        try:
            found = settled(cu.cuPointerGetAttribute(range_start, cu.CUdeviceptr(value))[0], value)
        except ExportError:
            raise
        except Exception:  # the attribute's binding itself failed: use the other lookup
            found = False
        if not found:
            found = settled(cu.cuMemGetAddressRange(cu.CUdeviceptr(value))[0], value)
        cache[value] = found
        return found

    return is_device_pointer


def _kernel_launch(
    cu: Any, node: Any, recorder: ImageRecorder, label: str, index: int
) -> KernelLaunch:
    where = _node_at(label, index)
    (params,) = _call(cu, cu.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams", where)
    func = _function_handle(cu, params, where)
    name = _function_name(cu, func, where)
    sha = recorder.image_of_function(func)
    if sha is None:
        defining = recorder.images_defining(name)
        detail = (
            "no recorded image defines it: start the ImageRecorder before the process "
            "loads its first CUDA kernel"
            if not defining
            else f"{len(defining)} recorded images define this name and its module was "
            "not traced to one of them"
        )
        raise node_refusal(label, index, f"kernel {name}: image not recorded ({detail})")
    layout = _param_layout(cu, func)
    kernel_params, extra = int(params.kernelParams), int(params.extra)
    try:
        if kernel_params:
            if layout is None:
                raise ValueError("the driver cannot describe its parameters (cuFuncGetParamInfo)")
            blob = layout_params(_read_kernel_params(kernel_params, layout), layout)
        elif extra:
            blob = _read_extra(extra)
            check_layout_fits(len(blob), layout or ())
        elif layout:
            raise ValueError(f"the node holds no parameters, the kernel takes {len(layout)}")
        else:
            blob = b""
    except ValueError as error:
        raise node_refusal(label, index, f"kernel {name}: {error}") from error
    cluster, policy, cooperative = _launch_attributes(cu, node, where)
    if cooperative:
        raise node_refusal(label, index, f"kernel {name}: cooperative launch is not exported")
    layout = layout or []
    return KernelLaunch(
        image_sha256=sha,
        function=name,
        grid=(int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ)),
        block=(int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ)),
        dynamic_shared_bytes=int(params.sharedMemBytes),
        params=blob,
        param_offsets=tuple(offset for offset, _ in layout),
        param_sizes=tuple(size for _, size in layout),
        params_from_extra=not kernel_params and bool(extra),
        cluster=cluster,
        cluster_scheduling_policy=policy,
        max_dynamic_shared_bytes=_function_attribute(
            cu, func, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", where
        ),
        non_portable_cluster_size_allowed=bool(
            _function_attribute(
                cu, func, "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", where
            )
        ),
    )


def _function_handle(cu: Any, params: Any, where: str) -> int:
    """The node's CUfunction; a node launched through a context-independent CUkernel
    may carry only that, which resolves to the current context's function."""
    func = int(params.func)
    if func:
        return func
    kernel = int(getattr(params, "kern", 0) or 0)
    if kernel:
        (function,) = _call(
            cu, cu.cuKernelGetFunction(cu.CUkernel(kernel)), "cuKernelGetFunction", where
        )
        return int(function)
    raise ExportError(f"cannot export {where}: kernel node has no function handle")


def _function_name(cu: Any, func: int, where: str) -> str:
    (name,) = _call(cu, cu.cuFuncGetName(cu.CUfunction(func)), "cuFuncGetName", where)
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _param_layout(cu: Any, func: int) -> list[tuple[int, int]] | None:
    """(offset, size) of each parameter in the device-side layout; None when the driver
    cannot tell (cuFuncGetParamInfo unsupported)."""
    function = cu.CUfunction(func)
    success = cu.CUresult.CUDA_SUCCESS
    count = None
    get_count = getattr(cu, "cuFuncGetParamCount", None)
    if get_count is not None:
        try:
            err, value = get_count(function)
        except RuntimeError:
            # The binding exists but the driver predates the entry point (580 has no
            # cuFuncGetParamCount): probe cuFuncGetParamInfo until it runs out.
            err, value = None, 0
        if err == success:
            count = int(value)
    layout: list[tuple[int, int]] = []
    for i in range(MAX_PARAMS if count is None else count):
        err, offset, size = cu.cuFuncGetParamInfo(function, i)
        if err != success:
            if count is not None or (i == 0 and err != cu.CUresult.CUDA_ERROR_INVALID_VALUE):
                return None
            break
        layout.append((int(offset), int(size)))
    return layout


def _read_kernel_params(address: int, layout: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each value a kernelParams array points at (memory the node owns)."""
    import ctypes

    pointers = (ctypes.c_void_p * len(layout)).from_address(address)
    values = []
    for i, (_, size) in enumerate(layout):
        pointer = pointers[i]
        if not pointer:
            raise ValueError(f"parameter {i} has a null value pointer")
        values.append(ctypes.string_at(pointer, size))
    return values


def _read_extra(address: int) -> bytes:
    """The one parameter block an ``extra`` array passes (CU_LAUNCH_PARAM_BUFFER_*)."""
    import ctypes

    entries: list[int] = []
    for i in range(MAX_EXTRA_ENTRIES):
        entries.append(ctypes.c_void_p.from_address(address + WORD_BYTES * i).value or 0)
        if i % 2 == 0 and entries[-1] == EXTRA_END:
            break
    buffer, size_address = parse_extra(entries)
    size = ctypes.c_size_t.from_address(size_address).value
    if size > MAX_PARAM_BYTES:
        raise ValueError(f"extra block of {size} bytes exceeds the kernel parameter limit")
    return ctypes.string_at(buffer, size)


def _launch_attributes(cu: Any, node: Any, where: str) -> tuple[Dim, int, bool]:
    """Cluster dimension and scheduling policy (cuBLAS launches clusters through the
    node attribute, and its kernels execute cluster barriers: a rebuild without the
    cluster faults with an illegal instruction), and whether it is cooperative.

    The values are read as the bytes of the driver's ``CUlaunchAttributeValue`` union,
    not through the binding's member accessors: cuda-bindings 13.3 reports
    ``clusterDim`` as (1, 0, 0) for every node, clusters of (2, 4, 1) included."""
    cluster = _attribute_words(cu, node, ATTRIBUTE_CLUSTER_DIMENSION, 3, where)
    (policy,) = _attribute_words(cu, node, ATTRIBUTE_CLUSTER_SCHEDULING_POLICY, 1, where)
    try:
        (cooperative,) = _attribute_words(cu, node, ATTRIBUTE_COOPERATIVE, 1, where)
    except ExportError:  # not queryable on this driver: nothing requested it
        cooperative = 0
    try:
        dims = normalize_cluster((cluster[0], cluster[1], cluster[2]))
    except ValueError as error:
        raise ExportError(f"cannot export {where}: {error}") from error
    return dims, policy, bool(cooperative)


def normalize_cluster(dims: Dim) -> Dim:
    """The manifest's cluster dimension: (0, 0, 0) unless the launch asked for a cluster
    of more than one block. A launch without clusters reads (0, 0, 0) or (1, 1, 1),
    and a loader must not set either; a partly-zero dimension is not a launch shape."""
    if dims in ((0, 0, 0), (1, 1, 1)):
        return (0, 0, 0)
    if 0 in dims:
        raise ValueError(f"cluster dimension {dims} has a zero axis")
    return dims


def _attribute_words(cu: Any, node: Any, attribute: int, count: int, where: str) -> Dim:
    """The first ``count`` 32-bit words of a kernel node's launch attribute value."""
    import ctypes

    value = _node_attribute(cu, node, attribute, where)
    raw = ctypes.string_at(int(value.getPtr()), 4 * count)
    return struct.unpack(f"<{count}I", raw)  # type: ignore[return-value]


def _node_attribute(cu: Any, node: Any, attribute: int, where: str) -> Any:
    attribute_id = cu.CUkernelNodeAttrID(attribute)
    (value,) = _call(
        cu,
        cu.cuGraphKernelNodeGetAttribute(node, attribute_id),
        f"cuGraphKernelNodeGetAttribute({attribute_id.name})",
        where,
    )
    return value


def _function_attribute(cu: Any, func: int, name: str, where: str) -> int:
    """A function attribute the loader must set again on its freshly loaded function
    (a launch with more than 48 KiB of dynamic shared memory, or a cluster above the
    portable size, fails without it)."""
    attribute = getattr(cu.CUfunction_attribute, name)
    (value,) = _call(
        cu,
        cu.cuFuncGetAttribute(attribute, cu.CUfunction(func)),
        f"cuFuncGetAttribute({name})",
        where,
    )
    return int(value)


def _memset(cu: Any, node: Any, label: str, index: int) -> Memset:
    (params,) = _call(
        cu,
        cu.cuGraphMemsetNodeGetParams(node),
        "cuGraphMemsetNodeGetParams",
        _node_at(label, index),
    )
    return Memset(
        dst=int(params.dst),
        pitch=int(params.pitch),
        value=int(params.value),
        element_size=int(params.elementSize),
        width=int(params.width),
        height=int(params.height),
    )


def _memory_type(read: Callable[[], Any]) -> int:
    try:
        return int(read())
    except ValueError:  # a value the bindings' enum does not know (0 when unset)
        return 0


def _memcpy(cu: Any, node: Any, label: str, index: int) -> Copy3D:
    (params,) = _call(
        cu,
        cu.cuGraphMemcpyNodeGetParams(node),
        "cuGraphMemcpyNodeGetParams",
        _node_at(label, index),
    )
    return Copy3D(
        src_type=_memory_type(lambda: params.srcMemoryType),
        dst_type=_memory_type(lambda: params.dstMemoryType),
        src_device=int(params.srcDevice),
        dst_device=int(params.dstDevice),
        width=int(params.WidthInBytes),
        height=int(params.Height),
        depth=int(params.Depth),
        src_offset=(int(params.srcXInBytes), int(params.srcY), int(params.srcZ)),
        dst_offset=(int(params.dstXInBytes), int(params.dstY), int(params.dstZ)),
        src_lod=int(params.srcLOD),
        dst_lod=int(params.dstLOD),
    )
