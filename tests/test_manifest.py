"""The runtime-core manifest written from a prepared model (CPU): contract, buffers,
bindings and frontend assets round-trip, and the committed fixture keeps parsing."""

from __future__ import annotations

import hashlib
import itertools
import math
import subprocess
from pathlib import Path

import pytest
import torch
from checkpoints import write_tiny
from tokenizers import Tokenizer

from ignition.components.kv_cache import PAGE_AXIS
from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import CoreDirError, read_core_dir, write_core_dir
from ignition.export.manifest import ABI_VERSION, any_nonzero, tiny_fixture
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare

FIXTURE = Path(__file__).resolve().parents[1] / "helios/tests/fixtures/tiny-core/manifest.pb"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> PreparedModel:
    path = write_tiny(tmp_path_factory.mktemp("llama"), "llama")
    options = PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=256,
        context_limit=512,
        compile=False,
        capture=False,
        device="cpu",
        dtype=torch.bfloat16,
    )
    return prepare(path, options)


def test_manifest_round_trips_with_every_semantic_bound(prepared: PreparedModel) -> None:
    core = pb.Core()
    core.ParseFromString(tiny_fixture(prepared)[0].SerializeToString())
    assert core.abi_version == ABI_VERSION
    names = {b.name for b in core.buffers}
    assert len(names) == len(core.buffers)
    bound = {b.semantic for b in core.contract.bindings}
    every = {v.number for v in pb.Semantic.DESCRIPTOR.values if v.number != 0}
    assert bound == every
    assert all(b.buffer in names for b in core.contract.bindings)
    assert list(core.contract.decode_capacities) == [1, 2, 4]
    assert list(core.contract.prefill_capacities) == [128, 256]
    kinds = {(g.kind, g.capacity) for g in core.graphs}
    assert (pb.GRAPH_KIND_DECODE, 4) in kinds and (pb.GRAPH_KIND_RESTORE, 1) in kinds
    # A dense model's state is its K/V pages alone (the hybrid's test: rows).
    assert core.contract.continuation == pb.CONTINUATION_STATE_POSITIONAL_KV


def test_buffers_fit_the_window_without_overlap(prepared: PreparedModel) -> None:
    core, _ = tiny_fixture(prepared)
    spans = sorted((b.offset, b.offset + b.size_bytes) for b in core.buffers)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= core.window.size
    weight = sum(b.size_bytes for b in core.buffers if b.role == pb.BUFFER_ROLE_WEIGHT)
    assert weight == prepared.model.weight_bytes()


def test_the_kv_page_axis_describes_the_cache_as_slabs_of_pages(
    prepared: PreparedModel,
) -> None:
    core, _ = tiny_fixture(prepared)
    contract = core.contract
    assert contract.HasField("kv_page_axis") and contract.kv_page_axis == PAGE_AXIS
    (kv,) = [b for b in core.buffers if b.role == pb.BUFFER_ROLE_KV_PAGES]
    axis = contract.kv_page_axis
    # Helios's rule (helios/src/core/kv_layout.rs): the axis counts kv_pages, the
    # axes after it lie inside one page stride, and bytes_per_page is the slabs
    # (the axes before it) times that stride in bytes.
    assert kv.shape[axis] == contract.kv_pages == prepared.storage.cache.pages
    page_dims = zip(kv.shape[axis + 1 :], kv.strides[axis + 1 :], strict=True)
    inner = 1 + sum((d - 1) * s for d, s in page_dims)
    assert inner <= kv.strides[axis]
    slabs = math.prod(kv.shape[:axis])
    itemsize = prepared.storage.cache.kv.element_size()
    assert contract.bytes_per_page == slabs * kv.strides[axis] * itemsize


def test_frontend_assets_reproduce_the_tokenizer(prepared: PreparedModel) -> None:
    frontend = tiny_fixture(prepared)[0].frontend
    native = Tokenizer.from_str(frontend.tokenizer_json)
    text = "w5 w17 <|im_end|> w300"
    assert native.encode(text).ids == prepared.tokenizer.encode(text, add_special_tokens=False)
    assert list(frontend.eos_token_ids) == [1]
    assert frontend.sampling.temperature == pytest.approx(prepared.defaults.temperature)
    assert frontend.sampling.temperature_range.max == pytest.approx(2.0)


def test_frontend_carries_the_named_special_tokens_templates_see(
    prepared: PreparedModel,
) -> None:
    frontend = tiny_fixture(prepared)[0].frontend
    named = {token.name: token.content for token in frontend.named_special_tokens}
    assert named == prepared.tokenizer.special_tokens_map
    assert "eos_token" in named
    committed = pb.Core()
    committed.ParseFromString(FIXTURE.read_bytes())
    assert {t.name: t.content for t in committed.frontend.named_special_tokens} == named


def test_frontend_carries_the_output_protocol_of_its_template(prepared: PreparedModel) -> None:
    # The tiny checkpoints' ChatML template ignores tools and calls: the server
    # instructs the JSON format; the word-level vocabulary spells no marker.
    frontend = tiny_fixture(prepared)[0].frontend
    assert frontend.tool_parser == pb.TOOL_PARSER_JSON_INSTRUCTED
    markers = frontend.tool_markers
    assert (markers.call_start.text, markers.call_end.text) == ("<tool_call>", "</tool_call>")
    assert not markers.call_start.HasField("token_id")
    assert not markers.call_end.HasField("token_id")
    assert frontend.reasoning_parser == pb.REASONING_PARSER_NONE
    assert not frontend.HasField("reasoning_markers")


def test_committed_fixture_keeps_parsing() -> None:
    core = pb.Core()
    core.ParseFromString(FIXTURE.read_bytes())
    assert core.abi_version == 1
    assert list(core.contract.decode_capacities) == [1, 2, 4]


def test_core_directory_round_trips_and_refuses_disagreeing_parts(
    prepared: PreparedModel, tmp_path: Path
) -> None:
    core, initial = tiny_fixture(prepared)
    image = b"\x7fELF kernel image bytes"
    digest = hashlib.sha256(image).hexdigest()
    core.images.add(sha256=digest, size_bytes=len(image))
    write_core_dir(tmp_path / "core", core, initial, {digest: image})
    read, contents, images = read_core_dir(tmp_path / "core")
    assert read == core and images == {digest: image}
    assert set(contents) == {b.name for b in core.buffers if b.initial_tensor}
    weight = "weight.model.embed_tokens.weight"
    assert torch.equal(contents[weight], prepared.model.weights["model.embed_tokens.weight"])
    neutral = contents["state.temperature"]
    assert bool((neutral == 1).all())  # nonzero defaults travel as initial contents
    assert "kv.pages" not in contents  # zero buffers carry no bytes
    with pytest.raises(CoreDirError, match="embed_tokens"):
        write_core_dir(tmp_path / "bad", core, {**initial, weight: initial[weight][:2]}, {})
    with pytest.raises(CoreDirError, match="digest"):
        write_core_dir(tmp_path / "bad", core, initial, {digest: image + b"!"})
    (tmp_path / "core" / "images" / f"{digest}.bin").unlink()
    with pytest.raises(CoreDirError, match="missing"):
        read_core_dir(tmp_path / "core")


def test_nonzero_contents_are_found_in_bounded_chunks() -> None:
    # An 8B model's KV pages are tens of GiB: count_nonzero over them asked the
    # GPU for a temporary four times their size. Chunks of 7 elements here.
    zeros = torch.zeros(5, 6, 7, dtype=torch.bfloat16)
    assert not any_nonzero(zeros, chunk_elements=7)
    for index in [(0, 0, 0), (4, 5, 6), (2, 3, 1)]:
        one = zeros.clone()
        one[index] = -0.5
        assert any_nonzero(one, chunk_elements=7)
        assert any_nonzero(one.transpose(0, 2), chunk_elements=7)  # not contiguous
    assert not any_nonzero(torch.zeros(0), chunk_elements=7)


def _image(data: bytes) -> tuple[pb.KernelImage, bytes]:
    return pb.KernelImage(sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data)), data


def test_rank_cores_merge_into_one_core_helios_reads_with_each_ranks_own_shards(
    prepared: PreparedModel, tmp_path: Path
) -> None:
    # Each rank exported a core of its own (here fixtures in disjoint windows); rank
    # 1's shards differ from rank 0's under the same names, and each has an image the
    # other lacks. The group's core keeps both ranks' shards and every image.
    from fake_server import build_flare

    from ignition.export.ranks import merge_rank_cores, peer_tensor_name, rank_initial

    zero, initial = tiny_fixture(prepared)
    one, _ = tiny_fixture(prepared, base=zero.window.base + zero.window.size)
    shards = {name: tensor + 1 for name, tensor in initial.items()}
    common, mine, theirs = _image(b"both"), _image(b"rank 0"), _image(b"rank 1")
    zero.images.extend([common[0], mine[0]])
    one.images.extend([theirs[0], common[0]])
    files = {image.sha256: data for image, data in (common, mine, theirs)}
    # Each rank's own qualification sequence (its digests differ) travels with it:
    # Helios replays the ranks in lockstep.
    for core, fill in ((zero, "0"), (one, "1")):
        step = core.qualification.steps.add(graph=0)
        step.digests.add(buffer=core.buffers[0].name, sha256=fill * 64)
    write_core_dir(tmp_path / "r0", zero, initial, {i.sha256: files[i.sha256] for i in zero.images})
    write_core_dir(tmp_path / "r1", one, shards, {i.sha256: files[i.sha256] for i in one.images})
    merged = merge_rank_cores([tmp_path / "r0", tmp_path / "r1"], tmp_path / "group")
    assert merged.rank_layout.world_size == 2
    assert sorted(i.sha256 for i in merged.images) == sorted(
        i[0].sha256 for i in (common, mine, theirs)
    )
    core, stored, images = read_core_dir(tmp_path / "group")
    assert len(images) == 3
    (peer,) = core.rank_layout.peers
    assert peer.qualification == one.qualification
    assert core.qualification == zero.qualification
    named = [b.initial_tensor for b in peer.buffers if b.initial_tensor]
    assert named and all(n == peer_tensor_name(1, n.split("/", 1)[1]) for n in named)
    for rank, expected in ((0, initial), (1, shards)):
        own = rank_initial(core, stored, rank)
        assert own.keys() == expected.keys()
        assert all(torch.equal(own[name], expected[name]) for name in expected)
    shown = subprocess.run(
        [str(build_flare()), "inspect", str(tmp_path / "group")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "ranks         2 (tensor parallel" in shown.stdout

    # The collectives' wait limit's place, which Helios writes at load, needs a
    # collectives region (these fixtures have none): Helios refuses it without.
    def inspect(core: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(build_flare()), "inspect", str(core)], capture_output=True, text=True, timeout=120
        )

    merge_rank_cores([tmp_path / "r0", tmp_path / "r1"], tmp_path / "limited", 528)
    limited = inspect(tmp_path / "limited")
    assert limited.returncode == 2
    assert "no window holds a collectives region" in limited.stderr
    # A rank without a sequence beside one with: Helios refuses the group's core.
    one.ClearField("qualification")
    write_core_dir(tmp_path / "r1", one, shards, {i.sha256: files[i.sha256] for i in one.images})
    merge_rank_cores([tmp_path / "r0", tmp_path / "r1"], tmp_path / "unqualified")
    refused = inspect(tmp_path / "unqualified")
    assert refused.returncode == 2
    assert "rank 0 carries a qualification sequence and rank 1 none" in refused.stderr
    # What the ranks share must agree.
    other = tiny_fixture(prepared, base=zero.window.base + 2 * zero.window.size)[0]
    other.contract.page_size *= 2
    write_core_dir(tmp_path / "r2", other, shards, {})
    with pytest.raises(CoreDirError, match=r"rank 1 .* differs from rank 0 in contract"):
        merge_rank_cores([tmp_path / "r0", tmp_path / "r2"], tmp_path / "bad")
    with pytest.raises(CoreDirError, match="two ranks or more"):
        merge_rank_cores([tmp_path / "r0"], tmp_path / "alone")


def test_a_rank_layout_written_here_is_what_helios_validates(
    prepared: PreparedModel, tmp_path: Path
) -> None:
    # Two ranks of the same preparation in disjoint windows load, and flare inspect
    # lists them; rank 1's window over rank 0's is refused, naming both.
    from fake_server import build_flare

    from ignition.export.manifest import with_rank_layout

    flare = build_flare()
    zero, initial = tiny_fixture(prepared)
    one, _ = tiny_fixture(prepared, base=zero.window.base + zero.window.size)
    core = with_rank_layout(zero, [one])
    write_core_dir(tmp_path / "two", core, initial, {})
    shown = subprocess.run(
        [str(flare), "inspect", str(tmp_path / "two")], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "ranks         2 (tensor parallel" in shown.stdout
    overlapping, _ = tiny_fixture(prepared, base=zero.window.base)
    bad = with_rank_layout(tiny_fixture(prepared)[0], [overlapping])
    write_core_dir(tmp_path / "overlap", bad, initial, {})
    refused = subprocess.run(
        [str(flare), "inspect", str(tmp_path / "overlap")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "the windows of rank 0 and rank 1 overlap" in refused.stderr
