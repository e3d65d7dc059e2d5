"""In-process serving through Helios: the design's diagnostic path.

``prepare_model`` prepares a checkpoint inside the Heliopause window (as an export
does, without recording kernel images or a qualification sequence), and
``start_server`` hands the prepared model to Helios in this same process: Helios
borrows the captured graphs' executable handles and the buffers at their window
addresses, serves HTTP on its own threads without the GIL, and keeps the prepared
model alive until the server is closed. Production serving is ``flare run CORE``.

    servable = prepare_model(Path("model.gguf"), PrepareOptions(max_concurrency=4))
    with start_server(servable, ServerConfig(port=0)) as server:
        print(server.address)   # OpenAI/Anthropic HTTP on this address
        server.wait()           # until closed from another thread, or Ctrl-C
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ignition.export import flare_core_pb2 as pb
from ignition.export.exporter import buffer_views, window_core
from ignition.export.manifest import GRAPH_KINDS
from ignition.export.window import WindowPlacement
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare


class ServingError(RuntimeError):
    """The prepared model cannot be handed to Helios."""


@dataclass(frozen=True)
class ServerConfig:
    """How the in-process server listens and admits (``flare run``'s options)."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    model: str = "flare"
    max_body_bytes: int = 4 << 20
    queue_capacity: int = 1024
    prefix_cache: bool = True


class ServablePreparedModel:
    """A prepared model inside the Heliopause window: the owner Helios keeps alive
    while it serves. Consumed by ``start_server``; ``close`` releases it otherwise."""

    def __init__(self, prepared: PreparedModel, window: WindowPlacement, device: int) -> None:
        self.prepared = prepared
        self.window = window
        self.device = device
        self.consumed = False

    def close(self) -> None:
        self.prepared.close()
        self.window.close()


def prepare_model(
    model: Path, options: PrepareOptions | None = None, device: int = 0
) -> ServablePreparedModel:
    """Prepares ``model`` with every allocation in the Heliopause window and its
    graphs instantiated, ready for ``start_server``."""
    options = replace(options or PrepareOptions(), capture=True, device="cuda", keep_graphs=False)
    window = WindowPlacement.open(device)
    try:
        with window.region("scratch"):
            prepared = prepare(model, options, placement=window)
            prepared.reset()
            torch.cuda.synchronize()
        window.check_clean()
    except BaseException:
        window.close()
        raise
    return ServablePreparedModel(prepared, window, device)


def handoff(servable: ServablePreparedModel) -> tuple[bytes, list[int]]:
    """The manifest (graphs by kind and capacity, no nodes) and each graph's
    executable handle, in the same order."""
    prepared = servable.prepared
    buffers, _, _ = buffer_views(prepared, servable.window, initial_contents=False)
    keys = prepared.catalog.keys()
    graphs = [pb.Graph(kind=GRAPH_KINDS[key.kind], capacity=key.capacity) for key in keys]
    execs = [int(prepared.graphs[key].raw_cuda_graph_exec()) for key in keys]
    core = window_core(prepared, servable.window, servable.device, buffers, graphs)
    return core.SerializeToString(), execs


def start_server(servable: ServablePreparedModel, config: ServerConfig | None = None) -> Any:
    """Starts Helios on ``servable`` in this process and returns its
    ``flare_heliopause.ServerHandle`` (``address``, ``wait()``, ``close()``; a
    context manager). The prepared model is consumed: a second handoff is refused."""
    import flare_heliopause as hp

    if servable.consumed:
        raise ServingError("this prepared model was already handed to a server")
    config = config or ServerConfig()
    manifest, execs = handoff(servable)
    torch.cuda.synchronize()
    servable.consumed = True
    return hp.start_server(
        manifest,
        execs,
        servable,
        host=config.host,
        port=config.port,
        api_key=config.api_key,
        model=config.model,
        max_body_bytes=config.max_body_bytes,
        queue_capacity=config.queue_capacity,
        device=servable.device,
        prefix_cache=config.prefix_cache,
    )
