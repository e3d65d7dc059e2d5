"""Preparation: checkpoint -> composed model over fixed storage -> compiled, captured graphs.

Order (the design's, restricted to what a dense recipe needs): validate the
checkpoint and catalog; build the canonical model on the meta device and stream
weights into execution layouts; allocate request state, staging and snapshot rows;
size KV pages from measured free memory; compile complete forwards; warm up and
capture every catalog entry into one graph pool, largest first; reset state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ignition.components.kv_cache import PagedKvCache
from ignition.components.state_transfer import SnapshotRows
from ignition.components.token_state import MAX_STOP_TOKENS, RequestState, StagingInputs
from ignition.loading.mapping import load_weights
from ignition.loading.open import open_checkpoint
from ignition.loading.source import CheckpointError
from ignition.preparation.catalog import Catalog, GraphKey
from ignition.preparation.compile_flags import DEFAULT_DECODE_FUSION, CompileScope, DecodeFusion
from ignition.preparation.memory import GIB, MemoryReport, plan_kv_pages
from ignition.preparation.placement import DefaultPlacement, Placement
from ignition.preparation.progress import console, phase
from ignition.preparation.steps import (
    SamplingOps,
    Storage,
    build_steps,
    decode_forward,
    prefill_forward,
)
from recipes import llama

# Default prefix-checkpoint rows per concurrent request. A request captures at most
# eight checkpoints (the design's budget cap); the pool keeps four times that per
# slot so older turns of long conversations survive for branches (a row costs one KV
# page and one hidden vector: 1.4 MiB for SmolLM2-135M, 9 MiB for Qwen3-8B).
SNAPSHOT_ROWS_PER_SLOT = 32


@dataclass(frozen=True)
class PrepareOptions:
    max_concurrency: int = 4
    prefill_chunk_size: int = 4096
    context_limit: int | None = None
    kv_pages: int | None = None
    # Prefix-checkpoint rows; None: SNAPSHOT_ROWS_PER_SLOT per concurrent request.
    snapshot_rows: int | None = None
    gpu_reserve_gib: float = 2.0
    capture_headroom_gib: float = 2.0
    compile: bool = True
    # What one compiled region holds: "forward", a whole decode or prefill forward
    # (fusions across layers; compile time grows with depth), or "layer", each
    # decoder layer alone (one compilation per shape serves every layer).
    compile_scope: CompileScope = "forward"
    # Compile the sampler and commit (small, independent of the model's size); None:
    # as ``compile``.
    compile_sampling: bool | None = None
    # What decode layers fuse into their projections (``compile_flags.DecodeFusion``):
    # the residual additions by default, the fastest measured.
    decode_fusion: DecodeFusion = DEFAULT_DECODE_FUSION
    # Sampling graphs take a token mask per row (constrained decoding); False
    # exports graphs as before masks existed, to measure what the input costs.
    token_masks: bool = True
    capture: bool = True
    # Keep each captured cudaGraph_t (an export walks them); they instantiate on use.
    keep_graphs: bool = False
    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16


def snapshot_rows(options: PrepareOptions) -> int:
    """The prefix-checkpoint rows ``options`` prepare."""
    if options.snapshot_rows is not None:
        return options.snapshot_rows
    return SNAPSHOT_ROWS_PER_SLOT * options.max_concurrency


def compiles_sampling(options: PrepareOptions) -> bool:
    """Whether ``options`` compile the sampler and commit."""
    if options.compile_sampling is None:
        return options.compile
    return options.compile_sampling


@dataclass
class PreparedModel:
    """A prepared model: storage, the operation per catalog entry, and its graph."""

    name: str
    fingerprint: str
    catalog: Catalog
    model: llama.LlamaModel
    storage: Storage
    steps: dict[GraphKey, Callable[[], None]]
    tokenizer: PreTrainedTokenizerBase
    defaults: llama.SamplingDefaults
    memory: MemoryReport
    graphs: dict[GraphKey, torch.cuda.CUDAGraph] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # Whether sampling reads the staged token masks (``PrepareOptions.token_masks``).
    token_masks: bool = True

    def execute(self, key: GraphKey) -> None:
        """Replay the captured graph of ``key``, or call its operation when not captured."""
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
        else:
            self.steps[key]()

    def reset(self) -> None:
        """Request state, pages, snapshot rows and staging back to their initial
        contents (what an exported core starts from)."""
        self.storage.state.reset()
        self.storage.cache.kv.zero_()
        for tensor in self.storage.snapshots.tensors().values():
            tensor.zero_()
        for tensor in self.storage.staging.tensors().values():
            tensor.zero_()

    def close(self) -> None:
        self.graphs.clear()
        self.steps.clear()


def _stop_tokens(config: object, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS ids from the checkpoint config (structural data), else from the tokenizer.

    The config wins because tokenizers rebuilt from other formats can disagree with
    the checkpoint (Transformers 5.17 gives SmolLM2's GGUF tokenizer eos
    ``<|im_start|>`` while the file declares ``<|im_end|>``); the tokenizer is then
    corrected so that every frontend asset agrees.
    """
    declared = getattr(config, "eos_token_id", None)
    ids: list[int] = []
    if isinstance(declared, int):
        ids = [declared]
    elif isinstance(declared, list | tuple):
        ids = sorted({int(v) for v in declared})
    elif tokenizer.eos_token_id is not None:
        ids = [int(tokenizer.eos_token_id)]
    if not ids:
        raise CheckpointError("neither the config nor the tokenizer declares an EOS token")
    if len(ids) > MAX_STOP_TOKENS:
        raise CheckpointError(f"{len(ids)} EOS tokens; the contract holds {MAX_STOP_TOKENS}")
    if tokenizer.eos_token_id not in ids:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(ids[0])
    return ids


def _capture(
    steps: dict[GraphKey, Callable[[], None]],
    keys: list[GraphKey],
    pool: tuple[int, int],
    keep_graphs: bool,
) -> dict[GraphKey, torch.cuda.CUDAGraph]:
    """Warm up and capture each entry, largest first, into one shared pool."""
    stream = torch.cuda.Stream()
    graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
    with phase("warm-up and capture", len(keys)) as advance:
        for key in keys:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    steps[key]()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph(keep_graph=keep_graphs)
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                steps[key]()
            torch.cuda.synchronize()
            graphs[key] = graph
            advance(1, str(key))
    return graphs


def _warm_up(steps: dict[GraphKey, Callable[[], None]], keys: list[GraphKey]) -> None:
    with phase("warm-up (compile)", len(keys)) as advance:
        for key in keys:
            steps[key]()
            advance(1, str(key))


def prepare(
    path: Path, options: PrepareOptions, placement: Placement | None = None
) -> PreparedModel:
    """Prepare ``path``; ``placement`` decides where device memory comes from (by
    default PyTorch's allocator; an export passes the fixed-address window)."""
    placement = placement or DefaultPlacement()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    device = torch.device(options.device)
    source = open_checkpoint(path)
    config = source.config()
    llama.validate_config(config)
    geometry = llama.Geometry.from_config(config)
    max_positions = int(config.max_position_embeddings)
    context_limit = options.context_limit or (max_positions // llama.PAGE_SIZE) * llama.PAGE_SIZE
    if context_limit > max_positions:
        raise CheckpointError(
            f"--context-limit {context_limit} exceeds max_position_embeddings {max_positions}"
        )
    catalog = Catalog.plan(
        options.max_concurrency, options.prefill_chunk_size, context_limit, llama.PAGE_SIZE
    )
    tok_dir, tok_kwargs = source.tokenizer_source()
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, **tok_kwargs)
    stop_tokens = _stop_tokens(config, tokenizer)

    cache = PagedKvCache(torch.empty(0, device=device))
    with placement.region("weights"):
        model = llama.LlamaModel(
            config,
            cache,
            options.dtype,
            device,
            positions=context_limit,
            decode_fusion=options.decode_fusion,
        )
        with phase("loading weights", len(model.mapping.placements)) as advance:
            load_weights(source, model.mapping, advance)
    timings["load_s"] = time.perf_counter() - t0

    slots = options.max_concurrency + 1
    with placement.region("request_state"):
        state = RequestState.allocate(
            slots,
            geometry.vocab,
            catalog.max_pages_per_request,
            geometry.hidden,
            options.dtype,
            device,
        )
        state.stop_tokens[: len(stop_tokens)] = torch.tensor(stop_tokens, device=device)
    with placement.region("staging"):
        staging = StagingInputs.allocate(
            max(catalog.decode), options.prefill_chunk_size, context_limit, geometry.vocab, device
        )
    per_page = PagedKvCache.bytes_per_page(
        geometry.layers, llama.PAGE_SIZE, geometry.kv_heads, geometry.head_dim, options.dtype
    )
    useful_pages = 1 + options.max_concurrency * catalog.max_pages_per_request
    rows = snapshot_rows(options)
    snapshot_bytes = rows * (per_page + geometry.hidden * options.dtype.itemsize)
    if options.kv_pages is not None:
        pages = options.kv_pages
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        pages = plan_kv_pages(
            free - snapshot_bytes,
            int(options.gpu_reserve_gib * GIB),
            int(options.capture_headroom_gib * GIB),
            per_page,
            useful_pages,
            1 + catalog.max_pages_per_request,
        )
    else:
        pages = useful_pages
    with placement.region("kv_pages"):
        cache.kv = PagedKvCache.allocate(
            geometry.layers,
            pages,
            llama.PAGE_SIZE,
            geometry.kv_heads,
            geometry.head_dim,
            options.dtype,
            device,
        ).kv
    with placement.region("snapshot_rows"):
        snapshots = SnapshotRows.allocate(rows, cache, geometry.hidden, device)
    storage = Storage(state, cache, snapshots, staging)

    decode = decode_forward(model, llama.PAGE_SIZE)
    prefill = prefill_forward(model, llama.PAGE_SIZE)
    if options.compile:
        # No on-device benchmarking that changes numerics: a preparation chooses the
        # same kernels every time, so two preparations replay the same arithmetic.
        torch._inductor.config.deterministic = True
        # Round fused low-precision intermediates as eager does. Otherwise whether a
        # bf16 intermediate is rounded depends on fusion decisions, which differ between
        # graphs of different capacities: a request's numbers would depend on its batch.
        torch._inductor.config.emulate_precision_casts = True
        torch._dynamo.config.recompile_limit = 256
        torch._dynamo.config.accumulated_recompile_limit = 4096
        if options.compile_scope == "layer":
            model.compile_layers(fullgraph=False, dynamic=False)
        else:
            decode = torch.compile(decode, fullgraph=False, dynamic=False)
            prefill = torch.compile(prefill, fullgraph=False, dynamic=False)
    ops = SamplingOps.compiled() if compiles_sampling(options) else SamplingOps()
    steps = build_steps(
        catalog, storage, decode, prefill, model.logits, ops, token_masks=options.token_masks
    )

    memory = MemoryReport(
        weights=model.weight_bytes(),
        request_state=state.nbytes(),
        staging=staging.nbytes(),
        snapshot_rows=snapshots.nbytes(),
        kv_pages=cache.nbytes(),
        kv_page_count=pages,
        bytes_per_page=per_page,
    )
    fingerprint = source.fingerprint()
    prepared = PreparedModel(
        name=path.name,
        fingerprint=fingerprint,
        catalog=catalog,
        model=model,
        storage=storage,
        steps=steps,
        tokenizer=tokenizer,
        defaults=llama.sampling_defaults(fingerprint),
        memory=memory,
        timings=timings,
        token_masks=options.token_masks,
    )
    keys = catalog.keys()
    t1 = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize()
        reserved_before = torch.cuda.memory_reserved(device)
        if options.capture:
            prepared.graphs = _capture(steps, keys, placement.graph_pool(), options.keep_graphs)
        else:
            _warm_up(steps, keys)
        torch.cuda.synchronize()
        memory.operator_scratch_and_graph_pool = (
            torch.cuda.memory_reserved(device) - reserved_before
        )
        memory.device_free_after = torch.cuda.mem_get_info(device)[0]
    elif options.compile:
        _warm_up(steps, keys)
    timings["compile_capture_s"] = time.perf_counter() - t1
    prepared.reset()
    timings["prepare_s"] = time.perf_counter() - t0
    for line in memory.lines():
        console.print(line)
    return prepared
