"""Preparation: checkpoint -> composed model over fixed storage -> compiled, captured graphs.

Four steps, in the design's order, each its own function: ``plan`` (the recipe the
registry picks by the config's architectures validates the checkpoint and declares
its storage layout; the catalog), ``allocate`` (the recipe's canonical model built
on the meta device, weights streamed into execution layouts; request state, staging,
KV pages sized from measured free memory, snapshot rows), ``compile_steps`` (the
complete forwards compiled) and ``capture`` (every catalog entry warmed up and
captured into one graph pool, largest first; state reset).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from ignition.components.continuation import ContinuationRows
from ignition.components.kv_cache import PagedKvCache
from ignition.components.programmatic_launch import programmatic_launch
from ignition.components.state_transfer import SnapshotRows
from ignition.components.token_state import MAX_STOP_TOKENS, RequestState, StagingInputs
from ignition.loading.mapping import load_weights
from ignition.loading.open import open_checkpoint
from ignition.loading.source import CheckpointError, CheckpointSource
from ignition.parallel.shard import ONE_RANK, TensorParallel
from ignition.preparation.catalog import Catalog, GraphKey
from ignition.preparation.compile_flags import DEFAULT_DECODE_FUSION, CompileScope, DecodeFusion
from ignition.preparation.memory import GIB, MemoryReport, plan_kv_pages
from ignition.preparation.placement import DefaultPlacement, Placement
from ignition.preparation.progress import console, phase
from ignition.preparation.steps import (
    SamplingOps,
    StepIo,
    Storage,
    build_steps,
    decode_forward,
    prefill_forward,
)
from recipes.interface import Recipe, SamplingDefaults, StateLayout, TextModel
from recipes.registry import served_checkpoint

# Default prefix-checkpoint rows per concurrent request. A request captures at most
# eight checkpoints (the design's budget cap); the pool keeps four times that per
# slot so older turns of long conversations survive for branches (a row costs one KV
# page and one hidden vector: 1.4 MiB for SmolLM2-135M, 9 MiB for Qwen3-8B).
SNAPSHOT_ROWS_PER_SLOT = 32
# The default checkpoint-state budget (the design's): rows whose continuation state is
# large (a hybrid model's recurrent matrices, ~112 MiB a row at Qwen3.8 Flash's
# geometry) are capped to what it holds; dense rows (at most ~9 MiB) stay at the
# per-slot count.
SNAPSHOT_STATE_BUDGET = 4 * 1024**3


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
    # by default "auto", the recipe's choice for the geometry and rank layout.
    decode_fusion: DecodeFusion = DEFAULT_DECODE_FUSION
    # The batch-invariant row projections (every decode projection), prefill's
    # rotary/KV write, decode attention and the sampler's threshold passes launch
    # programmatically in the warm-up and capture
    # where the GPU can (SM90 and later;
    # ``ignition.components.programmatic_launch``): programmatic edges in the graphs,
    # the same bits, a decode step 0.5 to 1.4% shorter on the H200.
    programmatic_launch: bool = True
    # With programmatic launch, each row projection of one row tile loads its last K
    # steps' weight tiles before it waits for the kernel before (no kernel of a step
    # writes a weight; ``linear.early_steps``): those bytes stream under that kernel's
    # tail. The same bits. Off: on the H200 the 8B's step took about 3% longer in
    # three of four cases (``bench/results/issue23/2026-12-05-h200-changes``).
    early_weights: bool = False
    # Sampling graphs take a token mask per row (constrained decoding); False
    # exports graphs as before masks existed, to measure what the input costs.
    token_masks: bool = True
    capture: bool = True
    # Keep each captured cudaGraph_t (an export walks them); they instantiate on use.
    keep_graphs: bool = False
    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16
    # This process's rank of a tensor-parallel group (ignition.parallel): the model is
    # its shard. Over torch.distributed's collectives (Gloo), which an exported graph
    # cannot hold, a rank prepares eagerly (compile and capture off); over the window
    # collectives (``capturable``) it compiles and captures.
    parallel: TensorParallel = ONE_RANK


def snapshot_rows(options: PrepareOptions, row_bytes: int = 0) -> int:
    """The prefix-checkpoint rows ``options`` prepare: as given, else
    ``SNAPSHOT_ROWS_PER_SLOT`` per concurrent request within the checkpoint-state
    budget for rows of ``row_bytes`` (at least one row)."""
    if options.snapshot_rows is not None:
        return options.snapshot_rows
    rows = SNAPSHOT_ROWS_PER_SLOT * options.max_concurrency
    if row_bytes > 0:
        rows = min(rows, max(1, SNAPSHOT_STATE_BUDGET // row_bytes))
    return rows


def compiles_sampling(options: PrepareOptions) -> bool:
    """Whether ``options`` compile the sampler and commit, and the reads and writes
    around each step's forward (``StepIo``)."""
    if options.compile_sampling is None:
        return options.compile
    return options.compile_sampling


@dataclass
class PreparedModel:
    """A prepared model: storage, the operation per catalog entry, and its graph."""

    name: str
    fingerprint: str
    catalog: Catalog
    model: TextModel
    storage: Storage
    steps: dict[GraphKey, Callable[[], None]]
    tokenizer: PreTrainedTokenizerBase
    defaults: SamplingDefaults
    memory: MemoryReport
    graphs: dict[GraphKey, torch.cuda.CUDAGraph] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # Whether sampling reads the staged token masks (``PrepareOptions.token_masks``).
    token_masks: bool = True
    # The recipe it was prepared with (``recipes.registry``).
    recipe: str = ""

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
        for tensor in self.storage.cache.extra.values():
            tensor.zero_()
        rows = self.storage.rows
        rows.reset(torch.arange(rows.rows, device=self.storage.cache.kv.device))
        snapshots = self.storage.snapshots
        for name, tensor in snapshots.tensors().items():
            if not name.startswith("rows."):
                tensor.zero_()
        continuation = snapshots.continuation
        continuation.reset(torch.arange(continuation.rows, device=snapshots.kv.device))
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


def recapture(
    prepared: PreparedModel,
    keys: list[GraphKey],
    *,
    programmatic: bool,
    early_weights: bool = False,
) -> dict[GraphKey, torch.cuda.CUDAGraph]:
    """``keys`` captured again over the same storage into a pool of their own, the
    weight-streaming kernels launched programmatically or not, with early weights or
    not (``PrepareOptions.programmatic_launch`` and ``early_weights``): the other side
    of an A/B measurement (``bench/kernel_timeline.py --compare-programmatic-launch``,
    ``--compare-early-weights``). The storage is reset after, as preparation leaves
    it."""
    with programmatic_launch(programmatic, early_weights):
        graphs = _capture(prepared.steps, keys, torch.cuda.graph_pool_handle(), False)
    prepared.reset()
    return graphs


def _warm_up(steps: dict[GraphKey, Callable[[], None]], keys: list[GraphKey]) -> None:
    with phase("warm-up (compile)", len(keys)) as advance:
        for key in keys:
            steps[key]()
            advance(1, str(key))


@dataclass
class PreparationPlan:
    """What a checkpoint is prepared as, before any device memory: its recipe and the
    storage layout it declares, the context limit, the graph catalog and the
    tokenizer with the checkpoint's stop tokens."""

    path: Path
    source: CheckpointSource
    config: PretrainedConfig
    recipe: Recipe
    layout: StateLayout
    context_limit: int
    catalog: Catalog
    tokenizer: PreTrainedTokenizerBase
    stop_tokens: list[int]


def plan(path: Path, options: PrepareOptions) -> PreparationPlan:
    """Validates the checkpoint at ``path`` against its recipe and plans the catalog."""
    capturable = getattr(options.parallel.collectives, "capturable", False)
    if options.parallel.sharded and (options.compile or options.capture) and not capturable:
        raise CheckpointError(
            "a tensor-parallel rank compiles and captures only over export-safe collectives "
            "(ignition.parallel.window_collectives, as ignition.parallel.export_ranks "
            "sets them up); over Gloo it prepares with compile and capture off"
        )
    source, recipe = served_checkpoint(open_checkpoint(path))
    config = source.config()
    recipe.validate_config(config)
    page = recipe.page_size
    max_positions = int(config.max_position_embeddings)
    context_limit = options.context_limit or (max_positions // page) * page
    if context_limit > max_positions:
        raise CheckpointError(
            f"--context-limit {context_limit} exceeds max_position_embeddings {max_positions}"
        )
    catalog = Catalog.plan(options.max_concurrency, options.prefill_chunk_size, context_limit, page)
    tok_dir, tok_kwargs = source.tokenizer_source()
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, **tok_kwargs)
    return PreparationPlan(
        path=path,
        source=source,
        config=config,
        recipe=recipe,
        layout=recipe.layout(config, options.dtype, options.parallel),
        context_limit=context_limit,
        catalog=catalog,
        tokenizer=tokenizer,
        stop_tokens=_stop_tokens(config, tokenizer),
    )


@dataclass
class Allocation:
    """A plan's model with its weights loaded, and its fixed storage."""

    model: TextModel
    storage: Storage
    memory: MemoryReport


def allocate(plan: PreparationPlan, options: PrepareOptions, placement: Placement) -> Allocation:
    """Builds the recipe's model and streams the weights in, then allocates request
    state, staging, KV pages (sized from measured free memory unless given) and
    snapshot rows, each in its placement region."""
    device = torch.device(options.device)
    layout, catalog, page = plan.layout, plan.catalog, plan.recipe.page_size
    cache = PagedKvCache(torch.empty(0, device=device))
    slots = options.max_concurrency + 1
    with placement.region("request_state"):
        continuation = ContinuationRows(layout.rows, slots, device)
    with placement.region("weights"):
        model = plan.recipe.build(
            plan.config,
            cache,
            continuation,
            options.dtype,
            device,
            plan.context_limit,
            options.decode_fusion,
            options.parallel,
        )
        with phase("loading weights", len(model.mapping.placements)) as advance:
            load_weights(plan.source, model.mapping, advance)

    with placement.region("request_state"):
        state = RequestState.allocate(
            slots,
            layout.vocab,
            catalog.max_pages_per_request,
            layout.hidden,
            options.dtype,
            device,
        )
        stops = plan.stop_tokens
        state.stop_tokens[: len(stops)] = torch.tensor(stops, device=device)
    with placement.region("staging"):
        staging = StagingInputs.allocate(
            max(catalog.decode),
            options.prefill_chunk_size,
            plan.context_limit,
            layout.vocab,
            device,
        )
    kv_per_page = PagedKvCache.bytes_per_page(
        layout.kv_layers, page, layout.kv_heads, layout.head_dim, options.dtype
    )
    # A page's storage in every paged tensor (what planning and a snapshot row count);
    # the contract's bytes per page are the K/V pages buffer's alone.
    per_page = kv_per_page + sum(f.bytes_per_page() for f in layout.paged)
    useful_pages = 1 + options.max_concurrency * catalog.max_pages_per_request
    row_bytes = per_page + layout.hidden * options.dtype.itemsize
    row_bytes += sum(f.nbytes() for f in layout.rows)
    rows = snapshot_rows(options, row_bytes)
    snapshot_bytes = rows * row_bytes
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
            layout.kv_layers,
            pages,
            page,
            layout.kv_heads,
            layout.head_dim,
            options.dtype,
            device,
        ).kv
    # Further paged tensors are small and backed whole: outside the K/V region, whose
    # pages a loader may back only in part.
    with placement.region("request_state"):
        cache.extra = {f.name: f.allocate(pages, device) for f in layout.paged}
    with placement.region("snapshot_rows"):
        snapshots = SnapshotRows.allocate(rows, cache, layout.hidden, device, layout.rows)
    memory = MemoryReport(
        weights=model.weight_bytes(),
        request_state=state.nbytes() + continuation.nbytes() + cache.extra_nbytes(),
        staging=staging.nbytes(),
        snapshot_rows=snapshots.nbytes(),
        kv_pages=cache.nbytes(),
        kv_page_count=pages,
        bytes_per_page=kv_per_page,
    )
    return Allocation(model, Storage(state, cache, snapshots, staging, continuation), memory)


def configure_compilation() -> None:
    """The Inductor and Dynamo settings every preparation compiles with."""
    # No on-device benchmarking that changes numerics: a preparation chooses the
    # same kernels every time, so two preparations replay the same arithmetic.
    torch._inductor.config.deterministic = True
    # Round fused low-precision intermediates as eager does. Otherwise whether a
    # bf16 intermediate is rounded depends on fusion decisions, which differ between
    # graphs of different capacities: a request's numbers would depend on its batch.
    torch._inductor.config.emulate_precision_casts = True
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    # Inductor's caches key a graph by its operations, not by a custom operator's
    # schema, so a graph cached before a Flare operator's schema changed calls it
    # with arguments it no longer has (preparation failed so, with "Unknown keyword
    # argument 'norm_weight' for operator 'flare::rows_linear'", once its norm
    # became partial squares). The schemas' digest in the key misses those entries.
    tag = torch.compiler.config.cache_key_tag.split("+flare-")[0]
    torch.compiler.config.cache_key_tag = f"{tag}+flare-{operator_schemas_digest()}"


def _flare_schemas() -> list[torch._C.FunctionSchema]:
    return [s for s in torch._C._jit_get_all_schemas() if s.name.startswith("flare::")]


def operator_schemas_digest() -> str:
    """A digest of every registered ``flare::`` operator's schema."""
    schemas = sorted(str(schema) for schema in _flare_schemas())
    return hashlib.sha256("\n".join(schemas).encode()).hexdigest()[:16]


def compile_steps(
    plan: PreparationPlan, allocation: Allocation, options: PrepareOptions
) -> dict[GraphKey, Callable[[], None]]:
    """One operation per catalog entry over the allocation: the recipe's forwards,
    compiled as ``options`` say (no kernels run yet)."""
    model, page = allocation.model, plan.recipe.page_size
    decode = decode_forward(model, page)
    prefill = prefill_forward(model, page)
    if options.compile:
        configure_compilation()
        if options.compile_scope == "layer":
            model.compile_layers(fullgraph=False, dynamic=False)
        else:
            decode = torch.compile(decode, fullgraph=False, dynamic=False)
            prefill = torch.compile(prefill, fullgraph=False, dynamic=False)
    compiled = compiles_sampling(options)
    return build_steps(
        plan.catalog,
        allocation.storage,
        decode,
        prefill,
        model.logits,
        SamplingOps.compiled() if compiled else SamplingOps(),
        StepIo.compiled() if compiled else StepIo(),
        token_masks=options.token_masks,
        broadcast=(
            options.parallel.collectives.broadcast_from_zero if options.parallel.sharded else None
        ),
    )


def capture(prepared: PreparedModel, options: PrepareOptions, placement: Placement) -> None:
    """Warms up and captures every catalog entry into the placement's graph pool on a
    GPU (compiles and runs each once on the CPU), reporting the scratch and pool the
    capture took, then resets the storage."""
    device = torch.device(options.device)
    memory, steps, keys = prepared.memory, prepared.steps, prepared.catalog.keys()
    if device.type == "cuda":
        torch.cuda.synchronize()
        reserved_before = torch.cuda.memory_reserved(device)
        with programmatic_launch(options.programmatic_launch, options.early_weights):
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
    prepared.reset()


def prepare(
    path: Path, options: PrepareOptions, placement: Placement | None = None
) -> PreparedModel:
    """Prepare ``path``: plan, allocate, compile, capture. ``placement`` decides where
    device memory comes from (by default PyTorch's allocator; an export passes the
    fixed-address window)."""
    placement = placement or DefaultPlacement()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    planned = plan(path, options)
    allocation = allocate(planned, options, placement)
    timings["load_s"] = time.perf_counter() - t0
    steps = compile_steps(planned, allocation, options)
    fingerprint = planned.source.fingerprint()
    prepared = PreparedModel(
        name=path.name,
        fingerprint=fingerprint,
        catalog=planned.catalog,
        model=allocation.model,
        storage=allocation.storage,
        steps=steps,
        tokenizer=planned.tokenizer,
        defaults=planned.recipe.sampling_defaults(fingerprint),
        memory=allocation.memory,
        timings=timings,
        token_masks=options.token_masks,
        recipe=planned.recipe.name,
    )
    t1 = time.perf_counter()
    capture(prepared, options, placement)
    timings["compile_capture_s"] = time.perf_counter() - t1
    timings["prepare_s"] = time.perf_counter() - t0
    console.print(f"decode fusion: {allocation.model.decode_fusion}")
    for line in allocation.memory.lines():
        console.print(line)
    return prepared
