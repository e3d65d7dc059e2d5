"""Regional compilation (``compile_scope="layer"``): one compilation per shape serves
every decoder layer, and the layer-compiled model answers as the eager one. CPU
Inductor, tiny Qwen3 checkpoints."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from checkpoints import write_tiny
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from ignition.components.kv_cache import computed_once
from ignition.preparation import prepared as prepared_module
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.compile_flags import add_compile_options, compile_options
from ignition.preparation.prepared import (
    PreparedModel,
    PrepareOptions,
    configure_compilation,
    operator_schemas_digest,
    prepare,
)
from ignition.replay.harness import Harness, Request, SamplingParams
from ignition.replay.packing import pack_admission, pack_chunk

GREEDY = SamplingParams(temperature=1.0, top_k=1)


def _options(compile: bool) -> PrepareOptions:
    return PrepareOptions(
        max_concurrency=2,
        prefill_chunk_size=128,
        context_limit=256,
        snapshot_rows=2,
        compile=compile,
        compile_scope="layer",
        compile_sampling=False,
        capture=False,
        device="cpu",
        dtype=torch.float32,
    )


def _compiled(path: Path) -> tuple[PreparedModel, tuple[int, int]]:
    """The model prepared layer-compiled, and how many graphs Dynamo compiled and
    how many operations they hold."""
    torch._dynamo.reset()
    counters.clear()
    prepared = prepare(path, _options(compile=True))
    return prepared, (counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"])


def _answers(prepared: PreparedModel) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    requests = [
        Request(i, torch.randint(3, 250, (n,), generator=gen).tolist(), 6, GREEDY, 10 + i)
        for i, n in enumerate([5, 70, 130])  # one page, two pages, two chunks
    ]
    return [result.tokens for result in Harness(prepared).run(requests)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("qwen3")
    return {n: write_tiny(root / f"layers{n}", "qwen3", layers=n) for n in (2, 3)}


def test_one_compilation_per_shape_serves_every_layer(checkpoints: dict[int, Path]) -> None:
    # Neither more graphs (a recompilation per layer) nor larger ones (a region
    # holding every layer) for a deeper model. Two layers against three: with the
    # norms fused (the default), the first layer, whose input norm stays a kernel,
    # is code of its own, and every later one shares one.
    _, two_layers = _compiled(checkpoints[2])
    _, three_layers = _compiled(checkpoints[3])
    assert two_layers[0] > 0
    assert three_layers == two_layers


def test_the_layer_compiled_model_answers_as_the_eager_one(
    checkpoints: dict[int, Path],
) -> None:
    compiled, _ = _compiled(checkpoints[3])
    eager = prepare(checkpoints[3], _options(compile=False))
    # float32 on the CPU: fused kernels round within a few ulps of eager, far from
    # the margins between greedy choices of these random weights.
    assert _answers(compiled) == _answers(eager)


def test_every_preparing_command_spells_the_compile_options_alike() -> None:
    parser = argparse.ArgumentParser()
    add_compile_options(parser)
    add_compile_options(parser, "replay-")
    args = parser.parse_args(
        ["--no-compile", "--compile-sampling", "--replay-compile-scope", "layer",
         "--replay-decode-fusion=norms", "--no-replay-programmatic-launch",
         "--early-weights"]
    )  # fmt: skip
    assert compile_options(args) == {
        "compile": False,
        "compile_scope": "forward",
        "compile_sampling": True,
        "decode_fusion": "auto",
        "programmatic_launch": True,
        "early_weights": True,
    }
    assert compile_options(args, "replay-") == {
        "compile": True,
        "compile_scope": "layer",
        "compile_sampling": None,
        "decode_fusion": "norms",
        "programmatic_launch": False,
        "early_weights": False,
    }
    with pytest.raises(SystemExit):  # a fusion that does not exist
        parser.parse_args(["--decode-fusion=all"])
    off = parser.parse_args(["--no-replay-compile-sampling"])
    assert compile_options(off, "replay-")["compile_sampling"] is False
    assert PrepareOptions(**compile_options(off, "replay-")).compile_scope == "forward"


def _prefill_logits(prepared: PreparedModel, prompt: list[int]) -> torch.Tensor:
    """The vocabulary logits after prefilling ``prompt`` into slot 1 through the
    captured graphs, in chunks of the largest prefill capacity."""
    catalog = prepared.catalog
    state, staging = prepared.storage.state, prepared.storage.staging
    pages = -(-len(prompt) // catalog.page_size)
    state.page_table[1].zero_()
    state.page_table[1, :pages] = torch.arange(1, pages + 1, dtype=torch.int32)
    pack_admission(staging, 1, prompt, 4, GREEDY, seed=5)
    prepared.execute(GraphKey(GraphKind.ADMIT, 1))
    chunk = catalog.prefill_chunk_size
    for start in range(0, len(prompt), chunk):
        tokens = prompt[start : start + chunk]
        pack_chunk(staging, 1, tokens, ends_prompt=start + chunk >= len(prompt))
        prepared.execute(GraphKey(GraphKind.PREFILL, catalog.prefill_capacity(len(tokens))))
    if staging.logits.is_cuda:
        torch.cuda.synchronize()
    return staging.logits[0].clone()


@pytest.mark.gpu
def test_layer_compiled_graphs_match_the_eager_graphs_on_gpu(
    checkpoints: dict[int, Path],
) -> None:
    # bf16 activations: the compiled norms reduce in another order than eager's, each
    # layer rounding to 2**-8; over 3 layers the logits stay well within 2**-5.
    options = replace(_options(compile=True), capture=True, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = prepare(checkpoints[3], options)
    eager = prepare(checkpoints[3], replace(options, compile=False))
    gen = torch.Generator().manual_seed(7)
    for length in (70, 200):  # one chunk; two chunks, the second over the first's pages
        prompt = torch.randint(3, 250, (length,), generator=gen).tolist()
        mine, reference = _prefill_logits(compiled, prompt), _prefill_logits(eager, prompt)
        error = (mine - reference).norm() / reference.norm()
        assert error < 2**-5, (length, float(error))


def test_a_flare_operator_schema_change_misses_the_compile_caches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Inductor keys a cached graph by its operations, not by a custom operator's
    # schema: after flare::rows_linear's norm argument changed, a graph cached before
    # called it with the old keyword and preparation failed. The schemas' digest is in
    # every compile cache key.
    configure_compilation()
    before = torch.compiler.config.cache_key_tag
    assert before.endswith(operator_schemas_digest())
    schemas = prepared_module._flare_schemas()
    changed = "flare::rows_linear(Tensor x, Tensor w, Tensor? b, Tensor? norm_weight=None)"
    monkeypatch.setattr(prepared_module, "_flare_schemas", lambda: [*schemas[1:], changed])
    configure_compilation()
    after = torch.compiler.config.cache_key_tag
    assert after != before and after.endswith(operator_schemas_digest())
    assert after.count("+flare-") == 1  # replaced, not appended again
    monkeypatch.undo()
    configure_compilation()
    assert torch.compiler.config.cache_key_tag == before


def _flare_calls(code: str, op: str) -> list[list[str]]:
    """The arguments of each call to ``flare::op`` in Inductor's generated code (the
    buffer names; a reinterpreted view's own commas are not split)."""
    calls = re.findall(rf"torch\.ops\.flare\.{op}\.default\((.*)\)\n", code)
    return [re.sub(r"reinterpret_tensor\(.*?\), \d+\)", "view", call).split(", ") for call in calls]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_steps_tables_are_computed_once_for_every_layer(
    checkpoints: dict[int, Path], tmp_path: Path, family: str
) -> None:
    # Inductor copies a pointwise input into each extern operator that takes it: the
    # 8B's decode graphs computed the sequence lengths 36 times a step, the cache rows
    # and rotary rows 28. Every layer now reads one buffer of each, at capacity 1 too
    # (one element, whose stride order Inductor does not force); with q/k norms
    # (Qwen3's) through the rotary write and attention's two launches, without (Llama's)
    # through the split kernel that does both.
    torch._dynamo.reset()
    path = checkpoints[3] if family == "qwen3" else write_tiny(tmp_path, family, layers=3)
    prepared = prepare(path, replace(_options(compile=True), compile_scope="forward"))
    for capacity in (2, 1):
        _, code = run_and_get_code(
            lambda c=capacity: prepared.execute(GraphKey(GraphKind.DECODE, c))
        )
        source = "\n".join(code)
        if family == "llama":
            attention = _flare_calls(source, "rope_decode_attention")
            assert len(attention) == 3, source
            for argument in (6, 7, 8, 11):  # the cos, sin, rows and sequence lengths
                assert len({call[argument] for call in attention}) == 1, attention
            continue
        writes = _flare_calls(source, "rope_write_kv")
        attention = _flare_calls(source, "decode_attention")
        assert len(writes) == len(attention) == 3, source
        for argument in (6, 7, 8):  # the cos, sin and rows
            assert len({call[argument] for call in writes}) == 1, writes
        assert len({call[4] for call in attention}) == 1, attention  # sequence lengths


def test_a_steps_tables_add_no_kernel_run_eagerly() -> None:
    # Without compilation (--no-compile) the tables are the tensors themselves: no
    # doubled copy of a one-element table, no kernel added to a step.
    lengths, rows = torch.tensor([7], dtype=torch.int32), torch.arange(6)
    assert computed_once(lengths) is lengths and computed_once(rows) is rows
