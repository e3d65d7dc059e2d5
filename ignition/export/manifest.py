"""The runtime-core manifest (``proto/flare_core.proto``) built from a prepared model.

This module describes what preparation owns: buffers with their roles and semantic
bindings, the catalog as a PreparedContract, and the frontend assets. The graph
walk and kernel images (CUPTI, the fixed-address window) come with the export
proper; ``tiny_fixture`` lays buffers out in a synthetic window so that the
manifest layer can be tested on the CPU and a committed fixture keeps loading.

    python -m ignition.export.manifest --fixture OUT_DIR [--hybrid]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ignition.components.kv_cache import PAGE_AXIS
from ignition.components.token_state import COMPLETION_FIELDS
from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import write_core_dir
from ignition.export.output_protocol import OutputProtocol, derive_output_protocol
from ignition.preparation.catalog import GraphKind
from ignition.preparation.prepared import PreparedModel
from recipes.interface import SamplingDefaults

ABI_VERSION = 1
ENGINE_VERSION = "0.1.0"
MIB = 1 << 20
WINDOW_ALIGNMENT = 2 * MIB
BUFFER_ALIGNMENT = 256

_DTYPES = {
    torch.bfloat16: pb.DTYPE_BF16,
    torch.float16: pb.DTYPE_F16,
    torch.float32: pb.DTYPE_F32,
    torch.int32: pb.DTYPE_I32,
    torch.int64: pb.DTYPE_I64,
    torch.uint8: pb.DTYPE_U8,
}

REGION_OF_ROLE = {
    pb.BUFFER_ROLE_WEIGHT: pb.REGION_KIND_WEIGHTS,
    pb.BUFFER_ROLE_REQUEST_STATE: pb.REGION_KIND_REQUEST_STATE,
    pb.BUFFER_ROLE_KV_PAGES: pb.REGION_KIND_KV_PAGES,
    pb.BUFFER_ROLE_SNAPSHOT_ROWS: pb.REGION_KIND_SNAPSHOT_ROWS,
    pb.BUFFER_ROLE_STAGING_INPUT: pb.REGION_KIND_STAGING,
    pb.BUFFER_ROLE_OUTPUT: pb.REGION_KIND_STAGING,
}

GRAPH_KINDS = {
    GraphKind.DECODE: pb.GRAPH_KIND_DECODE,
    GraphKind.PREFILL: pb.GRAPH_KIND_PREFILL,
    GraphKind.RESUME: pb.GRAPH_KIND_RESUME,
    GraphKind.ADMIT: pb.GRAPH_KIND_ADMIT,
    GraphKind.SNAPSHOT: pb.GRAPH_KIND_SNAPSHOT,
    GraphKind.RESTORE: pb.GRAPH_KIND_RESTORE,
}

# Staging buffer (or state field) -> the semantic value it carries for the host.
_SEMANTICS = {
    "staging.decode_slots": pb.SEMANTIC_DECODE_SLOTS,
    "staging.chunk_slot": pb.SEMANTIC_CHUNK_SLOT,
    "staging.chunk_tokens": pb.SEMANTIC_CHUNK_TOKENS,
    "staging.chunk_len": pb.SEMANTIC_CHUNK_LEN,
    "staging.chunk_sample": pb.SEMANTIC_CHUNK_SAMPLE,
    "staging.admit_slot": pb.SEMANTIC_ADMIT_SLOT,
    "staging.admit_tokens": pb.SEMANTIC_ADMIT_TOKENS,
    "staging.admit_len": pb.SEMANTIC_ADMIT_LEN,
    "staging.admit_consumed": pb.SEMANTIC_ADMIT_CONSUMED,
    "staging.admit_int": pb.SEMANTIC_ADMIT_INT,
    "staging.admit_float": pb.SEMANTIC_ADMIT_FLOAT,
    "staging.admit_seed": pb.SEMANTIC_ADMIT_SEED,
    "staging.resume_slot": pb.SEMANTIC_RESUME_SLOT,
    "staging.maint_slot": pb.SEMANTIC_MAINT_SLOT,
    "staging.maint_row": pb.SEMANTIC_MAINT_ROW,
    "staging.maint_expect": pb.SEMANTIC_MAINT_EXPECT,
    "staging.maint_status": pb.SEMANTIC_MAINT_STATUS,
    "staging.completions": pb.SEMANTIC_COMPLETIONS,
    "staging.logits": pb.SEMANTIC_LOGITS,
    "staging.sample_mask": pb.SEMANTIC_SAMPLE_MASK,
    "staging.sample_masked": pb.SEMANTIC_SAMPLE_MASKED,
    "state.page_table": pb.SEMANTIC_PAGE_TABLE,
    "state.stop_tokens": pb.SEMANTIC_STOP_TOKENS,
}
# Bound only where sampling reads them (``PrepareOptions.token_masks``).
_MASK_BUFFERS = {"staging.sample_mask", "staging.sample_masked"}


def named_buffers(prepared: PreparedModel) -> Iterator[tuple[str, int, torch.Tensor]]:
    """Every tensor the graphs read or write, with its manifest name and role."""
    for name, tensor in prepared.model.weights.items():
        yield f"weight.{name}", pb.BUFFER_ROLE_WEIGHT, tensor
    storage = prepared.storage
    for name, tensor in storage.state.tensors().items():
        yield f"state.{name}", pb.BUFFER_ROLE_REQUEST_STATE, tensor
    # A recipe's further paged tensors and continuation rows are request state: the
    # graphs alone read and write them; checkpoints copy them through the snapshot
    # rows below, whatever they hold.
    for name, tensor in storage.cache.extra.items():
        yield f"paged.{name}", pb.BUFFER_ROLE_REQUEST_STATE, tensor
    for name, tensor in storage.rows.tensors.items():
        yield f"rows.{name}", pb.BUFFER_ROLE_REQUEST_STATE, tensor
    yield "kv.pages", pb.BUFFER_ROLE_KV_PAGES, storage.cache.kv
    for name, tensor in storage.snapshots.tensors().items():
        yield f"snapshot.{name}", pb.BUFFER_ROLE_SNAPSHOT_ROWS, tensor
    outputs = {"completions", "logits", "maint_status"}
    for name, tensor in storage.staging.tensors().items():
        role = pb.BUFFER_ROLE_OUTPUT if name in outputs else pb.BUFFER_ROLE_STAGING_INPUT
        yield f"staging.{name}", role, tensor


def extent_bytes(tensor: torch.Tensor) -> int:
    """Bytes from a view's first element to its last (what the view can touch)."""
    if tensor.numel() == 0:
        return 0
    span = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
    )
    return (span + 1) * tensor.element_size()


def buffer_message(name: str, role: int, tensor: torch.Tensor, offset: int) -> pb.Buffer:
    """A buffer view; buffers whose contents are not all zero carry them as initial
    contents under their own name (weights, neutral sampling values, EOS ids)."""
    return pb.Buffer(
        name=name,
        role=role,
        offset=offset,
        size_bytes=extent_bytes(tensor),
        dtype=_DTYPES[tensor.dtype],
        shape=list(tensor.shape),
        strides=list(tensor.stride()),
        initial_tensor=name if any_nonzero(tensor) else "",
    )


def any_nonzero(tensor: torch.Tensor, chunk_elements: int = 1 << 26) -> bool:
    """Whether any element is nonzero, reading the tensor in bounded chunks so a
    buffer of tens of GiB (an 8B model's KV pages) needs no temporary of its size."""
    flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.flatten()
    return any(bool(chunk.any()) for chunk in flat.split(chunk_elements))


def contract_message(prepared: PreparedModel) -> pb.PreparedContract:
    catalog = prepared.catalog
    return pb.PreparedContract(
        page_size=catalog.page_size,
        max_concurrency=catalog.max_concurrency,
        context_limit=catalog.context_limit,
        prefill_chunk_size=catalog.prefill_chunk_size,
        decode_capacities=list(catalog.decode),
        prefill_capacities=list(catalog.prefill),
        kv_pages=prepared.storage.cache.pages,
        bytes_per_page=prepared.memory.bytes_per_page,
        kv_page_axis=PAGE_AXIS,
        snapshot_rows=prepared.storage.snapshots.consumed.shape[0],
        vocab_size=prepared.model.geometry.vocab,
        bindings=[
            pb.Binding(semantic=s, buffer=b)
            for b, s in _SEMANTICS.items()
            if prepared.token_masks or b not in _MASK_BUFFERS
        ],
        completion_fields=list(COMPLETION_FIELDS),
        continuation=continuation_state(prepared),
    )


def continuation_state(prepared: PreparedModel) -> int:
    """``POSITIONAL_KV`` when the recipe's storage is K/V pages alone (no further
    paged tensor, no continuation row), else ``CONTINUATION_ROWS``."""
    storage = prepared.storage
    if storage.cache.extra or storage.rows.fields:
        return pb.CONTINUATION_STATE_CONTINUATION_ROWS
    return pb.CONTINUATION_STATE_POSITIONAL_KV


def sampling_message(defaults: SamplingDefaults) -> pb.SamplingDefaults:
    message = pb.SamplingDefaults(
        temperature=defaults.temperature,
        top_k=defaults.top_k,
        top_p=defaults.top_p,
        min_p=defaults.min_p,
        repetition_penalty=defaults.repetition_penalty,
        presence_penalty=defaults.presence_penalty,
        frequency_penalty=defaults.frequency_penalty,
    )
    for name, low, high in defaults.ranges:
        getattr(message, f"{name}_range").CopyFrom(pb.FloatRange(min=low, max=high))
    return message


def named_special_tokens(tokenizer: PreTrainedTokenizerBase) -> list[pb.NamedToken]:
    """Transformers' ``special_tokens_map``, which ``apply_chat_template`` passes to
    every template rendering: Helios renders with exactly these."""
    return [
        pb.NamedToken(name=name, content=content)
        for name, content in tokenizer.special_tokens_map.items()
    ]


def set_output_protocol(frontend: pb.Frontend, protocol: OutputProtocol) -> None:
    """The parsers and, for those that are not NONE, their markers (a marker's
    ``token_id`` stays unset when no added token spells it)."""
    frontend.tool_parser = protocol.tool_parser
    frontend.reasoning_parser = protocol.reasoning_parser
    tool_markers = protocol.tool_markers()
    if tool_markers is not None:
        frontend.tool_markers.CopyFrom(tool_markers)
    reasoning_markers = protocol.reasoning_markers()
    if reasoning_markers is not None:
        frontend.reasoning_markers.CopyFrom(reasoning_markers)


def frontend_message(prepared: PreparedModel) -> pb.Frontend:
    """The frontend assets; the output protocol is derived from the very template
    recorded (``ignition.export.output_protocol``)."""
    tokenizer = prepared.tokenizer
    stop = [int(t) for t in prepared.storage.state.stop_tokens.tolist() if t >= 0]
    template = str(tokenizer.chat_template or "")
    frontend = pb.Frontend(
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        chat_template=template,
        eos_token_ids=stop,
        special_tokens=list(tokenizer.all_special_tokens),
        named_special_tokens=named_special_tokens(tokenizer),
        sampling=sampling_message(prepared.defaults),
    )
    set_output_protocol(frontend, derive_output_protocol(tokenizer, template))
    return frontend


def with_rank_layout(core: pb.Core, peers: list[pb.Core]) -> pb.Core:
    """``core`` as rank 0 of a tensor-parallel core whose ranks 1.. are ``peers``, in
    order: each a one-rank manifest of the same preparation on its own device, whose
    window, buffers and graphs become that rank's bundle (kernel images, contract,
    frontend and identity are rank 0's, shared). A peer's qualification sequence
    travels with its bundle: ``flare replay --check`` replays the ranks in lockstep."""
    layout = pb.RankLayout(world_size=1 + len(peers))
    for rank, peer in enumerate(peers, start=1):
        bundle = layout.peers.add(
            rank=rank, window=peer.window, buffers=peer.buffers, graphs=peer.graphs
        )
        if peer.HasField("qualification"):
            bundle.qualification.CopyFrom(peer.qualification)
    core.rank_layout.CopyFrom(layout)
    return core


def tiny_fixture(
    prepared: PreparedModel, base: int = 0x200000000000
) -> tuple[pb.Core, dict[str, torch.Tensor]]:
    """A manifest whose buffers are laid out in a synthetic window, one region per
    role in the order ``named_buffers`` yields them, and whose graphs are
    placeholders (one empty node each): the manifest layer without a GPU."""
    buffers = []
    initial: dict[str, torch.Tensor] = {}
    spans: dict[int, list[int]] = {}
    offset = 0
    for name, role, tensor in named_buffers(prepared):
        buffers.append(buffer_message(name, role, tensor, offset))
        if buffers[-1].initial_tensor:
            initial[name] = tensor
        end = offset + -(-extent_bytes(tensor) // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT
        span = spans.setdefault(REGION_OF_ROLE[role], [offset, end])
        span[1] = end
        offset = end
    size = max(32 * MIB, -(-offset // WINDOW_ALIGNMENT) * WINDOW_ALIGNMENT)
    graphs = [
        pb.Graph(kind=GRAPH_KINDS[key.kind], capacity=key.capacity, nodes=[pb.Node(empty={})])
        for key in prepared.catalog.keys()
    ]
    identity = pb.Identity(
        engine_version=ENGINE_VERSION,
        recipe=prepared.recipe,
        checkpoint_fingerprint=prepared.fingerprint,
        device_name="none (fixture)",
    )
    core = pb.Core(
        abi_version=ABI_VERSION,
        identity=identity,
        window=pb.Window(
            base=base,
            size=size,
            regions=[
                pb.Region(kind=kind, offset=start, size=end - start, backed_bytes=end - start)
                for kind, (start, end) in spans.items()
            ],
        ),
        buffers=buffers,
        graphs=graphs,
        contract=contract_message(prepared),
        frontend=frontend_message(prepared),
    )
    return core, initial


def main() -> None:
    import sys

    parser = argparse.ArgumentParser(description="write the tiny manifest fixture")
    parser.add_argument("--fixture", type=Path, required=True, help="output core directory")
    parser.add_argument(
        "--hybrid",
        action="store_true",
        help="the tiny qwen4_exp checkpoint (paged selectors, continuation rows) instead of llama",
    )
    args = parser.parse_args()
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests"))
    from checkpoints import write_tiny, write_tiny_hybrid

    from ignition.preparation.prepared import PrepareOptions, prepare

    work = args.fixture / "checkpoint"
    if args.hybrid:
        write_tiny_hybrid(work)
    else:
        write_tiny(work, "llama")
    options = PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=256,
        context_limit=512,
        snapshot_rows=2,
        compile=False,
        capture=False,
        device="cpu",
        dtype=torch.bfloat16,
    )
    core, initial = tiny_fixture(prepare(work, options))
    write_core_dir(args.fixture, core, initial, {})
    for path in sorted(work.iterdir()):
        path.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
