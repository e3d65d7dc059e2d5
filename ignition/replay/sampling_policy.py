"""The sampling policy: a request's sampling fields resolved against the core's
declared defaults into the graphs' ``SamplingParams``.

The same rules as Helios's ``SamplingPolicy::resolve`` (``helios/src/http/sampling.rs``),
held equal by one shared fixture, ``helios/tests/fixtures/sampling/policy.json``, that
``tests/test_sampling_policy.py`` and ``helios/tests/sampling_policy.rs`` both read
(its layout: ``helios/tests/fixtures/sampling/README.md``):

1. Values that mean nothing raise ``InvalidSampling`` naming the field, checked in this
   order: a ``temperature`` that is not a finite number above 0 (the graphs always
   sample); a ``top_k`` below -1 (-1 and 0 disable it: both become 0); a non-finite
   ``top_p``, ``min_p``, ``repetition_penalty``, ``presence_penalty`` or
   ``frequency_penalty``.
2. Each of the seven parameters takes the request's value clamped into the inclusive
   range the core declares for it (``SamplingDefaults.ranges``) when the request gives
   one and a range is declared; otherwise (omitted, or no range) the declared default.
   A parameter without a range is therefore fixed at its default. ``top_k`` clamps as a
   float and then becomes a non-negative integer.
3. The seed is the request's (not part of the policy).

Helios computes in float32 (the manifest's fields are floats). The checks here look at
each value rounded to float32 (so a value beyond float32's range is non-finite and a
positive temperature that rounds to 0 is refused, as in Helios), and ``top_k`` is
clamped in float32. The other parameters are clamped in float64; rounding is monotone,
so each equals Helios's float32 result once rounded to float32, which packing does.

Who resolves: callers that answer a *request* (``ignition replay``'s flags,
``bench.suite.replay_floor``, the acceptance's sample answers) call ``resolve_sampling``
with what the request gives (``None`` for an omitted field). The replay harness, like
Helios's scheduler, packs the resolved ``SamplingParams`` it is given and resolves
nothing again (resolution is not idempotent: a ``top_k`` of 0 given against a range
starting at 1 becomes 1, while an omitted one takes a default of 0). Its admission
calls ``check_resolved``, which refuses, naming the field, parameters that no request
could resolve to under the core's policy instead of silently changing them; so what the
harness runs is what Helios runs for a request giving the same values.
"""

from __future__ import annotations

import math
import operator
import struct
from typing import TYPE_CHECKING, Final

from ignition.replay.errors import InvalidSampling
from ignition.replay.packing import SamplingParams

if TYPE_CHECKING:
    from recipes.interface import SamplingDefaults

__all__ = [
    "FLOAT_PARAMETERS",
    "PARAMETERS",
    "InvalidSampling",
    "check_resolved",
    "declared_ranges",
    "resolve_sampling",
]

# The float parameters whose non-finite values are refused, in Helios's checking order.
FLOAT_PARAMETERS: Final = (
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
# Every resolved parameter, in the order of Helios's ``SamplingPolicy``.
PARAMETERS: Final = ("temperature", "top_k", *FLOAT_PARAMETERS)

_U32_MAX: Final = 4294967295.0
_TEMPERATURE: Final = "must be a number greater than 0 (greedy decoding is not supported)"
_TOP_K: Final = "must be -1, 0 or a positive integer"
_FINITE: Final = "must be a finite number"


def _f32(value: float) -> float:
    """``value`` rounded to float32, as Helios holds it (infinite beyond float32's range)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _as_u32(value: float) -> int:
    """Rust's ``value.max(0.0) as u32``: NaN is 0, truncation, saturation."""
    if math.isnan(value):
        return 0
    return int(min(max(value, 0.0), _U32_MAX))


def declared_ranges(defaults: SamplingDefaults) -> dict[str, tuple[float, float]]:
    """The declared inclusive ranges by parameter name; an absent name has none."""
    ranges: dict[str, tuple[float, float]] = {}
    for name, low, high in defaults.ranges:
        if name not in PARAMETERS:
            raise ValueError(f"a range for {name!r}, which is no sampling parameter")
        ranges[name] = (low, high)
    return ranges


def _resolve(requested: float | None, default: float, bounds: tuple[float, float] | None) -> float:
    """The request's value clamped into the range, else the default."""
    if requested is None or bounds is None:
        return float(default)
    low, high = bounds
    if not _f32(low) <= _f32(high):
        # Helios's f32::clamp panics on an empty or NaN range: a malformed core.
        raise ValueError(f"the core declares an empty range [{low}, {high}]")
    return float(min(max(requested, low), high))


def _check_top_k(top_k: int) -> int:
    try:
        return operator.index(top_k)
    except TypeError:
        raise InvalidSampling("top_k", _TOP_K) from None


def resolve_sampling(
    defaults: SamplingDefaults,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
) -> SamplingParams:
    """The graphs' parameters of a request's sampling fields (``None``: omitted) under
    the core's declared ``defaults``; ``InvalidSampling`` names a meaningless field."""
    if temperature is not None:
        t = _f32(temperature)
        if not (math.isfinite(t) and t > 0.0):
            raise InvalidSampling("temperature", _TEMPERATURE)
    requested_k: float | None = None
    if top_k is not None:
        k = _check_top_k(top_k)
        if k in (-1, 0):
            requested_k = 0.0
        elif k > 0:
            requested_k = _f32(k)
        else:
            raise InvalidSampling("top_k", _TOP_K)
    given = {
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
    }
    for name in FLOAT_PARAMETERS:
        value = given[name]
        if value is not None and not math.isfinite(_f32(value)):
            raise InvalidSampling(name, _FINITE)
    ranges = declared_ranges(defaults)
    k_bounds = ranges.get("top_k")
    if k_bounds is not None:
        k_bounds = (_f32(k_bounds[0]), _f32(k_bounds[1]))
    resolved_k = _resolve(requested_k, _f32(defaults.top_k), k_bounds)
    floats = {
        name: _resolve(given[name], getattr(defaults, name), ranges.get(name))
        for name in FLOAT_PARAMETERS
    }
    return SamplingParams(
        temperature=_resolve(temperature, defaults.temperature, ranges.get("temperature")),
        top_k=_as_u32(_f32(resolved_k)),
        **floats,
    )


def check_resolved(defaults: SamplingDefaults, params: SamplingParams) -> None:
    """Raise ``InvalidSampling`` naming the first parameter (in ``PARAMETERS`` order)
    that no request resolves to under ``defaults``: valid values are a finite
    temperature above 0, an integer ``top_k`` of at least 0, finite floats, each the
    declared default or, where a range is declared, inside it (compared in float32)."""
    t = _f32(params.temperature)
    if not (math.isfinite(t) and t > 0.0):
        raise InvalidSampling("temperature", _TEMPERATURE)
    if _check_top_k(params.top_k) < 0:
        raise InvalidSampling("top_k", "must be 0 (disabled) or a positive integer")
    for name in FLOAT_PARAMETERS:
        if not math.isfinite(_f32(getattr(params, name))):
            raise InvalidSampling(name, _FINITE)
    ranges = declared_ranges(defaults)
    for name in PARAMETERS:
        value = _f32(getattr(params, name))
        declared = getattr(defaults, name)
        default = _as_u32(_f32(declared)) if name == "top_k" else _f32(declared)
        if value == default:
            continue
        bounds = ranges.get(name)
        if bounds is None:
            raise InvalidSampling(name, f"is fixed at the core's default {declared}")
        low, high = bounds
        if not _f32(low) <= value <= _f32(high):
            raise InvalidSampling(name, f"must be inside the core's range [{low}, {high}]")
