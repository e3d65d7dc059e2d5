"""Record every kernel image the CUDA driver loads, through CUPTI's resource callbacks.

A runtime core must carry the exact binary of every kernel its graphs launch, and no
single file on disk holds them all: cuBLAS keeps its GEMM kernels in a private
resource section, Inductor's cubins live in a cache that autotuning fills with
several binaries of one name, and ATen's kernels sit inside fat binaries of
hundreds of MiB. The driver, though, sees each module image when it loads it, and
CUPTI's ``MODULE_LOADED`` resource callback hands that image over. The recorder
copies each one out of the callback (CUPTI owns the memory only for the call) and
keys it by its SHA-256, so identical images loaded twice are stored once and two
different images that define the same kernel name stay apart.

Lazy loading (the default since CUDA 12.2) loads a module when its first kernel is
used, so ``start()`` must run before the first kernel of every library the graphs
use, in practice before any CUDA work in the process.

Tracing a kernel back to its image: CUPTI reports an image with an id of its own,
never the driver's ``CUmodule``. The recorder therefore also watches the few driver
calls that create or resolve modules and functions (``cuModuleLoad*``,
``cuModuleGetFunction``, ``cuLibraryGetModule``, ``cuKernelGetFunction``): an image
loaded on a thread while exactly one such call is open there belongs to the handle
that call returns. Modules loaded inside other calls (the CUDA runtime's lazily
loaded kernels, for one) are traced by name instead, and only when exactly one
recorded image defines that name; anything else is reported as unknown, never
guessed, so the exporter refuses rather than ship the wrong binary.

The module imports nothing CUDA-specific at import time: the exporter and the tests
import it on machines without a GPU, where ``start()`` raises ``ExportError``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ignition.export.graph_walk import ExportError

# CUPTI ABI constants (cupti_callbacks.h, cupti_driver_cbid.h, cupti_result.h).
DOMAIN_DRIVER_API = 1
DOMAIN_RESOURCE = 3
CBID_RESOURCE_MODULE_LOADED = 6
API_ENTER = 0
API_EXIT = 1
CUPTI_SUCCESS = 0
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS = 39
CUDA_SUCCESS = 0

# Driver calls whose exit tells which handle an image loaded during the call belongs
# to, and where in the call's parameter struct (generated_cuda_meta.h) that handle is.
CBID_MODULE_LOAD = 18  # cuModuleLoad(CUmodule *module, ...)
CBID_MODULE_LOAD_DATA = 19  # cuModuleLoadData(CUmodule *module, ...)
CBID_MODULE_LOAD_DATA_EX = 20  # cuModuleLoadDataEx(CUmodule *module, ...)
CBID_MODULE_LOAD_FAT_BINARY = 21  # cuModuleLoadFatBinary(CUmodule *module, ...)
CBID_MODULE_GET_FUNCTION = 23  # cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, ...)
CBID_LIBRARY_GET_MODULE = 682  # cuLibraryGetModule(CUmodule *pMod, ...)
CBID_KERNEL_GET_FUNCTION = 683  # cuKernelGetFunction(CUfunction *pFunc, ...)
MODULE_OUT_CALLS = (
    CBID_MODULE_LOAD,
    CBID_MODULE_LOAD_DATA,
    CBID_MODULE_LOAD_DATA_EX,
    CBID_MODULE_LOAD_FAT_BINARY,
    CBID_LIBRARY_GET_MODULE,
)
TRACED_CALLS = (*MODULE_OUT_CALLS, CBID_MODULE_GET_FUNCTION, CBID_KERNEL_GET_FUNCTION)

# Field offsets on LP64. CUpti_ResourceData {CUcontext; union {CUstream}; void *desc}.
RESOURCE_DESCRIPTOR = 16
# CUpti_ModuleResourceData {uint32_t moduleId; size_t cubinSize; const char *pCubin}.
MODULE_CUBIN_SIZE = 8
MODULE_CUBIN = 16
# CUpti_CallbackData {site; functionName; functionParams; functionReturnValue; ...}.
CALLBACK_SITE = 0
CALLBACK_PARAMS = 16
CALLBACK_RETURN_VALUE = 24

# ELF constants used to list the functions an image defines.
_ELF_MAGIC = b"\x7fELF"
_SHT_SYMTAB = 2
_STT_FUNC = 2


# ---------------------------------------------------------------- pure helpers


def elf_function_names(image: bytes) -> frozenset[str] | None:
    """Names of the functions an ELF image (a cubin) defines; None when the image is
    not a 64-bit little-endian ELF or is malformed. Used to trace a kernel to its image
    by name when no driver handle was seen for it."""
    try:
        return _elf_function_names(image)
    except (struct.error, IndexError, ValueError):
        return None


def _elf_function_names(image: bytes) -> frozenset[str] | None:
    if len(image) < 64 or image[:4] != _ELF_MAGIC or image[4] != 2 or image[5] != 1:
        return None
    section_offset = struct.unpack_from("<Q", image, 0x28)[0]
    entry_size, count = struct.unpack_from("<HH", image, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", image, section_offset + i * entry_size)
        for i in range(count)
    ]
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != _SHT_SYMTAB or symbol_size < 24:
            continue
        strings = sections[link][4]
        for start in range(offset, offset + size - 23, symbol_size):
            name_offset, info, _, section_index = struct.unpack_from("<IBBH", image, start)
            if info & 0xF != _STT_FUNC or section_index == 0:
                continue
            begin = strings + name_offset
            end = image.index(b"\0", begin)
            names.add(image[begin:end].decode("utf-8", "replace"))
    return frozenset(names)


def resolve_image(
    name: str | None,
    traced: Sequence[str | None],
    symbols: Mapping[str, frozenset[str] | None],
) -> str | None:
    """The image a function comes from, or None when it cannot be told for sure.

    ``traced`` lists the images the function's handles were traced to (its function
    handle first, then its module handle); one is trusted unless its symbols are known
    and lack ``name``, which would mean the trace went wrong. Without a trusted trace,
    the name decides only if exactly one recorded image defines it: autotuned Triton
    kernels share names across images, and picking one of several would ship a binary
    that computes something else."""
    for sha in traced:
        if sha is None:
            continue
        defined = symbols.get(sha)
        if defined is None or name is None or name in defined:
            return sha
    if name is None:
        return None
    candidates = [sha for sha, defined in symbols.items() if defined and name in defined]
    return candidates[0] if len(candidates) == 1 else None


@dataclass
class _Open:
    """One traced driver call open on a thread, and the images loaded during it."""

    cbid: int
    images: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- locating CUPTI


def _mapped_cupti() -> Path | None:
    """A libcupti already loaded into this process (PyTorch's profiler links one):
    loading a second copy next to it would give two CUPTI instances."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if path.startswith("/") and os.path.basename(path).startswith("libcupti.so"):
                    return Path(path)
    except OSError:
        return None
    return None


def _candidate_dirs() -> list[Path]:
    """Directories that may hold libcupti: the ``nvidia`` wheels (``cu13/lib`` for
    CUDA 13, ``cuda_cupti/lib`` for CUDA 12), then a CUDA toolkit's ``extras/CUPTI``."""
    dirs: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            dirs.extend(sorted(Path(root).glob("*/lib")))
    toolkits = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for toolkit in dict.fromkeys(t for t in toolkits if t):
        dirs.append(Path(toolkit) / "extras" / "CUPTI" / "lib64")
        dirs.append(Path(toolkit) / "lib64")
    return dirs


def locate_cupti(explicit: str | Path | None = None) -> Path:
    """The libcupti to load: ``explicit`` if given, else one already in the process,
    else the first found in the nvidia wheels or a CUDA toolkit."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ExportError(f"CUPTI library {path} (given to ImageRecorder) does not exist")
        return path
    mapped = _mapped_cupti()
    if mapped is not None:
        return mapped
    dirs = _candidate_dirs()
    for directory in dirs:
        found = sorted(directory.glob("libcupti.so*")) if directory.is_dir() else []
        if found:
            return found[0]
    searched = ", ".join(str(d) for d in dirs) or "(no nvidia wheels, no CUDA toolkit)"
    raise ExportError(
        "libcupti (CUPTI) not found: it is not loaded in this process and none of "
        f"{searched} holds it; install the nvidia-cuda-cupti wheel matching torch's CUDA "
        "or a CUDA toolkit with extras/CUPTI, or pass ImageRecorder(library=PATH)"
    )


# ---------------------------------------------------------------- memory access


def _pointer(address: int) -> int:
    import ctypes

    return ctypes.c_void_p.from_address(address).value or 0


def _u32(address: int) -> int:
    import ctypes

    return ctypes.c_uint32.from_address(address).value


def _i32(address: int) -> int:
    import ctypes

    return ctypes.c_int32.from_address(address).value


def _size(address: int) -> int:
    import ctypes

    return ctypes.c_size_t.from_address(address).value


def _bytes(address: int, size: int) -> bytes:
    import ctypes

    return ctypes.string_at(address, size)


# ---------------------------------------------------------------- driver queries


def _function_module(func_handle: int) -> int | None:
    """cuFuncGetModule: the CUmodule a function belongs to, or None."""
    from cuda.bindings import driver as cu

    err, module = cu.cuFuncGetModule(cu.CUfunction(func_handle))
    return int(module) if err == cu.CUresult.CUDA_SUCCESS else None


def _function_name(func_handle: int) -> str | None:
    """cuFuncGetName: the (mangled) function name, or None."""
    from cuda.bindings import driver as cu

    err, name = cu.cuFuncGetName(cu.CUfunction(func_handle))
    if err != cu.CUresult.CUDA_SUCCESS:
        return None
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


# ---------------------------------------------------------------- the recorder


class ImageRecorder:
    """Keeps every module image the driver loads while started, deduplicated by SHA-256,
    and traces kernel functions back to the image they were loaded from.

    Start it before the process runs its first CUDA kernel (see the module docstring);
    CUPTI allows one subscriber per process, so the PyTorch profiler or Nsight cannot
    run at the same time."""

    def __init__(self, library: str | Path | None = None) -> None:
        self._library_path = library
        self._lock = threading.RLock()
        self._images: dict[str, bytes] = {}
        self._symbols: dict[str, frozenset[str] | None] = {}
        self._module_sha: dict[int, str] = {}
        self._function_sha: dict[int, str] = {}
        self._open: dict[int, list[_Open]] = {}
        self._errors: list[str] = []
        self._notes: list[str] = []
        self._cupti: Any = None
        self._subscriber: Any = None
        self._callback: Any = None

    # -------------------------------------------------------------- lifecycle

    @property
    def active(self) -> bool:
        return self._subscriber is not None

    def start(self) -> None:
        """Subscribe to CUPTI; from now on every loaded module image is kept. Raises
        ExportError when CUPTI or the NVIDIA driver is missing or CUPTI refuses."""
        if self.active:
            return
        import ctypes

        path = locate_cupti(self._library_path)
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise ExportError(
                f"NVIDIA driver library libcuda.so.1 could not be loaded ({error}): CUPTI "
                "records kernel images only on a machine with an NVIDIA GPU and driver"
            ) from error
        try:
            cupti = ctypes.CDLL(str(path))
        except OSError as error:
            raise ExportError(f"could not load CUPTI from {path}: {error}") from error
        callback_type = ctypes.CFUNCTYPE(
            None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p
        )
        cupti.cuptiSubscribe.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            callback_type,
            ctypes.c_void_p,
        ]
        cupti.cuptiSubscribe.restype = ctypes.c_int
        cupti.cuptiEnableCallback.argtypes = [
            ctypes.c_uint32,
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_uint32,
        ]
        cupti.cuptiEnableCallback.restype = ctypes.c_int
        cupti.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        cupti.cuptiUnsubscribe.restype = ctypes.c_int
        cupti.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        cupti.cuptiGetResultString.restype = ctypes.c_int

        def describe(result: int) -> str:
            text = ctypes.c_char_p()
            if cupti.cuptiGetResultString(result, ctypes.byref(text)) == CUPTI_SUCCESS:
                return f"{(text.value or b'').decode()} ({result})"
            return f"CUPTI error {result}"

        callback = callback_type(self._entry)
        subscriber = ctypes.c_void_p()
        result = cupti.cuptiSubscribe(ctypes.byref(subscriber), callback, None)
        if result != CUPTI_SUCCESS:
            hint = (
                "another CUPTI subscriber is active (the PyTorch profiler, Nsight, or "
                "another ImageRecorder): stop it first"
                if result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS
                else "is an NVIDIA driver matching this CUPTI installed?"
            )
            raise ExportError(f"cuptiSubscribe failed with {describe(result)} ({path}): {hint}")
        result = cupti.cuptiEnableCallback(
            1, subscriber, DOMAIN_RESOURCE, CBID_RESOURCE_MODULE_LOADED
        )
        if result != CUPTI_SUCCESS:
            cupti.cuptiUnsubscribe(subscriber)
            raise ExportError(
                f"cuptiEnableCallback(RESOURCE, MODULE_LOADED) failed with {describe(result)} "
                f"({path})"
            )
        for cbid in TRACED_CALLS:
            result = cupti.cuptiEnableCallback(1, subscriber, DOMAIN_DRIVER_API, cbid)
            if result != CUPTI_SUCCESS:
                # Not fatal: kernels of such modules are then traced by name only.
                self._notes.append(f"driver callback {cbid} not enabled: {describe(result)}")
        self._cupti, self._subscriber, self._callback = cupti, subscriber, callback

    def stop(self) -> None:
        """Unsubscribe; the recorded images and handle maps stay available."""
        if self._subscriber is None:
            return
        self._cupti.cuptiUnsubscribe(self._subscriber)
        self._subscriber = None
        # The ctypes callback object stays referenced: a call already in flight on
        # another thread must not land in freed trampoline memory.

    def __enter__(self) -> ImageRecorder:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -------------------------------------------------------------- results

    def images(self) -> dict[str, bytes]:
        """Every recorded image by SHA-256 (hex)."""
        with self._lock:
            return dict(self._images)

    @property
    def errors(self) -> list[str]:
        """Exceptions caught inside callbacks (they must never propagate into the driver)."""
        with self._lock:
            return list(self._errors)

    @property
    def notes(self) -> list[str]:
        """Non-fatal setup notes, such as a driver callback CUPTI would not enable."""
        return list(self._notes)

    def images_defining(self, name: str) -> list[str]:
        """SHA-256 of every recorded ELF image that defines a function ``name``."""
        return sorted(sha for sha, names in self._all_symbols().items() if names and name in names)

    def image_of_function(self, func_handle: int) -> str | None:
        """SHA-256 of the image the driver function ``func_handle`` was loaded from, or
        None when it was not recorded or cannot be told apart from another image."""
        with self._lock:
            by_function = self._function_sha.get(func_handle)
        module = _function_module(func_handle)
        name = _function_name(func_handle)
        with self._lock:
            by_module = self._module_sha.get(module) if module is not None else None
        return resolve_image(name, [by_function, by_module], self._all_symbols())

    def _all_symbols(self) -> dict[str, frozenset[str] | None]:
        with self._lock:
            missing = [sha for sha in self._images if sha not in self._symbols]
            images = {sha: self._images[sha] for sha in missing}
        parsed = {sha: elf_function_names(image) for sha, image in images.items()}
        with self._lock:
            self._symbols.update(parsed)
            return dict(self._symbols)

    # -------------------------------------------------------------- callbacks

    def _entry(self, _userdata: int | None, domain: int, cbid: int, data: int | None) -> None:
        """The CUPTI callback. Nothing may escape into the driver: errors are kept."""
        try:
            if data:
                self._dispatch(domain, cbid, data)
        except Exception as error:
            with self._lock:
                self._errors.append(f"domain {domain} cbid {cbid}: {error!r}")

    def _dispatch(self, domain: int, cbid: int, data: int) -> None:
        if domain == DOMAIN_RESOURCE and cbid == CBID_RESOURCE_MODULE_LOADED:
            descriptor = _pointer(data + RESOURCE_DESCRIPTOR)
            if descriptor:
                size = _size(descriptor + MODULE_CUBIN_SIZE)
                image = _pointer(descriptor + MODULE_CUBIN)
                if image and size:
                    self._record(_bytes(image, size))
        elif domain == DOMAIN_DRIVER_API and cbid in TRACED_CALLS:
            if _u32(data + CALLBACK_SITE) == API_ENTER:
                self._enter(cbid)
            else:
                returned = _pointer(data + CALLBACK_RETURN_VALUE)
                succeeded = bool(returned) and _i32(returned) == CUDA_SUCCESS
                self._exit(cbid, _pointer(data + CALLBACK_PARAMS), succeeded)

    def _record(self, image: bytes) -> str:
        """Keep one loaded image; credit it to every traced call open on this thread."""
        sha = hashlib.sha256(image).hexdigest()
        with self._lock:
            self._images.setdefault(sha, image)
            for call in self._open.get(threading.get_ident(), ()):
                call.images.append(sha)
        return sha

    def _enter(self, cbid: int) -> None:
        with self._lock:
            self._open.setdefault(threading.get_ident(), []).append(_Open(cbid))

    def _exit(self, cbid: int, params: int, succeeded: bool) -> None:
        thread = threading.get_ident()
        with self._lock:
            stack = self._open.get(thread)
            if not stack:
                return
            call = stack.pop()
            if not stack:
                del self._open[thread]
        loaded = set(call.images)
        if not succeeded or not params or len(loaded) != 1:
            return
        sha = loaded.pop()
        modules, functions = _handles_out(cbid, params)
        with self._lock:
            for module in modules:
                self._module_sha[module] = sha
            for function in functions:
                self._function_sha[function] = sha

    # -------------------------------------------------------------- introspection

    def traced_handles(self) -> Iterator[tuple[str, int, str]]:
        """(``module`` or ``function``, handle, sha) for every handle traced so far."""
        with self._lock:
            modules = list(self._module_sha.items())
            functions = list(self._function_sha.items())
        for handle, sha in modules:
            yield "module", handle, sha
        for handle, sha in functions:
            yield "function", handle, sha


def _handles_out(cbid: int, params: int) -> tuple[list[int], list[int]]:
    """The module and function handles a successful traced call produced, read from
    its parameter struct (the out-pointer is always the first field)."""
    out = _pointer(params)
    produced = [_pointer(out)] if out else []
    if cbid in MODULE_OUT_CALLS:
        return [h for h in produced if h], []
    if cbid == CBID_MODULE_GET_FUNCTION:
        module = _pointer(params + 8)
        return ([module] if module else []), [h for h in produced if h]
    if cbid == CBID_KERNEL_GET_FUNCTION:
        return [], [h for h in produced if h]
    return [], []
