"""The sampling policy (``ignition.replay.sampling_policy``) on the fixture it shares with
Helios (``helios/tests/fixtures/sampling/policy.json``), the manifest's sampling message
as Helios reads it, and the verified defaults keyed by checkpoint fingerprint (CPU)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoints import write_tiny

from ignition.export import flare_core_pb2 as pb
from ignition.export.manifest import sampling_message
from ignition.loading.default_model import default_model_path
from ignition.loading.gguf import GgufCheckpoint
from ignition.loading.open import open_checkpoint
from ignition.replay.harness import AdmissionError
from ignition.replay.packing import SamplingParams
from ignition.replay.sampling_policy import (
    PARAMETERS,
    InvalidSampling,
    check_resolved,
    resolve_sampling,
)
from recipes import llama
from recipes.llama import SamplingDefaults

FIXTURE = Path(__file__).resolve().parents[1] / "helios/tests/fixtures/sampling/policy.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["cases"]
SMOLLM2 = SamplingDefaults(temperature=0.2, top_p=0.9)


def f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def defaults_of(case: dict[str, Any]) -> SamplingDefaults:
    fields = dict(case["defaults"])
    ranges = fields.pop("ranges")
    return SamplingDefaults(
        **fields, ranges=tuple((name, low, high) for name, (low, high) in ranges.items())
    )


def assert_resolves_to(params: SamplingParams, expected: dict[str, Any]) -> None:
    assert isinstance(params.top_k, int) and params.top_k == expected["top_k"]
    for name in PARAMETERS:
        if name != "top_k":
            assert f32(getattr(params, name)) == f32(expected[name]), name


def test_the_fixture_has_the_documented_shape() -> None:
    assert 12 <= len(CASES) <= 20
    assert len({case["name"] for case in CASES}) == len(CASES)
    for case in CASES:
        assert set(case) in (
            {"name", "defaults", "request", "expected"},
            {"name", "defaults", "request", "error"},
        ), case["name"]
        defaults = case["defaults"]
        assert set(defaults) == {*PARAMETERS, "ranges"}
        assert set(defaults["ranges"]) <= set(PARAMETERS)
        assert all(len(bounds) == 2 for bounds in defaults["ranges"].values())
        assert isinstance(defaults["top_k"], int)
        assert set(case["request"]) <= set(PARAMETERS)
        assert isinstance(case["request"].get("top_k", 0), int)
        if "expected" in case:
            assert set(case["expected"]) == set(PARAMETERS)
            assert isinstance(case["expected"]["top_k"], int)
        else:
            assert case["error"] in PARAMETERS


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_resolve_sampling_on_the_shared_fixture(case: dict[str, Any]) -> None:
    defaults = defaults_of(case)
    if "error" in case:
        with pytest.raises(InvalidSampling) as raised:
            resolve_sampling(defaults, **case["request"])
        assert raised.value.field == case["error"]
        assert str(raised.value).startswith(case["error"])
        assert isinstance(raised.value, AdmissionError)
        return
    params = resolve_sampling(defaults, **case["request"])
    assert_resolves_to(params, case["expected"])
    # What the policy produces, the harness's admission accepts.
    check_resolved(defaults, params)


def _resolve_in_float32(case: dict[str, Any]) -> dict[str, float | int]:
    """An independent float32 model of Helios's resolve (numpy float32 arithmetic)."""
    with np.errstate(over="ignore"):
        request = {name: np.float32(value) for name, value in case["request"].items()}
        ranges = {
            name: (np.float32(low), np.float32(high))
            for name, (low, high) in case["defaults"]["ranges"].items()
        }
    if "top_k" in request and case["request"]["top_k"] in (-1, 0):
        request["top_k"] = np.float32(0.0)
    out: dict[str, float | int] = {}
    for name in PARAMETERS:
        default = np.float32(case["defaults"][name])
        value = request.get(name)
        if value is not None and name in ranges:
            low, high = ranges[name]
            default = np.minimum(np.maximum(value, low), high)
        out[name] = int(max(float(default), 0.0)) if name == "top_k" else float(default)
    return out


@pytest.mark.parametrize(
    "case",
    [case for case in CASES if "expected" in case],
    ids=[case["name"] for case in CASES if "expected" in case],
)
def test_the_fixture_expectations_hold_in_float32(case: dict[str, Any]) -> None:
    """Every expectation is what float32 arithmetic gives (what Helios computes)."""
    resolved = _resolve_in_float32(case)
    assert resolved["top_k"] == case["expected"]["top_k"]
    for name in PARAMETERS:
        if name != "top_k":
            assert resolved[name] == f32(case["expected"][name]), name


def test_checks_follow_helios_order_and_name_the_field() -> None:
    neutral = SamplingDefaults()
    with pytest.raises(InvalidSampling) as raised:
        resolve_sampling(neutral, top_k=-2, top_p=math.nan)
    assert raised.value.field == "top_k"
    for name in ("top_p", "min_p", "repetition_penalty", "presence_penalty"):
        with pytest.raises(InvalidSampling) as raised:
            resolve_sampling(neutral, **{name: math.inf, "frequency_penalty": math.nan})
        assert raised.value.field == name
    with pytest.raises(InvalidSampling) as raised:
        resolve_sampling(neutral, temperature=math.nan)
    assert raised.value.field == "temperature"


def _read_like_helios(message: pb.SamplingDefaults) -> SamplingDefaults:
    """``SamplingPolicy::from_core``: a range where ``*_range`` is set, none otherwise."""
    ranges = tuple(
        (name, getattr(message, f"{name}_range").min, getattr(message, f"{name}_range").max)
        for name in PARAMETERS
        if message.HasField(f"{name}_range")
    )
    return SamplingDefaults(**{name: getattr(message, name) for name in PARAMETERS}, ranges=ranges)


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_the_manifest_sampling_message_round_trips_as_helios_reads_it(
    case: dict[str, Any],
) -> None:
    defaults = defaults_of(case)
    message = pb.SamplingDefaults()
    message.ParseFromString(sampling_message(defaults).SerializeToString())
    declared = {name: (low, high) for name, low, high in defaults.ranges}
    for name in PARAMETERS:
        assert message.HasField(f"{name}_range") == (name in declared), name
        if name in declared:
            bounds = getattr(message, f"{name}_range")
            assert (bounds.min, bounds.max) == tuple(f32(v) for v in declared[name])
        assert getattr(message, name) == f32(getattr(defaults, name)), name
    read = _read_like_helios(message)
    if "error" in case:
        with pytest.raises(InvalidSampling):
            resolve_sampling(read, **case["request"])
    else:
        assert_resolves_to(resolve_sampling(read, **case["request"]), case["expected"])


def test_check_resolved_refuses_what_no_request_resolves_to() -> None:
    fixed = SamplingDefaults(temperature=0.5, ranges=(("top_p", 0.25, 0.75),))
    accepted = resolve_sampling(fixed, temperature=1.5, top_p=0.5, min_p=0.25)
    assert accepted == SamplingParams(temperature=0.5, top_p=0.5)
    check_resolved(fixed, accepted)
    for params, field in [
        (SamplingParams(temperature=1.5, top_p=0.5), "temperature"),  # fixed at 0.5
        (SamplingParams(temperature=0.5, top_p=0.9), "top_p"),  # outside its range
        (SamplingParams(temperature=0.5, top_p=0.5, top_k=-1), "top_k"),
        (SamplingParams(temperature=0.0, top_p=0.5), "temperature"),
        (SamplingParams(temperature=0.5, top_p=0.5, min_p=math.inf), "min_p"),
        (SamplingParams(temperature=0.5, top_p=0.5, min_p=0.25), "min_p"),  # fixed at 0
    ]:
        with pytest.raises(InvalidSampling) as raised:
            check_resolved(fixed, params)
        assert raised.value.field == field


def test_the_embedded_default_model_gets_smollm2_defaults() -> None:
    fingerprint = GgufCheckpoint(default_model_path()).fingerprint()
    assert fingerprint in llama.VERIFIED_DEFAULTS
    assert llama.sampling_defaults(fingerprint) == SMOLLM2
    assert llama.sampling_defaults(fingerprint).ranges == SamplingDefaults().ranges
    params = resolve_sampling(llama.sampling_defaults(fingerprint), temperature=1.0)
    assert (params.temperature, params.top_p) == (1.0, 0.9)


def test_other_fingerprints_get_neutral_defaults(tmp_path: Path) -> None:
    assert llama.sampling_defaults("0" * 64) == SamplingDefaults()
    # The name of a checkpoint's directory or file is no key.
    assert llama.sampling_defaults("SmolLM2-135M-Instruct") == SamplingDefaults()
    named = write_tiny(tmp_path / "SmolLM2-135M-Instruct", "llama")
    assert llama.sampling_defaults(open_checkpoint(named).fingerprint()) == SamplingDefaults()
