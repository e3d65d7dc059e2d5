"""One streaming client for any OpenAI-compatible server, and the suite's statistics.

Standard library only (``http.client``), so it runs wherever Python does. Each request
is sent with ``"stream": true`` to ``/v1/chat/completions`` or ``/v1/completions`` and
timed on the client: the time to the first chunk that carries output (TTFT), the gap
between successive output chunks (inter-token latency, ITL), the end-to-end latency
to the end of the stream, and the output token count from ``usage`` (requested with
``stream_options.include_usage``; counted as chunks when the server sends none).

A chunk that carries several tokens is one gap; when the server sends cumulative
usage on every chunk its token count is kept beside the gap (``chunk_tokens``).
"""

from __future__ import annotations

import http.client
import itertools
import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from bench.suite.workloads import BenchRequest

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


def _error_of(status: int, raw: bytes) -> dict[str, Any]:
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
            sample.error = _error_of(response.status, response.read())
            return sample
        while line := response.readline():
            now = time.perf_counter()
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                sample.error = _error_of(response.status, data)
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
    return sample


class HttpEngine:
    """An OpenAI-compatible server driven by ``concurrency`` client threads: each
    takes the next request as soon as its previous one ends (a closed loop)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.epoch = time.perf_counter()

    def server_counters(self) -> dict[str, float] | None:
        """The server's own counters now (``bench.suite.server_metrics``), or None."""
        from bench.suite.server_metrics import scrape

        return scrape(self.endpoint)

    def run(self, requests: Sequence[BenchRequest], concurrency: int) -> list[Sample]:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            samples = list(
                pool.map(lambda r: stream_request(self.endpoint, r, self.epoch), requests)
            )
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
