"""The replay harness on CPU (eager operations): continuous batching, slot reuse,
determinism under reordering, EOS and output limits, admission errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import write_tiny

from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.harness import (
    AdmissionError,
    Harness,
    InvalidSampling,
    Request,
    SamplingParams,
    resolve_sampling,
)
from recipes.llama import SamplingDefaults

SAMPLING = SamplingParams(temperature=1.0, top_k=20, top_p=0.95)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> PreparedModel:
    path = write_tiny(tmp_path_factory.mktemp("llama"), "llama")
    options = PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=128,
        context_limit=512,
        compile=False,
        capture=False,
        device="cpu",
        dtype=torch.float32,
    )
    return prepare(Path(path), options)


def _requests(n: int, max_new: int = 12) -> list[Request]:
    gen = torch.Generator().manual_seed(5)
    return [
        Request(
            i,
            torch.randint(3, 512, (5 + 29 * i,), generator=gen).tolist(),
            max_new,
            SAMPLING,
            seed=100 + i,
        )
        for i in range(n)
    ]


def _tokens(prepared: PreparedModel, requests: list[Request]) -> dict[int, list[int]]:
    prepared.reset()
    return {r.id: r.tokens for r in Harness(prepared).run(requests)}


def test_slots_are_reused_and_every_request_completes(prepared: PreparedModel) -> None:
    harness = Harness(prepared)
    results = harness.run(_requests(10))
    assert [r.id for r in results] == list(range(10))
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert all(len(r.tokens) == 12 for r in results if r.finish_reason == "length")
    assert sorted(harness.free_slots) == [1, 2, 3, 4]
    assert harness.pages.available() == prepared.storage.cache.pages - 1
    decode_rows = {s.rows for s in harness.steps if s.kind == "decode"}
    assert {1, 2, 3, 4} <= decode_rows | {1, 2, 3, 4} and max(decode_rows) == 4


def test_outputs_do_not_depend_on_order_or_packing(prepared: PreparedModel) -> None:
    requests = _requests(7)
    first = _tokens(prepared, requests)
    assert _tokens(prepared, requests) == first
    assert _tokens(prepared, list(reversed(requests))) == first
    assert _tokens(prepared, requests[1::2] + requests[::2]) == first


def test_logit_trace_has_one_step_per_token_and_ignores_packing(
    prepared: PreparedModel,
) -> None:
    requests = _requests(5)
    traces = []
    for order in (requests, list(reversed(requests))):
        prepared.reset()
        harness = Harness(prepared, trace_logits=True)
        results = {r.id: r for r in harness.run(order)}
        assert harness.logit_trace is not None
        assert all(len(harness.logit_trace[i]) == len(r.tokens) for i, r in results.items())
        for steps in harness.logit_trace.values():
            assert [s.kind for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
            assert all(s.row < s.capacity and s.pages and s.slot > 0 for s in steps)
        traces.append(harness.logit_trace)
    for request_id, steps in traces[0].items():
        other = traces[1][request_id]
        assert [s.kind for s in steps] == [s.kind for s in other]
        assert all(torch.equal(a.logits, b.logits) for a, b in zip(steps, other, strict=True))


def test_output_limit_and_stop_token(prepared: PreparedModel) -> None:
    greedy = SamplingParams(temperature=1.0, top_k=1)
    eos = int(prepared.storage.state.stop_tokens[0])
    for start in range(3, 60):  # a prompt whose greedy first token is not EOS
        prompt = list(range(start, start + 37))
        (one,) = Harness(prepared).run([Request(0, prompt, 1, greedy, seed=1)])
        if one.tokens != [eos]:
            break
    assert one.finish_reason == "length" and len(one.tokens) == 1
    stop = prepared.storage.state.stop_tokens
    saved = stop.clone()
    try:
        stop.fill_(-1)
        stop[0] = one.tokens[0]
        prepared.reset()
        (stopped,) = Harness(prepared).run([Request(0, prompt, 30, greedy, seed=1)])
        assert stopped.finish_reason == "stop" and stopped.tokens == one.tokens
    finally:
        stop.copy_(saved)


@pytest.mark.parametrize(
    "request_",
    [
        Request(0, list(range(3, 500)), 64, SAMPLING, 0),
        Request(0, [3, 4], 4, SamplingParams(temperature=0.0), 0),
        Request(0, [], 4, SAMPLING, 0),
        Request(0, [3, 100000], 4, SAMPLING, 0),
        Request(0, [3], 0, SAMPLING, 0),
    ],
)
def test_requests_outside_the_contract_are_rejected(
    prepared: PreparedModel, request_: Request
) -> None:
    with pytest.raises(AdmissionError):
        Harness(prepared).run([request_])


def test_sampling_values_clamp_to_the_recipe_ranges() -> None:
    wild = dict(
        temperature=9.0,
        top_k=-1,
        top_p=0.0,
        min_p=2.0,
        repetition_penalty=0.1,
        presence_penalty=5.0,
        frequency_penalty=-5.0,
    )
    clamped = resolve_sampling(SamplingDefaults(), **wild)
    assert clamped == SamplingParams(
        temperature=2.0,
        top_k=0,
        top_p=0.01,
        min_p=1.0,
        repetition_penalty=0.5,
        presence_penalty=2.0,
        frequency_penalty=-2.0,
    )
    assert isinstance(clamped.top_k, int)
    given = {name: getattr(SAMPLING, name) for name in wild}
    assert resolve_sampling(SamplingDefaults(), **given) == SAMPLING


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        (SamplingParams(temperature=9.0), "temperature"),
        (SamplingParams(temperature=1.0, top_k=-1), "top_k"),
        (SamplingParams(temperature=1.0, presence_penalty=float("nan")), "presence_penalty"),
    ],
)
def test_unresolved_sampling_is_refused_naming_the_field(
    prepared: PreparedModel, sampling: SamplingParams, field: str
) -> None:
    """The harness packs resolved parameters: one no request resolves to under the
    core's policy is refused, not changed."""
    with pytest.raises(InvalidSampling) as raised:
        Harness(prepared).run([Request(7, [3, 4], 4, sampling, 0)])
    assert raised.value.field == field
    assert str(raised.value).startswith(f"request 7: {field} ")


def test_a_resolved_request_runs(prepared: PreparedModel) -> None:
    sampling = resolve_sampling(prepared.defaults, temperature=9.0, top_k=-1)
    assert (sampling.temperature, sampling.top_k) == (2.0, 0)
    (result,) = Harness(prepared).run([Request(0, [3, 4], 3, sampling, 0)])
    assert result.tokens
