"""``ignition prepare MODEL --out CORE``: prepare inside the fixed-address window and
export the runtime core.

Order: CUPTI starts recording module images before this process runs any CUDA
kernel; the window opens; preparation allocates each kind of storage in its region
and everything else (compile temporaries, library workspaces, graph pools) in the
scratch region; the prepared model is reset and its buffers' initial contents are
taken; the qualification workload is recorded through the graphs; every graph is
walked; the export refuses allocations outside the window; the core is written and
the prepared model is closed.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch

from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import write_core_dir
from ignition.export.cupti import ImageRecorder
from ignition.export.graph_walk import ExportError, walk_graph
from ignition.export.manifest import (
    ABI_VERSION,
    ENGINE_VERSION,
    GRAPH_KINDS,
    REGION_OF_ROLE,
    buffer_message,
    contract_message,
    frontend_message,
    named_buffers,
)
from ignition.export.qualification import (
    QualificationRecorder,
    replay_qualification,
    run_workload,
)
from ignition.export.window import REGION_KINDS, WindowPlacement
from ignition.parallel.shard import TensorParallel
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.preparation.progress import console, phase


@dataclass
class ExportReport:
    core: Path
    graphs: int = 0
    nodes: int = 0
    images: int = 0
    image_bytes: int = 0
    buffers: int = 0
    initial_bytes: int = 0
    qualification_steps: int = 0
    regions: dict[str, dict[str, int]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # The Python replay floor of the decode graphs, to compare `flare replay
    # --bench-decode` with: capacity -> median and p99 step time in ms.
    python_decode_floor: dict[int, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> str:
        data = self.__dict__ | {"core": str(self.core)}
        return json.dumps(data, indent=1)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _identity(prepared: PreparedModel, device: int) -> pb.Identity:
    props = torch.cuda.get_device_properties(device)
    cuda = torch.version.cuda or "0.0"
    major, minor = (int(part) for part in cuda.split(".")[:2])
    config = prepared.model.config.to_json_string(use_diff=False)
    tokenizer = prepared.tokenizer.backend_tokenizer.to_str()
    return pb.Identity(
        engine_version=ENGINE_VERSION,
        recipe=prepared.recipe,
        checkpoint_fingerprint=prepared.fingerprint,
        config_fingerprint=_sha256_text(config),
        tokenizer_fingerprint=_sha256_text(tokenizer),
        device_name=props.name,
        compute_capability_major=props.major,
        compute_capability_minor=props.minor,
        sm_count=props.multi_processor_count,
        driver_version=_driver_version(),
        cuda_version=major * 1000 + minor * 10,
    )


def _driver_version() -> int:
    from cuda.bindings import driver as cu

    err, version = cu.cuDriverGetVersion()
    return int(version) if err == cu.CUresult.CUDA_SUCCESS else 0


def buffer_views(
    prepared: PreparedModel, window: WindowPlacement, initial_contents: bool = True
) -> tuple[list[pb.Buffer], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Buffer views at their window offsets, initial contents (after reset; the
    weights as the device tensors themselves, the rest copied to the host; none with
    ``initial_contents=False``), and the tensors by manifest name.
    Refuses a buffer outside its role's region."""
    regions = {REGION_KINDS[u.name]: u for u in window.usage()}
    messages, initial, tensors = [], {}, {}
    for name, role, tensor in named_buffers(prepared):
        if not tensor.is_contiguous():
            raise ExportError(f"cannot export buffer {name}: it is not contiguous")
        offset = tensor.data_ptr() - window.base
        message = buffer_message(name, role, tensor, offset)
        region = regions[REGION_OF_ROLE[role]]
        if (
            not region.offset
            <= offset
            <= offset + message.size_bytes
            <= (region.offset + region.mapped)
        ):
            raise ExportError(
                f"cannot export buffer {name}: {message.size_bytes} bytes at window offset "
                f"{offset:#x} lie outside its region {region.name} "
                f"[{region.offset:#x}, {region.offset + region.mapped:#x})"
            )
        messages.append(message)
        tensors[name] = tensor
        if message.initial_tensor and initial_contents:
            # Weights are read-only: they are written from the device when the core
            # is (no host copy of them all). State changes from here on, so its
            # initial contents are copied now.
            weight = role == pb.BUFFER_ROLE_WEIGHT
            initial[name] = tensor.detach() if weight else tensor.detach().cpu()
    return messages, initial, tensors


def window_core(
    prepared: PreparedModel,
    window: WindowPlacement,
    device: int,
    buffers: list[pb.Buffer],
    graphs: list[pb.Graph],
    images: dict[str, bytes] | None = None,
    qualification: pb.Qualification | None = None,
) -> pb.Core:
    """The manifest of ``prepared`` in ``window``: identity, the window's regions as
    backed now, buffers, kernel images, graphs, contract and frontend."""
    return pb.Core(
        abi_version=ABI_VERSION,
        identity=_identity(prepared, device),
        window=pb.Window(
            base=window.base,
            size=window.size,
            regions=[
                pb.Region(
                    kind=REGION_KINDS[u.name],
                    offset=u.offset,
                    size=u.capacity,
                    backed_bytes=u.mapped,
                )
                for u in window.usage()
            ],
        ),
        buffers=buffers,
        images=[pb.KernelImage(sha256=d, size_bytes=len(b)) for d, b in (images or {}).items()],
        graphs=graphs,
        contract=contract_message(prepared),
        frontend=frontend_message(prepared),
        qualification=qualification,
    )


def decode_floor(prepared: PreparedModel, capacity: int, steps: int = 256) -> dict[str, float]:
    """Per step: launch the decode graph, synchronize, read the completion records to
    the host (what the harness does, and what `flare replay --bench-decode` does)."""
    key = GraphKey(GraphKind.DECODE, capacity)
    completions = prepared.storage.staging.completions
    times = []
    for _ in range(steps + 8):
        start = time.perf_counter()
        prepared.execute(key)
        completions.cpu()
        times.append((time.perf_counter() - start) * 1000)
    times = sorted(times[8:])
    return {
        "steps": steps,
        "median_ms": statistics.median(times),
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
    }


class RankGroupSetup(Protocol):
    """One rank's part in a tensor-parallel export
    (``ignition.parallel.export_ranks.RankSetup``)."""

    rank: int

    @property
    def collectives_bytes(self) -> int:
        """Bytes of the rank's collectives region."""
        ...

    def attach(self, window: WindowPlacement) -> tuple[TensorParallel, list[tuple[int, int]]]:
        """The rank's collectives over its window's region and its peer's, and the
        peer's region as the graph walk's ``peers``."""
        ...

    def close(self) -> None:
        """Unmaps what ``attach`` mapped outside the window."""
        ...


def export_core(
    model: Path,
    options: PrepareOptions,
    out: Path,
    device: int = 0,
    after_export: Callable[[PreparedModel], None] | None = None,
    group: RankGroupSetup | None = None,
) -> ExportReport:
    """Prepare ``model`` in the window and write its runtime core to ``out``.

    ``after_export``, when given, runs once the core is written, with the prepared
    model reset to its initial state: the Python harness answering prompts over the
    very graphs exported, without a second preparation (timed as ``after_export_s``).

    ``group``: this process is one rank of a tensor-parallel group
    (``ignition.parallel.export_ranks``): its window opens at the rank's base with a
    collectives region, the group's collectives are attached over it, and the graph
    walk accepts pointers into the peer's region.
    """
    if torch.cuda.is_initialized():
        raise ExportError(
            "CUDA is already initialized in this process: an export must record every "
            "kernel image from the start, so run it in a fresh process"
        )
    report = ExportReport(core=out)
    t0 = time.perf_counter()
    recorder = ImageRecorder()
    recorder.start()
    try:
        if group is None:
            window = WindowPlacement.open(device)
        else:
            window = WindowPlacement.open(
                device, collectives_bytes=group.collectives_bytes, rank=group.rank
            )
    except BaseException:
        recorder.stop()
        raise
    prepared: PreparedModel | None = None
    peers: Sequence[tuple[int, int]] = ()
    try:
        # Torch's work goes where the window is ("cuda" is the current device).
        torch.cuda.set_device(device)
        if group is not None:
            parallel, peers = group.attach(window)
            options = replace(options, parallel=parallel)
        with window.region("scratch"):
            options = replace(options, keep_graphs=True, capture=True, device="cuda")
            prepared = prepare(model, options, placement=window)
            report.timings["prepare_s"] = time.perf_counter() - t0
            # Warm-up, compilation and capture of every graph, within prepare_s.
            if "compile_capture_s" in prepared.timings:
                report.timings["compile_capture_s"] = prepared.timings["compile_capture_s"]
            keys = prepared.catalog.keys()
            prepared.reset()
            torch.cuda.synchronize()
            buffers, initial, tensors = buffer_views(prepared, window)

            t1 = time.perf_counter()
            qualifier = QualificationRecorder(
                prepared, tensors, {key: i for i, key in enumerate(keys)}
            )
            with console.status("recording the qualification sequence"):
                run_workload(prepared, qualifier.execute)
            qualification = qualifier.finish()
            # The sequence must reproduce in this process before another may check it.
            mismatches = replay_qualification(prepared, qualification, tensors, keys)
            if mismatches:
                raise ExportError(
                    f"the qualification sequence does not reproduce in-process: "
                    f"{len(mismatches)} digests differ, first {mismatches[0]}"
                )
            used = {step.graph for step in qualification.steps}
            unused = [str(key) for i, key in enumerate(keys) if i not in used]
            if unused:
                raise ExportError(f"the qualification workload never ran {', '.join(unused)}")
            report.timings["qualification_s"] = time.perf_counter() - t1

            t2 = time.perf_counter()
            span = (window.base, window.size)
            graphs = []
            with phase("walking graphs", len(keys)) as advance:
                for key in keys:
                    raw = prepared.graphs[key].raw_cuda_graph()
                    graphs.append(
                        walk_graph(raw, recorder, span, GRAPH_KINDS[key.kind], key.capacity, peers)
                    )
                    advance(1)
            report.timings["walk_s"] = time.perf_counter() - t2
            # After the self-check the decode slots of its last step are packed.
            for capacity in sorted({min(prepared.catalog.decode), max(prepared.catalog.decode)}):
                report.python_decode_floor[capacity] = decode_floor(prepared, capacity)
            window.check_clean()

            wanted = {
                n.kernel.image_sha256 for g in graphs for n in g.nodes if n.HasField("kernel")
            }
            recorded = recorder.images()
            images = {digest: recorded[digest] for digest in sorted(wanted)}
            usage = window.usage()
            core = window_core(prepared, window, device, buffers, graphs, images, qualification)
            t3 = time.perf_counter()
            with console.status(f"writing {out}"):
                write_core_dir(out, core, initial, images)
            written = time.perf_counter()
            report.timings["write_s"] = written - t3
            if after_export is not None:
                prepared.reset()
                after_export(prepared)
                torch.cuda.synchronize()
                window.check_clean()
                report.timings["after_export_s"] = time.perf_counter() - written
        report.graphs = len(graphs)
        report.nodes = sum(len(g.nodes) for g in graphs)
        report.images = len(images)
        report.image_bytes = sum(len(b) for b in images.values())
        report.buffers = len(buffers)
        report.initial_bytes = sum(t.numel() * t.element_size() for t in initial.values())
        report.qualification_steps = len(qualification.steps)
        report.regions = {
            u.name: {"offset": u.offset, "capacity": u.capacity, "backed": u.mapped} for u in usage
        }
        report.timings["export_s"] = written - t0
        return report
    finally:
        try:
            if prepared is not None:
                prepared.close()
            del prepared
            if group is not None:
                group.close()
        finally:
            try:
                window.close()
            finally:
                recorder.stop()
