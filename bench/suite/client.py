"""One streaming client for any OpenAI-compatible server, and the suite's statistics.

Standard library only (``http.client``), so it runs wherever Python does. Each request
is sent with ``"stream": true`` to ``/v1/chat/completions`` or ``/v1/completions`` and
timed on the client: the time to the first chunk that carries output (TTFT), the gap
between successive output chunks (inter-token latency, ITL), the end-to-end latency
to the end of the stream, and the output token count from ``usage`` (requested with
``stream_options.include_usage``; counted as chunks when the server sends none).

A chunk that carries several tokens is one gap; when the server sends cumulative
usage on every chunk its token count is kept beside the gap (``chunk_tokens``). The
arrival of the first SSE event of any kind is kept too (``first_event_s``; Flare sends
its role delta with the first output, so the gap to the first output is the serving
path and the transport; a server that sends it at admission adds the first token's
compute).

Requests of the ``clients`` measurement that name the ``openai`` SDK as their client
(``meta["client"]``) go through ``bench.suite.sdk_client`` instead, timed the same way.
"""

from __future__ import annotations

import http.client
import itertools
import json
import math
import multiprocessing
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from bench.suite.workloads import SDK_CLIENT, SUITE_CLIENT, BenchRequest

if TYPE_CHECKING:
    from bench.suite.sdk_client import SdkClient

DIALECTS = ("openai", "transformers")


@dataclass
class Sample:
    """What one request measured. Times in seconds; ``start_s`` is relative to the
    engine's epoch, so samples of one run can be laid on one time line."""

    request: str
    workload: str
    measurement: str = ""
    concurrency: int = 1
    repeat: int = 0
    start_s: float = 0.0
    ttft_s: float | None = None
    # The first SSE event of any kind (a role delta, say), output or not.
    first_event_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] | None = None
    e2e_s: float = 0.0
    output_tokens: int | None = None
    output_tokens_source: str = "none"
    prompt_tokens: int | None = None
    # Prompt tokens the server reports served from its prefix cache
    # (usage.prompt_tokens_details.cached_tokens; None when it reports none).
    cached_tokens: int | None = None
    finish_reason: str | None = None
    # True when the first sampled token was a stop token: no text arrived, and
    # ttft_s is the arrival of the event that finished the answer.
    stopped_first: bool = False
    text: str = ""
    status: int = 0
    error: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def refuse_context(self, prompt_tokens: int, max_tokens: int, context_limit: int) -> None:
        """Marks the sample refused as a server refuses a request past its context."""
        self.status = 400
        self.error = {
            "code": "context_length_exceeded",
            "message": f"{prompt_tokens} prompt tokens plus max_tokens {max_tokens} "
            f"exceed the context limit {context_limit}",
        }

    @property
    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sample:
        return cls(**data)


class Engine(Protocol):
    """Anything that answers a list of requests at a concurrency with samples, in the
    requests' order."""

    def run(self, requests: Sequence[BenchRequest], concurrency: int) -> list[Sample]: ...


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server.

    ``url`` is the server's base (``http://127.0.0.1:8080``; a trailing ``/v1`` is
    accepted). ``dialect`` says how sampling is spelled: ``openai`` sends ``top_k`` and
    ``seed`` as top-level fields and asks for usage with ``stream_options`` (Flare,
    vLLM, SGLang, llama.cpp); ``transformers`` (``transformers serve``, which rejects
    unknown fields with 422) sends ``top_k`` inside its ``generation_config`` JSON and
    relies on the usage it always sends last. ``extra_body`` is merged into every
    request body.
    """

    url: str
    model: str | None = None
    api_key: str | None = None
    dialect: str = "openai"
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect {self.dialect!r}; known: {', '.join(DIALECTS)}")
        if urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"{self.url}: the URL must start with http:// or https://")

    def path(self, endpoint: str) -> str:
        base = urlsplit(self.url).path.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return f"{base}/{'chat/completions' if endpoint == 'chat' else endpoint}"

    def connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, parts.port, timeout=self.timeout_s)
        return http.client.HTTPConnection(host, parts.port, timeout=self.timeout_s)

    def base_url(self) -> str:
        """The API's base URL as SDKs take it: the server's base ending in ``/v1``."""
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else f"{base}/v1"

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def request_body(endpoint: Endpoint, request: BenchRequest) -> dict[str, Any]:
    """The JSON body of ``request`` in the endpoint's dialect."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "stream": True,
        "max_tokens": request.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
    }
    if endpoint.model is not None:
        body["model"] = endpoint.model
    if request.messages is not None:
        body["messages"] = request.messages
        if request.tools is not None:
            body["tools"] = request.tools
    else:
        body["prompt"] = request.prompt
    if endpoint.dialect == "openai":
        body["top_k"] = sampling.top_k
        body["stream_options"] = {"include_usage": True}
    else:
        body["generation_config"] = json.dumps(
            {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_k": sampling.top_k,
                "top_p": sampling.top_p,
                "max_new_tokens": request.max_tokens,
            }
        )
    body.update(endpoint.extra_body)
    return body


def _output_of(choice: dict[str, Any]) -> tuple[bool, str]:
    """Whether a streamed choice carries output (text, content, reasoning or a tool
    call), and its text."""
    if choice.get("text"):
        return True, str(choice["text"])
    delta = choice.get("delta") or {}
    text = str(delta.get("content") or delta.get("reasoning_content") or "")
    return bool(text or delta.get("tool_calls")), text


def error_of(status: int, raw: bytes) -> dict[str, Any]:
    """The error of a failed response: OpenAI's envelope, FastAPI's ``detail``, or text."""
    try:
        data = json.loads(raw)
    except ValueError:
        return {"code": str(status), "message": raw.decode(errors="replace")[:500]}
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        error = data["error"]
        return {
            "code": str(error.get("code") or error.get("type") or status),
            "message": str(error.get("message", "")),
        }
    if isinstance(data, dict) and "detail" in data:
        return {"code": str(status), "message": str(data["detail"])}
    return {"code": str(status), "message": str(data)[:500]}


def stream_request(endpoint: Endpoint, request: BenchRequest, epoch: float = 0.0) -> Sample:
    """Sends one streamed request and times it; failures are samples with ``error``."""
    sample = Sample(request=request.name, workload=request.workload, meta=dict(request.meta))
    body = json.dumps(request_body(endpoint, request)).encode()
    connection = endpoint.connection()
    arrivals: list[float] = []
    first_event: float | None = None
    finished: float | None = None
    chunk_tokens: list[int] = []
    counted = 0
    start = time.perf_counter()
    sample.start_s = start - epoch
    try:
        connection.request("POST", endpoint.path(request.endpoint), body, endpoint.headers())
        response = connection.getresponse()
        sample.status = response.status
        if response.status != 200:
            sample.error = error_of(response.status, response.read())
            return sample
        while line := response.readline():
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            first_event = first_event or now
            event = json.loads(data)
            if "error" in event:
                sample.error = error_of(response.status, data)
                break
            usage = event.get("usage")
            output = False
            for choice in event.get("choices") or []:
                carries, text = _output_of(choice)
                output = output or carries
                sample.text += text
                sample.finish_reason = choice.get("finish_reason") or sample.finish_reason
                if choice.get("finish_reason") and finished is None:
                    finished = now
            if output:
                arrivals.append(now)
            if usage:
                sample.prompt_tokens = usage.get("prompt_tokens", sample.prompt_tokens)
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    sample.cached_tokens = int(details["cached_tokens"])
                total = usage.get("completion_tokens")
                if total is not None:
                    if output:
                        chunk_tokens.append(total - counted)
                    counted = total
                    sample.output_tokens = total
                    sample.output_tokens_source = "usage"
    except (OSError, http.client.HTTPException, ValueError) as error:
        sample.error = {"code": type(error).__name__, "message": str(error)}
    finally:
        sample.e2e_s = time.perf_counter() - start
        connection.close()
    record_times(sample, start, first_event, arrivals, finished, chunk_tokens)
    return sample


def record_times(
    sample: Sample,
    start: float,
    first_event: float | None,
    arrivals: Sequence[float],
    finished: float | None,
    chunk_tokens: list[int],
) -> None:
    """Fills ``sample``'s times from one stream's clock readings (``perf_counter``):
    its start, the first event's arrival, each output chunk's, and the finishing
    event's; ``chunk_tokens`` are the tokens each output chunk's usage added."""
    if first_event is not None:
        sample.first_event_s = first_event - start
    if arrivals:
        sample.ttft_s = arrivals[0] - start
        sample.gaps_s = [b - a for a, b in itertools.pairwise(arrivals)]
    elif finished is not None and sample.error is None:
        # The answer ended on its first token (a stop token streams no text): the
        # event that says so is when the first token was known.
        sample.ttft_s = finished - start
        sample.stopped_first = True
    if len(chunk_tokens) == len(arrivals) and arrivals:
        sample.chunk_tokens = chunk_tokens
    if sample.output_tokens is None and arrivals:
        sample.output_tokens = len(arrivals)
        sample.output_tokens_source = "chunks"


def _suite_stream(endpoint: Endpoint, request: BenchRequest, epoch: float) -> Sample:
    """``stream_request`` in a client process (a picklable top-level call)."""
    return stream_request(endpoint, request, epoch)


class HttpEngine:
    """An OpenAI-compatible server driven by ``concurrency`` clients: each takes the
    next request as soon as its previous one ends (a closed loop).

    With ``processes`` (the default), concurrent streams of the suite's client run in
    forked processes, one a stream, each timing its own (``perf_counter`` is the
    system's monotonic clock, shared by the processes): threads of one interpreter
    take turns parsing their SSE lines under its lock, which delays a chunk's reading
    behind the others' and shows as inter-token latency the server never caused.
    Without, threads (as before 2026-12-05). A measurement at concurrency 1, or with
    any request through the SDK, runs in threads either way.

    A request whose ``meta["client"]`` names the openai SDK goes through one SDK
    client, made at its first such request (so runs without them need no SDK) and
    kept, as an application keeps its client and its pooled connections; those run
    in threads."""

    def __init__(self, endpoint: Endpoint, processes: bool = True) -> None:
        self.endpoint = endpoint
        self.processes = processes
        self.epoch = time.perf_counter()
        self._sdk: SdkClient | None = None
        self._sdk_lock = threading.Lock()

    def sdk(self) -> SdkClient:
        """The engine's SDK client; raises when the openai package is missing."""
        from bench.suite.sdk_client import SdkClient

        with self._sdk_lock:
            if self._sdk is None:
                self._sdk = SdkClient(self.endpoint)
            return self._sdk

    def send(self, request: BenchRequest) -> Sample:
        """One request through the client it names (the suite's by default)."""
        client = request.meta.get("client", SUITE_CLIENT)
        if client == SDK_CLIENT:
            from bench.suite.sdk_client import sdk_stream_request

            return sdk_stream_request(self.sdk(), request, self.epoch)
        if client != SUITE_CLIENT:
            raise ValueError(f"{request.name}: unknown client {client!r}")
        return stream_request(self.endpoint, request, self.epoch)

    def server_counters(self) -> dict[str, float] | None:
        """The server's own counters now (``bench.suite.server_metrics``), or None."""
        from bench.suite.server_metrics import scrape

        return scrape(self.endpoint)

    def run(self, requests: Sequence[BenchRequest], concurrency: int) -> list[Sample]:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        suite_only = all(r.meta.get("client", SUITE_CLIENT) == SUITE_CLIENT for r in requests)
        if self.processes and concurrency > 1 and suite_only:
            context = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=concurrency, mp_context=context) as processes:
                samples = list(
                    processes.map(
                        _suite_stream,
                        itertools.repeat(self.endpoint),
                        requests,
                        itertools.repeat(self.epoch),
                    )
                )
        else:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                samples = list(pool.map(self.send, requests))
        for sample in samples:
            sample.concurrency = concurrency
        return samples


def run_requests(
    engine: Engine,
    requests: Sequence[BenchRequest],
    concurrency: int,
    *,
    warmup: Sequence[BenchRequest] = (),
    repeats: int = 1,
) -> list[Sample]:
    """``warmup`` first (its samples are discarded), then ``requests`` ``repeats``
    times, each pass at ``concurrency``; samples carry their pass as ``repeat``."""
    if warmup:
        engine.run(warmup, concurrency)
    samples: list[Sample] = []
    for repeat in range(repeats):
        for sample in engine.run(requests, concurrency):
            sample.repeat = repeat
            samples.append(sample)
    return samples


# ---------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    """The middle sample; the mean of the middle two for an even count."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of no samples")
    middle = n // 2
    return ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def p99(values: Sequence[float]) -> float:
    """The sample at index ``floor(0.99 * n)`` of the sorted samples (clamped to the
    last), the definition of ``helios/src/replay/bench.rs`` and the Python floor."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("p99 of no samples")
    return ordered[min(math.floor(0.99 * n), n - 1)]


@dataclass(frozen=True)
class Summary:
    """A distribution: count, median, p99 (as ``p99``), mean, min, max."""

    count: int
    median: float
    p99: float
    mean: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary | None:
        if not values:
            return None
        mean = sum(values) / len(values)
        return cls(len(values), median(values), p99(values), mean, min(values), max(values))


def decode_tokens_per_s(sample: Sample) -> float | None:
    """Tokens after the first over the time after the first: one request's decode rate."""
    if sample.ttft_s is None or sample.output_tokens is None or sample.output_tokens < 2:
        return None
    decode_s = sample.e2e_s - sample.ttft_s
    return (sample.output_tokens - 1) / decode_s if decode_s > 0 else None


def prefill_tokens_per_s(sample: Sample) -> float | None:
    """Prompt tokens (from usage) over the time to the first token."""
    if not sample.prompt_tokens or not sample.ttft_s:
        return None
    return sample.prompt_tokens / sample.ttft_s


def throughput_tokens_per_s(samples: Sequence[Sample]) -> float | None:
    """All output tokens of ``samples`` over the wall time from the first request's
    start to the last one's end: the server's aggregate decode throughput."""
    done = [s for s in samples if s.ok and s.output_tokens]
    if not done:
        return None
    span = max(s.start_s + s.e2e_s for s in done) - min(s.start_s for s in done)
    return sum(s.output_tokens or 0 for s in done) / span if span > 0 else None


def itl_values(samples: Sequence[Sample]) -> list[float]:
    """Every inter-token gap of the successful samples."""
    return [gap for s in samples if s.ok for gap in s.gaps_s]


def first_event_to_content_s(sample: Sample) -> float | None:
    """The first SSE event (Flare's role delta, sent with the first output) to the
    first output: the serving path and the transport (and the first token's compute,
    for a server that opens the stream at admission). The same
    request through two clients differs here only by the transport: Nagle's
    algorithm once held the second event about 40 ms for httpx, not for
    ``http.client``."""
    if sample.ttft_s is None or sample.first_event_s is None or sample.stopped_first:
        return None
    return sample.ttft_s - sample.first_event_s


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def client_ttft_rows(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One row per prompt of the ``clients`` measurement that both clients answered:
    the suite client's TTFT and first-event-to-content gap (``ttft_ms``,
    ``first_event_to_content_ms``), the openai SDK's (``ttft_sdk_ms``,
    ``first_event_to_content_sdk_ms``), and the SDK's TTFT less the suite's."""
    by_prompt: dict[str, dict[str, Sample]] = {}
    for sample in samples:
        prompt = sample.meta.get("prompt")
        if sample.ok and prompt is not None:
            by_prompt.setdefault(str(prompt), {})[sample.meta.get("client", SUITE_CLIENT)] = sample
    rows = []
    for prompt, pair in by_prompt.items():
        suite, sdk = pair.get(SUITE_CLIENT), pair.get(SDK_CLIENT)
        if suite is None or sdk is None or suite.ttft_s is None or sdk.ttft_s is None:
            continue
        rows.append(
            {
                "prompt": prompt,
                "ttft_ms": suite.ttft_s * 1e3,
                "ttft_sdk_ms": sdk.ttft_s * 1e3,
                "first_event_to_content_ms": _ms(first_event_to_content_s(suite)),
                "first_event_to_content_sdk_ms": _ms(first_event_to_content_s(sdk)),
                "sdk_less_suite_ms": (sdk.ttft_s - suite.ttft_s) * 1e3,
            }
        )
    return rows


CLIENT_TTFT_FIELDS = (
    "ttft_ms",
    "ttft_sdk_ms",
    "first_event_to_content_ms",
    "first_event_to_content_sdk_ms",
    "sdk_less_suite_ms",
)


def client_ttft_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The medians of ``client_ttft_rows`` (field by field) and the pair count."""
    summary: dict[str, Any] = {"pairs": len(rows)}
    for key in CLIENT_TTFT_FIELDS:
        values = [row[key] for row in rows if row[key] is not None]
        summary[key] = median(values) if values else None
    return summary
