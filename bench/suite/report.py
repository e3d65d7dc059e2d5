"""Results of several engines into one summary: the bandwidth roofline, a table of
ratios (Flare / each baseline, Flare / roofline; each workload separate) as markdown,
and PNG plots beside it.

    python -m bench.suite.report flare.json transformers.json floor.json \\
        [--flare flare] [--geometry smollm2-135m] [--bandwidth-gbs 4000] [--out-dir DIR]

The roofline of one decode step is the bytes it must read divided by the read
bandwidth measured on the device: every weight once (a tied model reads its
embedding table in full as the LM head; an untied one reads one embedding row per
sequence and the LM head in full) plus, per sequence, K and V of every layer for
every position of its context. Bytes per decoded token at bf16:

==============================  ================  ==================
                                SmolLM2-135M      Qwen3-8B
==============================  ================  ==================
parameters                      134,515,008       8,190,735,360
stored weights                  269,030,016 B     16,381,470,720 B
weights read per step (batch 1) 269,030,016 B     15,136,819,200 B
K+V per context position        23,040 B          147,456 B
one step, batch 1, context 4096 363,401,856 B     15,740,798,976 B
==============================  ================  ==================

(SmolLM2-135M: 30 layers, hidden 576, 9 heads, 3 KV heads, head dim 64, intermediate
1536, vocab 49152, tied. Qwen3-8B: 36 layers, hidden 4096, 32 heads, 8 KV heads, head
dim 128, intermediate 12288, vocab 151936, untied, q/k norms. ``test_bench_suite``
recomputes the table.) At 4.0 TB/s a batch-1 step is 67 µs for SmolLM2 (launch-bound
in practice) and 3.78 ms for Qwen3-8B.

A hybrid MoE model (``qwen4_exp_text``: a ``config.json`` with ``num_experts``, or the
name ``qwen4-exp-h200``) reads only the routed experts and table rows its tokens
select, and per sequence a recurrent state and a bounded K/V selection:
``SparseGeometry`` in ``bench/suite/sparse_geometry.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.suite.client import (
    Sample,
    client_ttft_rows,
    client_ttft_summary,
    decode_tokens_per_s,
    itl_values,
    median,
    p99,
    prefill_tokens_per_s,
    throughput_tokens_per_s,
)
from bench.suite.server_metrics import per_request
from bench.suite.sparse_geometry import SparseGeometry


@dataclass(frozen=True)
class Geometry:
    """What a decode step reads, from a dense model's declared shapes."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    dtype_bytes: int = 2
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any], dtype_bytes: int = 2) -> Geometry:
        """From a Transformers ``config.json`` (q/k norms are not declared there; pass
        ``qk_norm`` yourself when the family has them)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes,
        )

    def layer_parameters(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return q + kv + o + mlp + norms

    def parameters(self) -> int:
        embedding = self.vocab * self.hidden
        head = 0 if self.tied else embedding
        return self.layers * self.layer_parameters() + self.hidden + embedding + head

    def weight_bytes(self) -> int:
        return self.parameters() * self.dtype_bytes

    def weight_bytes_read(self, batch: int = 1) -> int:
        """Weights one decode step of ``batch`` sequences reads."""
        if self.tied:
            return self.weight_bytes()
        table = self.vocab * self.hidden
        return (self.parameters() - table + batch * self.hidden) * self.dtype_bytes

    def kv_bytes_per_position(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def bytes_per_step(self, batch: int = 1, context: int = 0) -> int:
        """Bytes one decode step reads: weights once, each sequence's K and V."""
        return self.weight_bytes_read(batch) + batch * context * self.kv_bytes_per_position()


GEOMETRIES = {
    "smollm2-135m": Geometry(30, 576, 9, 3, 64, 1536, 49152, tied=True),
    "qwen3-8b": Geometry(36, 4096, 32, 8, 128, 12288, 151936, tied=False, qk_norm=True),
}


class StepGeometry(Protocol):
    """What the roofline needs of a geometry: dense (``Geometry``) or hybrid MoE
    (``SparseGeometry``)."""

    def weight_bytes(self) -> int: ...

    def weight_bytes_read(self, batch: int = 1) -> int: ...

    def bytes_per_step(self, batch: int = 1, context: int = 0) -> int: ...


@functools.cache
def _qwen4_exp_h200() -> SparseGeometry:
    # Imports Transformers and builds a meta model: only when this name is asked for.
    from ignition.loading.random_weights import GEOMETRIES as CONFIGS

    return SparseGeometry.from_config(CONFIGS["qwen4-exp-h200"]().to_dict())


# Named geometries built on first use (their construction is not free).
LAZY_GEOMETRIES: dict[str, Callable[[], StepGeometry]] = {"qwen4-exp-h200": _qwen4_exp_h200}
GEOMETRY_NAMES = (*GEOMETRIES, *LAZY_GEOMETRIES)


def prefilled_tokens(sample: Sample) -> int | None:
    """Prompt tokens the server prefilled: the prompt less what it reports cached;
    None when it reports neither."""
    if sample.prompt_tokens is None or sample.cached_tokens is None:
        return None
    return sample.prompt_tokens - sample.cached_tokens


def served_cold(sample: Sample) -> bool:
    """Whether a request meant to be cold was: the server reported no prompt token
    cached (or does not report caching)."""
    return not sample.cached_tokens


def meant_cold(measurement: str, sample: Sample) -> bool:
    """Whether a request is meant to be cold: every long prompt, and the cache-filling
    half of each prefix pair."""
    kind = measurement.split("-", 1)[0]
    return kind == "long" or (kind == "prefix" and sample.meta.get("role") == "prefix")


def roofline_step_s(
    geometry: StepGeometry, bandwidth: float, batch: int = 1, context: int = 0
) -> float:
    """Seconds per decode step (= per token of each sequence) at ``bandwidth`` bytes/s."""
    return geometry.bytes_per_step(batch, context) / bandwidth


def geometry_from_dict(data: dict[str, Any]) -> StepGeometry:
    """A ``config.json``'s fields (a hybrid MoE one, with ``num_experts``, gives a
    ``SparseGeometry``), or a geometry's own fields (as ``asdict`` wrote them)."""
    if "num_hidden_layers" in data:
        if "num_experts" in data:
            return SparseGeometry.from_config(data)
        return Geometry.from_config(data)
    if "num_experts" in data:
        return SparseGeometry(**data)
    return Geometry(**data)


def resolve_geometry(name: str) -> StepGeometry:
    """A named geometry, a ``config.json`` path, or a JSON object of the fields."""
    if name in GEOMETRIES:
        return GEOMETRIES[name]
    if name in LAZY_GEOMETRIES:
        return LAZY_GEOMETRIES[name]()
    text = name if name.lstrip().startswith("{") else Path(name).read_text()
    return geometry_from_dict(json.loads(text))


# ---------------------------------------------------------------- metrics


# Rows from the server's counters, per request of a measurement.
SERVER_ROWS = (
    ("preparation_ms", "server: prompt preparation per request (ms)"),
    ("server_ttft_ms", "server: model thread's TTFT, mean (ms)"),
    ("first_launch_ms", "server: submission to first launch, mean (ms)"),
    ("first_record_ms", "server: first launch to first token's record, mean (ms)"),
    ("to_sampling_launch_ms", "server: first launch to first sampling launch, mean (ms)"),
    ("sampling_record_ms", "server: sampling launch to first token's record, mean (ms)"),
    ("prefill_launches", "server: prefill chunks per request"),
    ("snapshot_launches", "server: snapshots per request"),
    ("restore_launches", "server: restores per request"),
    ("itl_over_1ms", "server: inter-token gaps over 1 ms (share)"),
    ("itl_over_2ms", "server: inter-token gaps over 2 ms (share)"),
    ("delivered_itl_over_1ms", "server: HTTP tasks' inter-token gaps over 1 ms (share)"),
    ("delivered_itl_over_2ms", "server: HTTP tasks' inter-token gaps over 2 ms (share)"),
)


# Rows of the clients measurement: the same chats through the suite's client and the
# openai SDK (``client_ttft_rows``'s fields, medians over the prompts).
CLIENT_ROWS = (
    ("ttft_ms", "chat TTFT, suite client (ms)"),
    ("ttft_sdk_ms", "chat TTFT, openai SDK (ms)"),
    ("first_event_to_content_ms", "first SSE event to first content, suite client (ms)"),
    ("first_event_to_content_sdk_ms", "first SSE event to first content, openai SDK (ms)"),
)
# An SDK TTFT this far above the suite client's (median of the pairs) is a stall only
# SDK users see, called out in the notes.
SDK_STALL_MS = 5.0


@dataclass(frozen=True)
class Row:
    """One line of the summary: a metric of one workload."""

    key: str
    workload: str
    label: str
    higher_is_better: bool


def repeat_checks(samples: list[Sample]) -> list[dict[str, Any]]:
    """Each repeated agent request (``meta["repeat_of"]``) against its first answer:
    the prompt tokens the repeat restored from the cache, and whether its answer is
    the first one's, text and finish reason alike."""
    first = {s.request: s for s in samples if s.meta.get("branch") != "repeat"}
    checks = []
    for repeat in samples:
        original = first.get(repeat.meta.get("repeat_of", ""))
        if repeat.meta.get("branch") != "repeat" or original is None:
            continue
        checks.append(
            {
                "request": original.request,
                "prompt_tokens": repeat.prompt_tokens,
                "cached_tokens": repeat.cached_tokens,
                "output_tokens": repeat.output_tokens,
                "same": repeat.text == original.text
                and repeat.finish_reason == original.finish_reason
                and repeat.output_tokens == original.output_tokens,
            }
        )
    return checks


def samples_of(result: dict[str, Any]) -> dict[str, list[Sample]]:
    """Successful samples by measurement."""
    grouped: dict[str, list[Sample]] = defaultdict(list)
    for data in result.get("samples", []):
        sample = Sample.from_json(data)
        if sample.ok:
            grouped[sample.measurement].append(sample)
    return grouped


def _med(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def engine_metrics(result: dict[str, Any]) -> dict[Row, float]:
    """Every metric the samples of one engine support (times in ms, rates in tok/s)."""
    metrics: dict[Row, float] = {}

    def put(row: Row, value: float | None) -> None:
        if value is not None:
            metrics[row] = value

    for name, samples in samples_of(result).items():
        kind = name.split("-", 1)[0]
        # A cold row counts only the requests the server did serve cold.
        samples = [s for s in samples if served_cold(s) or not meant_cold(name, s)]
        if kind == "long":
            tokens = int(name.split("-")[1])
            ttft = _med([s.ttft_s for s in samples])
            put(
                Row(f"ttft-{tokens}", name, f"cold TTFT, {tokens} tokens (ms)", False),
                None if ttft is None else ttft * 1e3,
            )
            put(
                Row(f"prefill-{tokens}", name, f"prefill, {tokens} tokens (tok/s)", True),
                _med([prefill_tokens_per_s(s) for s in samples]),
            )
        elif kind == "decode":
            c = name.split("-c")[1]
            gaps = itl_values(samples)
            if gaps:
                put(Row(f"itl-p50-c{c}", name, f"ITL p50, c={c} (ms)", False), median(gaps) * 1e3)
                put(Row(f"itl-p99-c{c}", name, f"ITL p99, c={c} (ms)", False), p99(gaps) * 1e3)
            put(
                Row(f"decode-c{c}", name, f"decode per request, c={c} (tok/s)", True),
                _med([decode_tokens_per_s(s) for s in samples]),
            )
            put(
                Row(f"throughput-c{c}", name, f"decode throughput, c={c} (tok/s)", True),
                throughput_tokens_per_s(samples),
            )
        elif kind == "prefix":
            for role, label in (("prefix", "cold prefix"), ("hit", "prefix-hit")):
                ttft = _med([s.ttft_s for s in samples if s.meta.get("role") == role])
                put(
                    Row(f"prefix-{role}", name, f"{label} TTFT (ms)", False),
                    None if ttft is None else ttft * 1e3,
                )
        elif kind == "agent":
            main = sorted(
                (s for s in samples if s.meta.get("branch") == "main"),
                key=lambda s: s.meta["turn"],
            )
            fork = [s for s in samples if s.meta.get("branch") == "fork"]
            ttft = _med([s.ttft_s for s in main])
            put(
                Row("agent-p50", name, "agent TTFT per turn, median (ms)", False),
                ttft and ttft * 1e3,
            )
            if main:
                last = main[-1]
                put(
                    Row("agent-last", name, "agent TTFT, last turn (ms)", False),
                    None if last.ttft_s is None else last.ttft_s * 1e3,
                )
                put(
                    Row("agent-last-tokens", name, "agent prompt tokens, last turn", True),
                    last.prompt_tokens,
                )
                put(
                    Row("agent-last-prefilled", name, "agent prefilled tokens, last turn", False),
                    prefilled_tokens(last),
                )
            ttft = _med([s.ttft_s for s in fork])
            put(Row("agent-fork", name, "agent fork TTFT (ms)", False), ttft and ttft * 1e3)
            repeats = repeat_checks(samples)
            if repeats:
                put(
                    Row("agent-repeat-same", name, "agent repeats answered as the first", True),
                    sum(check["same"] for check in repeats),
                )
        elif kind == "tools":
            ttft = _med([s.ttft_s for s in samples])
            put(Row("tools-ttft", name, "tool-use TTFT (ms)", False), ttft and ttft * 1e3)
        elif kind == "clients":
            summary = client_ttft_summary(client_ttft_rows(samples))
            for key, label in CLIENT_ROWS:
                put(Row(f"clients-{key}", name, label, False), summary[key])
    # The server's own account of each measurement (Flare's /metrics differences).
    for name, entry in (result.get("server_metrics") or {}).items():
        per = per_request(entry["delta"], entry["requests"])
        for key, label in SERVER_ROWS:
            put(Row(f"server-{key}-{name}", name, label, False), per.get(key))
    # Until the engine answers: a server's launch to its first healthy reply, the floor's
    # and the generate loop's preparation (compile and capture included).
    put(Row("startup", "startup", "startup to ready (s)", False), result.get("startup_s"))
    return metrics


def decode_bench_metrics(bench: dict[str, Any]) -> dict[Row, float]:
    """Rows of one ``flare replay --bench-decode --json`` result: the native decode step
    (no HTTP) and the host's submission gap between steps."""
    run = bench["decode_bench"]
    c = run["capacity"]
    name = f"decode-c{c}"
    step, gap = run["step"], run["submission_gap"]
    return {
        Row(f"native-step-c{c}", name, f"native decode step, c={c} (ms)", False): step["median_ms"],
        Row(f"native-step-p99-c{c}", name, f"native decode step p99, c={c} (ms)", False): step[
            "p99_ms"
        ],
        Row(f"host-gap-c{c}", name, f"host submission gap, c={c} (ms)", False): gap["median_ms"],
        Row(f"host-gap-p99-c{c}", name, f"host submission gap p99, c={c} (ms)", False): gap[
            "p99_ms"
        ],
    }


def roofline_metrics(
    result: dict[str, Any], geometry: StepGeometry, bandwidth: float
) -> dict[str, float]:
    """Roofline values of the decode rows, at the mean context of ``result``'s decode
    samples (prompt plus half the output)."""
    values: dict[str, float] = {}
    for name, samples in samples_of(result).items():
        if not name.startswith("decode-c"):
            continue
        c = int(name.split("-c")[1])
        contexts = [(s.prompt_tokens or 0) + (s.output_tokens or 0) / 2 for s in samples]
        context = round(sum(contexts) / len(contexts))
        step = roofline_step_s(geometry, bandwidth, c, context)
        values[f"itl-p50-c{c}"] = step * 1e3
        values[f"native-step-c{c}"] = step * 1e3
        values[f"decode-c{c}"] = 1 / step
        values[f"throughput-c{c}"] = c / step
    return values


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "–"
    if value == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def _natural(text: str) -> list[Any]:
    """Sort key that orders embedded numbers by value (long-512 before long-4096)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}"


def summary_table(
    results: Sequence[dict[str, Any]],
    flare: str = "flare",
    geometry: StepGeometry | None = None,
    bandwidth: float | None = None,
    flare_extra: dict[Row, float] | None = None,
) -> str:
    """The markdown summary: one line per metric, each engine's value, the roofline,
    and Flare's value divided by each other's. ``flare_extra``: rows only Flare has
    (``decode_bench_metrics``)."""
    by_engine = {r["engine"]: engine_metrics(r) for r in results}
    if flare not in by_engine:
        raise ValueError(f"no results of engine {flare!r}; have {', '.join(by_engine)}")
    by_engine[flare].update(flare_extra or {})
    others = [name for name in by_engine if name != flare]
    engines = [flare, *others]
    roof: dict[str, float] = {}
    if geometry is not None and bandwidth:
        flare_result = next(r for r in results if r["engine"] == flare)
        roof = roofline_metrics(flare_result, geometry, bandwidth)
    rows: dict[str, Row] = {}
    for metrics in by_engine.values():
        for row in metrics:
            rows.setdefault(row.key, row)
    values = {e: {row.key: v for row, v in by_engine[e].items()} for e in engines}
    header = ["workload", "metric", "better", *engines]
    if roof:
        header.append("roofline")
    header += [f"{flare} / {o}" for o in others]
    if roof:
        header.append(f"{flare} / roofline")
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for key in sorted(rows, key=lambda k: (_natural(rows[k].workload), _natural(k))):
        row = rows[key]
        mine = values[flare].get(key)
        better = "higher" if row.higher_is_better else "lower"
        cells = [row.workload, row.label, better, *(_fmt(values[e].get(key)) for e in engines)]
        if roof:
            cells.append(_fmt(roof.get(key)))
        cells += [_ratio(mine, values[o].get(key)) for o in others]
        if roof:
            cells.append(_ratio(mine, roof.get(key)))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        f"Ratios are {flare}'s value divided by the other's: for times (ms) below 1 means "
        f"{flare} is faster, for rates (tok/s) above 1 does. Medians unless named; p99 is "
        "the sample at index floor(0.99 n) of the sorted samples.",
    ]
    if roof and isinstance(geometry, Geometry) and bandwidth:
        notes.append(
            f"Roofline: {geometry.weight_bytes_read():,} weight bytes and "
            f"{geometry.kv_bytes_per_position():,} K+V bytes per context position per step, "
            f"over {bandwidth / 1e9:,.0f} GB/s measured."
        )
    elif roof and geometry is not None and bandwidth:
        notes.append(
            f"Roofline: {geometry.weight_bytes_read():,} weight bytes per step at batch 1 "
            "(routed experts: the expected distinct experts of the batch, uniform routing) "
            "plus each sequence's recurrent state, selected K+V and indexer keys, "
            f"over {bandwidth / 1e9:,.0f} GB/s measured."
        )
    if any("clients" in samples_of(r) for r in results):
        notes.append(
            "clients: the same chats, each sent once unmeasured, then through the suite's "
            "client (http.client) and the openai SDK (httpx) in alternating order; first "
            "SSE event (Flare's role delta, sent with the first output) to first content is "
            "the serving path and the transport, so the two clients differ there by the "
            "transport alone (per prompt in the results' client_ttft rows)."
        )
    for result in results:
        pairs = client_ttft_rows(samples_of(result).get("clients", []))
        extra = client_ttft_summary(pairs)["sdk_less_suite_ms"]
        if extra is not None and extra > SDK_STALL_MS:
            notes.append(
                f"- {result['engine']}: clients: the openai SDK's TTFT is {extra:.1f} ms "
                "above the suite client's (median over the prompts): a stall only SDK "
                "users see"
            )
        for skip in result.get("skipped", []):
            notes.append(f"- {result['engine']}: {skip['measurement']} skipped: {skip['reason']}")
        for name, samples in samples_of(result).items():
            gaps = itl_values(samples)
            tokens = sum((s.output_tokens or 1) - 1 for s in samples if s.ok)
            # A token or two without text of its own (a split character) is noise.
            if name.startswith("decode") and gaps and tokens > 1.05 * len(gaps):
                notes.append(
                    f"- {result['engine']}: {name}: {tokens:,} tokens after the first arrived in "
                    f"{len(gaps):,} gaps: the ITL rows are gaps between text chunks of "
                    f"{tokens / len(gaps):.2f} tokens on average (tokens without "
                    "text of their own wait for the next)"
                )
            cold = [s for s in samples if meant_cold(name, s)]
            warm = [s for s in cold if not served_cold(s)]
            if warm:
                notes.append(
                    f"- {result['engine']}: {name}: {len(warm)} of {len(cold)} requests meant "
                    "to be cold were served from the prefix cache (cached tokens reported); "
                    "the cold rows leave them out"
                )
    return "\n".join(lines + notes) + "\n"


def agent_turns(results: Sequence[dict[str, Any]]) -> str:
    """The agent trace turn by turn for each engine: prompt tokens, what the server
    reports cached, what it prefilled, what the turn appended to the previous one,
    and TTFT. With an exact prefix cache, prefilled is the appended tokens plus the
    template's generation header."""
    lines: list[str] = []
    for result in results:
        trace = [
            s
            for name, group in samples_of(result).items()
            if name.startswith("agent-")
            for s in group
        ]
        main_line = sorted(
            (s for s in trace if s.meta.get("branch") == "main"), key=lambda s: s.meta["turn"]
        )
        forks = [s for s in trace if s.meta.get("branch") in ("fork", "repeat")]
        if not main_line:
            continue
        lines += [
            "",
            f"### Agent trace, {result['engine']}",
            "",
            "| turn | branch | prompt tokens | cached | prefilled | appended | TTFT (ms) |",
            "|---|---|---|---|---|---|---|",
        ]
        previous: int | None = None
        for sample in main_line + forks:
            appended = None
            if sample.meta.get("branch") == "main":
                if previous is not None and sample.prompt_tokens is not None:
                    appended = sample.prompt_tokens - previous
                previous = sample.prompt_tokens
            ttft = None if sample.ttft_s is None else sample.ttft_s * 1e3
            counts = (
                sample.prompt_tokens,
                sample.cached_tokens,
                prefilled_tokens(sample),
                appended,
            )
            cells = [
                str(sample.meta.get("turn")),
                str(sample.meta.get("branch")),
                *("–" if n is None else str(n) for n in counts),
                _fmt(ttft),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        for check in repeat_checks(trace):
            lines.append(
                f"\nRepeat of {check['request']}: {check['cached_tokens']} of "
                f"{check['prompt_tokens']} prompt tokens cached, "
                f"{'the same answer' if check['same'] else 'ANOTHER ANSWER'} "
                f"({check['output_tokens']} tokens)."
            )
    return "\n".join(lines) + ("\n" if lines else "")


# ---------------------------------------------------------------- plots


def plot(
    results: Sequence[dict[str, Any]],
    out_dir: Path,
    flare: str = "flare",
    geometry: StepGeometry | None = None,
    bandwidth: float | None = None,
) -> list[Path]:
    """PNG plots beside the summary; none (with a message) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    grouped = {r["engine"]: samples_of(r) for r in results}
    written: list[Path] = []

    def decode_levels(samples: dict[str, list[Sample]]) -> list[tuple[int, list[Sample]]]:
        levels = [
            (int(n.split("-c")[1]), s) for n, s in samples.items() if n.startswith("decode-c")
        ]
        return sorted(levels, key=lambda level: level[0])

    roof = None
    if geometry is not None and bandwidth:
        ordered = sorted(results, key=lambda r: r["engine"] != flare)
        roof = roofline_metrics(ordered[0], geometry, bandwidth)

    figure, (itl_axis, rate_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for engine, samples in grouped.items():
        levels = decode_levels(samples)
        if not levels:
            continue
        cs = [c for c, _ in levels]
        itl_axis.plot(
            cs, [median(itl_values(s)) * 1e3 for _, s in levels], "o-", label=f"{engine} p50"
        )
        itl_axis.plot(
            cs, [p99(itl_values(s)) * 1e3 for _, s in levels], "x--", label=f"{engine} p99"
        )
        rate_axis.plot(cs, [throughput_tokens_per_s(s) or 0 for _, s in levels], "o-", label=engine)
    if roof:
        cs = sorted(int(k.split("-c")[1]) for k in roof if k.startswith("itl-p50-c"))
        itl_axis.plot(cs, [roof[f"itl-p50-c{c}"] for c in cs], "k:", label="roofline")
        rate_axis.plot(cs, [roof[f"throughput-c{c}"] for c in cs], "k:", label="roofline")
    itl_axis.set(xlabel="concurrency", ylabel="inter-token latency (ms)", title="ITL")
    rate_axis.set(xlabel="concurrency", ylabel="tokens/s (all requests)", title="decode throughput")
    levels = sorted({c for samples in grouped.values() for c, _ in decode_levels(samples)})
    for axis in (itl_axis, rate_axis):
        # Log scale: the roofline of a small model sits far below every engine.
        axis.set(yscale="log", xticks=levels)
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    written.append(_save(figure, out_dir / "decode_vs_concurrency.png"))

    figure, axis = plt.subplots(figsize=(6, 4))
    for engine, samples in grouped.items():
        points = sorted(
            (int(n.split("-")[1]), _med([s.ttft_s for s in group]))
            for n, group in samples.items()
            if n.startswith("long-")
        )
        points = [(n, t) for n, t in points if t is not None]
        if points:
            axis.plot([n for n, _ in points], [t * 1e3 for _, t in points], "o-", label=engine)
    # No bandwidth roofline here: prefill is bound by compute, not by reading weights.
    axis.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="TTFT (ms)")
    axis.set_title("cold TTFT against prompt length")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    written.append(_save(figure, out_dir / "ttft_vs_prompt_length.png"))

    figure, (ttft_axis, tokens_axis) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for engine, samples in grouped.items():
        trace = [s for n, group in samples.items() if n.startswith("agent-") for s in group]
        for branch, style in (("main", ".-"), ("fork", "x")):
            turns = agent_turns_of(trace, branch)
            if not turns:
                continue
            xs = [t for t, _ in turns]
            label = engine if branch == "main" else f"{engine} fork"
            ttft_axis.plot(xs, agent_ttft_ms(turns), style, label=label)
            if branch == "main":
                tokens_axis.plot(xs, [s.prompt_tokens or 0 for _, s in turns], "-", label=engine)
                prefilled = [(x, prefilled_tokens(s)) for x, s in turns]
                if any(p is not None for _, p in prefilled):
                    tokens_axis.plot(
                        [x for x, p in prefilled if p is not None],
                        [p for _, p in prefilled if p is not None],
                        ":",
                        label=f"{engine} prefilled",
                    )
    ttft_axis.set(ylabel="TTFT (ms)", title="agent trace: TTFT per turn")
    tokens_axis.set(xlabel="turn", ylabel="prompt tokens (dotted: prefilled)")
    for axis in (ttft_axis, tokens_axis):
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    written.append(_save(figure, out_dir / "agent_ttft_per_turn.png"))
    return written


def agent_turns_of(trace: Sequence[Sample], branch: str) -> list[tuple[int, Sample]]:
    """The agent trace's samples of ``branch`` by turn, failed ones included."""
    return sorted(
        ((s.meta["turn"], s) for s in trace if s.meta.get("branch") == branch),
        key=lambda pair: pair[0],
    )


def agent_ttft_ms(turns: Sequence[tuple[int, Sample]]) -> list[float]:
    """Per-turn TTFT in ms; NaN where a turn has none (a failed request), so a plotted
    line breaks there instead of joining its neighbours."""
    return [s.ttft_s * 1e3 if s.ttft_s is not None else math.nan for _, s in turns]


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def _first(results: Sequence[dict[str, Any]], key: str, flare: str) -> Any:
    ordered = sorted(results, key=lambda r: r["engine"] != flare)
    return next((r[key] for r in ordered if r.get(key)), None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite.report", description=__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="results JSON of each engine")
    parser.add_argument("--flare", default="flare", help="the engine the ratios are of")
    parser.add_argument(
        "--geometry",
        help=f"{' | '.join(GEOMETRY_NAMES)} | config.json (default: from the results)",
    )
    parser.add_argument(
        "--bandwidth-gbs", type=float, help="measured read bandwidth (default: from the results)"
    )
    parser.add_argument("--out-dir", type=Path, help="write summary.md and the PNG plots here")
    parser.add_argument(
        "--decode-bench",
        type=Path,
        nargs="*",
        default=[],
        help="flare replay --bench-decode --json results: native step and host-gap rows",
    )
    args = parser.parse_args(argv)
    results = [json.loads(path.read_text()) for path in args.results]
    geometry = resolve_geometry(args.geometry) if args.geometry else None
    if geometry is None and (recorded := _first(results, "geometry", args.flare)):
        geometry = geometry_from_dict(recorded)
    bandwidth = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else None
    bandwidth = bandwidth or _first(results, "bandwidth_bytes_per_s", args.flare)
    extra: dict[Row, float] = {}
    for path in args.decode_bench:
        extra.update(decode_bench_metrics(json.loads(path.read_text())))
    table = summary_table(results, args.flare, geometry, bandwidth, extra) + agent_turns(results)
    print(table)
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "summary.md").write_text(table)
        for path in plot(results, args.out_dir, args.flare, geometry, bandwidth):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
