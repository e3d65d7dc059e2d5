"""Tensor-parallel preparation of the dense recipe on the CPU (``ignition.parallel``):
each rank's shards of the checkpoint, one process per rank over Gloo, and the group's
teacher-forced logits against one rank's (``ignition.parallel.logits_check``)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from checkpoints import CPU_OPTIONS, TINY_HYBRID, write_tiny, write_tiny_hybrid
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

from ignition.components.kv_cache import PagedKvCache
from ignition.loading.mapping import Shard
from ignition.loading.open import open_checkpoint
from ignition.loading.source import CheckpointError
from ignition.parallel import export_ranks, logits_check
from ignition.parallel.launch import spawn_ranks
from ignition.parallel.shard import TensorParallel
from ignition.parallel.window_collectives import CollectiveStorage, WindowCollectives
from ignition.preparation.prepared import plan, prepare
from ignition.replay.harness import Harness, Request, SamplingParams
from ignition.replay.teacher_forcing import compare_logits
from recipes import llama, qwen4_exp

OPTIONS = replace(CPU_OPTIONS, max_concurrency=1, context_limit=192, snapshot_rows=1)


# The hybrid's decode steps after its prefill: each runs through Triton's interpreter
# on both ranks and the single rank, about 1.5 s apiece without a GPU; eight span two
# of its selector groups (of four tokens), and after 64 tokens of prefill a new page.
HYBRID_DECODE = 8


def _run(path: Path, length: int = 96, prefill: int = 64) -> logits_check.Run:
    tokens = torch.randint(3, 512, (length,), generator=torch.Generator().manual_seed(4)).tolist()
    return logits_check.Run(path, OPTIONS, tokens, prefill=prefill, chunk=32)


@pytest.mark.parametrize(
    ("family", "tie", "bias"), [("qwen3", False, False), ("llama", True, True)]
)
def test_two_ranks_answer_as_one(tmp_path: Path, family: str, tie: bool, bias: bool) -> None:
    # Two prefill chunks, then decode steps: chunks run the canonical layers, decode
    # rows the fused residual path (the residual added by rank 0 alone). Float32:
    # only the order of additions differs (bfloat16 runs on the GPU: Triton's
    # interpreter, which runs the kernels here, does not compute bfloat16 kernels
    # faithfully). The Llama's attention projections have biases: the o projection's
    # is added once.
    path = write_tiny(tmp_path / family, family, tie=tie, attention_bias=bias)
    report = logits_check.check(_run(path), world=2)
    assert report["passed"], str(report)
    assert report["ranks_identical"] is True
    assert report["positions"] == 33
    assert float(report["relative_l2"]) < 1e-5, str(report)  # type: ignore[arg-type]


def test_two_ranks_answer_as_one_through_the_window_collectives(tmp_path: Path) -> None:
    # The export-safe kernels (interpreted, each rank in its process, over shared
    # memory) in place of Gloo: the sums, the logits' gather and the tokens' broadcast
    # of every step give the Gloo group's logits bit for bit (a two-rank float32 sum is
    # one rounding of a + b either way).
    path = write_tiny(tmp_path / "qwen3", "qwen3")
    report = logits_check.check(_run(path), world=2, collectives="window")
    assert report["passed"], str(report)
    assert report["ranks_identical"] is True
    assert report["window_matches_group"] is True
    with pytest.raises(ValueError, match="two ranks, not 3"):
        logits_check.check(_run(path), world=3, collectives="window")


def _sampling_rank(parallel: TensorParallel, path: Path, seeds: list[int], out: Path) -> None:
    prepared = prepare(path, replace(OPTIONS, parallel=parallel))
    sampling = SamplingParams(temperature=1.0)
    request = Request(0, [5, 9, 13, 17, 21], 12, sampling, seed=seeds[parallel.rank])
    (result,) = Harness(prepared).run([request])
    (out / f"rank-{parallel.rank}").write_text(" ".join(map(str, result.tokens)))


def _sampled(path: Path, seeds: list[int], out: Path) -> list[list[str]]:
    out.mkdir()
    spawn_ranks(2, _sampling_rank, path, seeds, out)
    return [(out / f"rank-{rank}").read_text().split() for rank in range(2)]


@pytest.mark.parametrize("family", ["qwen3", "hybrid"])
def test_every_rank_follows_rank_zeros_samples(tmp_path: Path, family: str) -> None:
    # The sampled tokens are broadcast from rank 0 before any state update, so the
    # ranks' replicated state (pending tokens, counters, histograms; the hybrid's
    # recurrent rows, selector ring and PLE token history, which every step's tokens
    # feed) cannot part: with a seed of its own, rank 1 still commits rank 0's tokens,
    # step after step, the tokens both ranks commit when both hold rank 0's seed.
    if family == "hybrid":
        path = write_tiny_hybrid(tmp_path / family)
    else:
        path = write_tiny(tmp_path / family, family)
    agreed = _sampled(path, [7, 7], tmp_path / "agreed")
    assert len(agreed[0]) == 12 and agreed[1] == agreed[0]
    assert _sampled(path, [7, 1007], tmp_path / "parted") == agreed
    # Rank 0's seed decides: with rank 0's changed, both commit other tokens.
    assert _sampled(path, [1007, 7], tmp_path / "swapped")[1] != agreed[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without one")
def test_a_group_export_says_at_once_that_it_needs_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        export_ranks.main([str(tmp_path), "--out", str(tmp_path / "core")])
    assert exit_.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_a_group_export_takes_one_device_per_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export_ranks._devices("0,1") == (0, 1)
    assert export_ranks._devices("0,0") == (0, 0)
    for bad in ("0", "0,1,2", "a,b", "-1,0"):
        with pytest.raises(SystemExit) as exit_:
            export_ranks.main([str(tmp_path), f"--out={tmp_path / 'c'}", f"--rank-devices={bad}"])
        assert exit_.value.code == 2
        assert "name 2 device ordinals" in capsys.readouterr().err


def test_each_rank_runs_on_a_gpu_of_its_own_or_all_on_the_current_one() -> None:
    # One H200 and two ranks: both on the current GPU (an unindexed "cuda" made
    # set_device fail in every rank on the GPU machine).
    assert logits_check.rank_device("cuda", 1, 2, gpus=1, current=0) == torch.device("cuda", 0)
    assert logits_check.rank_device("cuda", 1, 2, gpus=2, current=0) == torch.device("cuda", 1)
    assert logits_check.rank_device("cuda:3", 1, 2, gpus=8, current=0) == torch.device("cuda", 3)
    assert logits_check.rank_device("cpu", 1, 2, gpus=0, current=0) == torch.device("cpu")


def test_the_gpu_check_refuses_float32(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The prepared attention kernels take 16-bit floats on the GPU.
    with pytest.raises(SystemExit) as exit_:
        logits_check.main([str(tmp_path), "--device", "cuda", "--dtype", "float32"])
    assert exit_.value.code == 2
    assert "--dtype float32 runs on the CPU only" in capsys.readouterr().err


def test_a_rank_holds_its_shards(tmp_path: Path) -> None:
    config = open_checkpoint(write_tiny(tmp_path / "qwen3", "qwen3")).config()
    meta = torch.device("meta")
    cache = PagedKvCache(torch.empty(0))
    model = llama.LlamaModel(config, cache, torch.float32, meta, parallel=TensorParallel(1, 2))
    # 4 heads and 2 KV heads of 16, intermediate 128, vocabulary 512, hidden 64.
    shards = model.mapping.shards
    layer = "model.layers.0."
    assert shards[f"{layer}self_attn.q_proj.weight"] == Shard(0, 32, 64)
    assert shards[f"{layer}self_attn.k_proj.weight"] == Shard(0, 16, 32)
    assert shards[f"{layer}self_attn.v_proj.weight"] == Shard(0, 16, 32)
    assert shards[f"{layer}self_attn.o_proj.weight"] == Shard(1, 32, 64)
    assert shards[f"{layer}mlp.gate_proj.weight"] == Shard(0, 64, 128)
    assert shards[f"{layer}mlp.up_proj.weight"] == Shard(0, 64, 128)
    assert shards[f"{layer}mlp.down_proj.weight"] == Shard(1, 64, 128)
    assert shards["lm_head.weight"] == Shard(0, 256, 512)
    # Embeddings and norms are whole on every rank.
    assert "model.embed_tokens.weight" not in shards
    assert f"{layer}input_layernorm.weight" not in shards
    assert model.weights[f"{layer}self_attn.qkv"].shape == (64, 64)
    assert model.weights[f"{layer}mlp.gate_up"].shape == (128, 64)
    assert model.weights[f"{layer}self_attn.o_proj.weight"].shape == (64, 32)
    layout = llama.RECIPE.layout(config, torch.float32, TensorParallel(1, 2))
    assert layout.kv_heads == 1 and layout.vocab == 512
    # One rank: no shards, the model as before tensor parallelism.
    whole = llama.LlamaModel(config, cache, torch.float32, meta)
    assert whole.mapping.shards == {}
    assert set(whole.mapping.placements) == set(model.mapping.placements)


def test_what_does_not_divide_or_shard_is_refused(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "qwen3", "qwen3")
    config = open_checkpoint(path).config()
    with pytest.raises(CheckpointError, match=r"KV heads \(2\) do not divide among 4"):
        llama.RECIPE.layout(config, torch.float32, TensorParallel(0, 4))
    # Over Gloo a rank prepares eagerly: torch.distributed's collectives cannot be
    # captured. Over the window collectives (every operand at a fixed address) it may
    # compile and capture.
    with pytest.raises(CheckpointError, match="compile and capture off"):
        prepare(path, replace(OPTIONS, compile=True, parallel=TensorParallel(0, 2)))
    storages = [CollectiveStorage.allocate(1024, torch.float32, "cpu") for _ in range(2)]
    window = TensorParallel(0, 2, WindowCollectives(0, *storages))
    assert plan(path, replace(OPTIONS, compile=True, capture=True, parallel=window)).catalog
    hybrid = Qwen4ExpTextConfig(**TINY_HYBRID)  # 2 GDN key heads, 2 KV heads
    with pytest.raises(CheckpointError, match=r"linear_num_key_heads \(2\) do not divide among 4"):
        qwen4_exp.RECIPE.layout(hybrid, torch.float32, TensorParallel(0, 4))


# The tiny hybrid's heads doubled: each rank holds 2 GDN key heads (4 value heads)
# and 2 KV heads, so a rank maps several key heads to its value heads and groups
# several query heads on each KV head.
WIDER_HEADS = dict(
    linear_num_key_heads=4, linear_num_value_heads=8, num_attention_heads=8, num_key_value_heads=4
)


@pytest.mark.parametrize(
    ("tie", "wide", "chunk", "prefill"),
    [(False, False, 32, 64), (True, False, 32, 64), (False, True, 80, 80)],
)
def test_two_hybrid_ranks_answer_as_one(
    tmp_path: Path, tie: bool, wide: bool, chunk: int, prefill: int
) -> None:
    # GDN (its packed query, key and value rows and their convolution channels split
    # by head), QSA (heads split, the indexer whole on both ranks), routed and shared
    # experts split by intermediate row, hyperconnections and PLE whole: the group's
    # logits are the single rank's up to the order of the row-parallel sums. An
    # 80-token chunk runs the canonical grouped experts (over FUSED_MAX_TOKENS), a
    # 32-token chunk the decode experts' kernel.
    overrides = WIDER_HEADS if wide else {}
    path = write_tiny_hybrid(tmp_path / "hybrid", tie_word_embeddings=tie, **overrides)
    run = replace(_run(path, prefill + HYBRID_DECODE, prefill), chunk=chunk)
    report = logits_check.check(run, world=2)
    assert report["passed"], str(report)
    assert report["ranks_identical"] is True
    assert report["positions"] == HYBRID_DECODE + 1
    # Under the float32 bound (1e-5) by far: about 4e-8 measured, where a rank taking
    # another rank's dt_bias rows gave 6e-5.
    assert float(report["relative_l2"]) < 1e-6, str(report)  # type: ignore[arg-type]


def test_compiled_hybrid_ranks_answer_as_one_over_the_window_collectives(tmp_path: Path) -> None:
    # What a group's export compiles: each decoder layer a compiled region (Inductor
    # here) with the window collectives inside, each rank in its process. The ranks
    # agree bit for bit and stay within the eager bound of the single rank (Inductor's
    # fusions round differently: about 9e-8 measured, 5e-8 eager).
    path = write_tiny_hybrid(tmp_path / "hybrid")
    run = _run(path, 64 + HYBRID_DECODE)
    compiled = replace(run, options=replace(run.options, compile=True, compile_scope="layer"))
    ranks = logits_check._group_logits(compiled, 2, tmp_path / "ranks", window=True)
    assert torch.equal(ranks[0], ranks[1])
    single = logits_check._logits(run, TensorParallel())
    assert compare_logits(ranks[0], single).relative_l2 < 1e-6


def test_a_hybrid_rank_holds_its_shards() -> None:
    config = Qwen4ExpTextConfig(**TINY_HYBRID)
    shard = qwen4_exp.shards(config, TensorParallel(1, 2))
    layer = "model.layers.0."
    # GDN: 2 key heads and 4 value heads of 16; rank 1 holds key head 1 of the query
    # and of the key rows, and value heads 2 and 3 (rows 64 to 128 of the value rows).
    packed = Shard(0, 16, 32, ((48, 64), (96, 128)))
    assert shard(f"{layer}linear_attn.in_proj_qkv.weight") == packed
    assert shard(f"{layer}linear_attn.conv1d.weight") == packed
    assert shard(f"{layer}linear_attn.in_proj_z.weight") == Shard(0, 32, 64)
    assert shard(f"{layer}linear_attn.in_proj_a.weight") == Shard(0, 2, 4)
    assert shard(f"{layer}linear_attn.in_proj_b.weight") == Shard(0, 2, 4)
    assert shard(f"{layer}linear_attn.A_log") == Shard(0, 2, 4)
    assert shard(f"{layer}linear_attn.dt_bias") == Shard(0, 2, 4)
    assert shard(f"{layer}linear_attn.out_proj.weight") == Shard(1, 32, 64)
    assert shard(f"{layer}linear_attn.norm.weight") is None
    # QSA: 4 heads of 16, each head's query then its gate; 2 KV heads.
    qsa = "model.layers.3.self_attn."
    assert shard(f"{qsa}q_proj.weight") == Shard(0, 64, 128)
    assert shard(f"{qsa}k_proj.weight") == Shard(0, 16, 32)
    assert shard(f"{qsa}o_proj.weight") == Shard(1, 32, 64)
    assert shard(f"{qsa}indexer.index_qk_proj.weight") is None
    # Experts of intermediate 32 and the shared expert of 32; the router is whole.
    assert shard(f"{layer}mlp.experts.5.gate_proj.weight") == Shard(0, 16, 32)
    assert shard(f"{layer}mlp.experts.5.down_proj.weight") == Shard(1, 16, 32)
    assert shard(f"{layer}mlp.shared_expert.up_proj.weight") == Shard(0, 16, 32)
    assert shard(f"{layer}mlp.shared_expert.down_proj.weight") == Shard(1, 16, 32)
    assert shard(f"{layer}mlp.gate.weight") is None
    assert shard(f"{layer}mlp.shared_expert_gate.weight") is None
    assert shard(f"{layer}attn_hyper_connection.input_mix_weight_down.weight") is None
    assert shard("lm_head.weight") == Shard(0, 256, 512)
    assert shard("model.embed_tokens.weight") is None
    # The state a rank keeps: its value heads' recurrent matrices, its channels'
    # convolution history and its KV heads; the selectors and PLE are whole.
    layout = qwen4_exp.RECIPE.layout(config, torch.float32, TensorParallel(1, 2))
    whole = qwen4_exp.RECIPE.layout(config, torch.float32)
    rows = {f.name: f.shape for f in layout.rows}
    assert rows["gdn_state"] == (3, 2, 16, 16)
    assert rows["gdn_conv"] == (3, 64, 3)
    assert rows["ple_conv"] == {f.name: f.shape for f in whole.rows}["ple_conv"]
    assert layout.kv_heads == 1 and layout.vocab == 512
    assert layout.paged == whole.paged
    # A group of one shards nothing.
    assert qwen4_exp.shards(config, TensorParallel())("lm_head.weight") is None


def test_a_shard_of_several_ranges_is_their_concatenation() -> None:
    tensor = torch.arange(24.0).view(12, 2)
    shard = Shard(0, 2, 4, ((6, 7), (10, 12)))
    assert shard.shape((12, 2)) == (5, 2)
    assert torch.equal(shard.of(tensor), tensor[[2, 3, 6, 10, 11]])
    with pytest.raises(CheckpointError, match=r"shard \[10, 13\) of dimension 0"):
        Shard(0, 2, 4, ((10, 13),)).shape((12, 2))
    # A tied weight aliases its shard: only one range is a view.
    assert Shard(0, 2, 4).view(tensor).data_ptr() == tensor[2].data_ptr()
    with pytest.raises(ValueError, match="no view"):
        shard.view(tensor)
    groups = ((2, 16, "key heads"), (2, 16, "key heads"), (4, 16, "value heads"))
    assert TensorParallel(0, 2).spans(groups) == Shard(0, 0, 16, ((32, 48), (64, 96)))


def _rank_one_fails(parallel: TensorParallel) -> None:
    if parallel.rank == 1:
        raise ValueError("rank one fails")
    time.sleep(120)  # rank 0 would run on: the launch stops it


def test_a_failing_rank_fails_the_launch_and_stops_the_others() -> None:
    started = time.monotonic()
    with pytest.raises(Exception, match="rank one fails"):
        spawn_ranks(2, _rank_one_fails)
    assert time.monotonic() - started < 60
