"""A server's own account of a measurement: Flare's ``/metrics`` counters read just
before the measured requests and just after them, as differences. They attribute a
request's time the client cannot see: the prompt's preparation (rendering,
tokenization, endpoint mapping), the graph launches it cost, by kind (prefill
chunks, snapshots, restores, ...), and the model thread's time to first token (from
the request's submission to the scheduler to its first token handed to the HTTP
side), whose difference from the client's TTFT is HTTP, tokenization and thread
hand-offs; that time in two parts, before the request's first launch and from it to
its first token's record. Servers without these counters give none.
"""

from __future__ import annotations

import http.client
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from bench.suite.client import Endpoint

PREPARATION = "flare_prompt_preparation_seconds"
FIRST_TOKEN = "flare_time_to_first_token_seconds"
# The model thread's time to first token split at the request's first launch, and
# the second part again at its first sampling launch's submission.
FIRST_LAUNCH = "flare_first_launch_seconds"
FIRST_RECORD = "flare_first_record_seconds"
TO_SAMPLING = "flare_first_sampling_launch_seconds"
SAMPLING_RECORD = "flare_sampling_launch_record_seconds"
MEANS_MS = (
    (PREPARATION, "preparation_ms"),
    (FIRST_TOKEN, "server_ttft_ms"),
    (FIRST_LAUNCH, "first_launch_ms"),
    (FIRST_RECORD, "first_record_ms"),
    (TO_SAMPLING, "to_sampling_launch_ms"),
    (SAMPLING_RECORD, "sampling_record_ms"),
)
INTER_TOKEN = "flare_inter_token_latency_seconds"
DELIVERED = "flare_delivered_inter_token_seconds"
# The server's two inter-token histograms, by the key prefix of their shares: the
# model thread's (as it routes tokens) and the HTTP tasks' (as they receive them).
GAP_HISTOGRAMS = ((INTER_TOKEN, "itl"), (DELIVERED, "delivered_itl"))
# The inter-token buckets whose share of the gaps the report gives (upper bounds in ms,
# as Helios's INTER_TOKEN_BUCKETS spells them in seconds): the server's own tail,
# beside the client's gaps, which include the client's threads.
INTER_TOKEN_BOUNDS_MS = (1, 2)


def bound_label(seconds: float) -> str:
    """A bucket's ``le`` as Helios writes it: Rust's shortest digits, never an
    exponent, no trailing zeros (``5e-05`` is ``0.00005``, ``1.0`` is ``1``)."""
    text = format(Decimal(repr(seconds)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def bucket(histogram: str, bound_ms: int) -> str:
    """The sample of ``histogram``'s cumulative bucket at ``bound_ms`` milliseconds."""
    return f'{histogram}_bucket{{le="{bound_label(bound_ms / 1000)}"}}'


LAUNCH_KINDS = ("admit", "prefill", "decode", "resume", "snapshot", "restore")
COUNTERS = (
    *(f"{name}_{part}" for name, _ in MEANS_MS for part in ("sum", "count")),
    *(f"{name}_count" for name, _ in GAP_HISTOGRAMS),
    *(bucket(name, bound) for name, _ in GAP_HISTOGRAMS for bound in INTER_TOKEN_BOUNDS_MS),
    *(f"flare_launches_{kind}_total" for kind in LAUNCH_KINDS),
    "flare_prefill_tokens_total",
    "flare_prefix_hit_tokens_total",
)


def parse(text: str) -> dict[str, float]:
    """Prometheus text exposition: every sample by its name (labels included)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


def metrics_path(endpoint: Endpoint) -> str:
    """``/metrics`` beside the server's ``/v1`` routes."""
    base = urlsplit(endpoint.url).path.rstrip("/")
    return f"{base.removesuffix('/v1')}/metrics"


def scrape(endpoint: Endpoint) -> dict[str, float] | None:
    """The server's counters of ``COUNTERS`` now, or None when it exposes none."""
    connection = endpoint.connection()
    try:
        connection.request("GET", metrics_path(endpoint), headers=endpoint.headers())
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        values = parse(body.decode(errors="replace"))
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    counters = {name: values[name] for name in COUNTERS if name in values}
    return counters or None


def difference(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    """``after - before`` for the counters both have."""
    if before is None or after is None:
        return None
    return {
        name: after[name] - before[name] for name in COUNTERS if name in before and name in after
    }


def per_request(delta: dict[str, Any], requests: int) -> dict[str, float]:
    """A measurement's counters per request: preparation and the model thread's time to
    first token with its two parts (submission to the first launch, that launch to
    the first token's record) in ms (means), launches by kind; and the share of the model thread's
    inter-token gaps, and of its HTTP tasks', above each of ``INTER_TOKEN_BOUNDS_MS``."""
    if requests <= 0:
        return {}
    out: dict[str, float] = {}
    for histogram, key in MEANS_MS:
        count = delta.get(f"{histogram}_count")
        if count:
            out[key] = delta[f"{histogram}_sum"] / count * 1e3
    for kind in LAUNCH_KINDS:
        name = f"flare_launches_{kind}_total"
        if name in delta:
            out[f"{kind}_launches"] = delta[name] / requests
    for name, key in GAP_HISTOGRAMS:
        gaps = delta.get(f"{name}_count")
        for bound in INTER_TOKEN_BOUNDS_MS:
            within = delta.get(bucket(name, bound))
            if gaps and within is not None:
                out[f"{key}_over_{bound}ms"] = 1 - within / gaps
    return out
