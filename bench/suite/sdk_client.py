"""The official ``openai`` SDK as a second client, timed beside the suite's own.

The suite's client (``bench.suite.client``: ``http.client``, one connection per
request) is not what users run, and it can miss what they see: it hid a 40 ms
first-token stall (Nagle's algorithm on the server's sockets holding the second SSE
write until the client's delayed ACK) that every openai-SDK user, reading through
httpx, paid on every request. So the ``clients`` measurement sends the same chat
requests through both clients and keeps, per request, the TTFT (sending to the first
chunk with output) and the first SSE event's arrival (Flare's role delta, sent at
admission): the gap from it to the first output is the same work for both clients
but for the transport, which is where that stall sat.

The SDK sends the suite's own request body (``request_body``: sampling in the
endpoint's dialect, ``stream_options``, ``extra_body``), its non-standard fields
through the SDK's ``extra_body``, so the two clients' requests differ only in the
``model`` field, which the SDK requires (the endpoint's, else the first model the
server lists). One SDK client serves every request, as an application keeps one.

The SDK is not optional where this measurement runs: a missing ``openai`` package is
an error (``require_openai``), never a skipped row.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from bench.suite.client import Endpoint, Sample, error_of, record_times, request_body
from bench.suite.workloads import BenchRequest

MISSING = (
    "the clients measurement times the openai SDK, which is not importable here: "
    "pip install openai, or on the GPU machine set WHEELS to a folder of "
    "bench/baseline_wheels.sh's wheels"
)


def require_openai() -> Any:
    """The ``openai`` module; ``RuntimeError`` (saying how to get it) when missing."""
    try:
        return importlib.import_module("openai")
    except ImportError as error:
        raise RuntimeError(MISSING) from error


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's own errors: the SDK wraps those of sending a request, but
    lets those of reading a stream through (httpx's or, in later SDKs, httpx2's)."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


class SdkClient:
    """An ``openai.OpenAI`` client for ``endpoint`` (no retries: a failure is a sample)
    and the model name its requests carry."""

    def __init__(self, endpoint: Endpoint) -> None:
        openai = require_openai()
        self.endpoint = endpoint
        self.openai = openai
        self.client = openai.OpenAI(
            base_url=endpoint.base_url(),
            api_key=endpoint.api_key or "unused",
            max_retries=0,
            timeout=endpoint.timeout_s,
        )
        self.errors = (openai.APIError, OSError, ValueError, *_transport_errors())
        self.model = endpoint.model or self._listed_model()

    def _listed_model(self) -> str:
        """The first model the server lists (Flare refuses a name it does not serve)."""
        try:
            listed = self.client.models.list().data
        except self.openai.APIError as error:
            raise RuntimeError(f"openai SDK: GET /v1/models failed: {error}") from error
        if not listed:
            raise RuntimeError("openai SDK: the server lists no model; pass --model")
        return str(listed[0].id)

    def error_of(self, error: BaseException) -> tuple[int, dict[str, Any]]:
        """The status and the suite's error record of a failed request."""
        if isinstance(error, self.openai.APIStatusError):
            try:
                raw = error.response.content
            except Exception:  # a body the SDK did not read
                raw = str(error.message).encode()
            return error.status_code, error_of(error.status_code, raw)
        body = getattr(error, "body", None)
        if isinstance(body, dict):  # an error event inside the stream
            code = body.get("code") or body.get("type") or type(error).__name__
            return 200, {"code": str(code), "message": str(body.get("message", ""))}
        return 0, {"code": type(error).__name__, "message": str(error)}


def _output_of(choice: Any) -> tuple[bool, str]:
    """Whether a streamed chat choice carries output, and its text: the suite client's
    rule (content, reasoning or a tool call) read from the SDK's objects."""
    delta = choice.delta
    if delta is None:
        return False, ""
    text = str(delta.content or getattr(delta, "reasoning_content", None) or "")
    return bool(text or delta.tool_calls), text


def sdk_stream_request(sdk: SdkClient, request: BenchRequest, epoch: float = 0.0) -> Sample:
    """Streams one chat request through the SDK and times it as ``stream_request``
    does: TTFT at the first chunk with output, the first chunk of any kind as
    ``first_event_s``; failures are samples with ``error``."""
    if request.messages is None:
        raise ValueError(f"{request.name}: the openai SDK measurement sends chat requests")
    sample = Sample(request=request.name, workload=request.workload, meta=dict(request.meta))
    body = request_body(sdk.endpoint, request)
    for key in ("stream", "messages", "model"):
        body.pop(key, None)
    arrivals: list[float] = []
    first_event: float | None = None
    finished: float | None = None
    chunk_tokens: list[int] = []
    counted = 0
    start = time.perf_counter()
    sample.start_s = start - epoch
    try:
        stream = sdk.client.chat.completions.create(
            model=sdk.model, messages=request.messages, stream=True, extra_body=body
        )
        sample.status = stream.response.status_code
        with stream:
            for chunk in stream:
                now = time.perf_counter()
                first_event = first_event or now
                output = False
                for choice in chunk.choices:
                    carries, text = _output_of(choice)
                    output = output or carries
                    sample.text += text
                    sample.finish_reason = choice.finish_reason or sample.finish_reason
                    if choice.finish_reason and finished is None:
                        finished = now
                if output:
                    arrivals.append(now)
                usage = chunk.usage
                if usage is not None:
                    sample.prompt_tokens = usage.prompt_tokens
                    details = usage.prompt_tokens_details
                    if details is not None and details.cached_tokens is not None:
                        sample.cached_tokens = int(details.cached_tokens)
                    if usage.completion_tokens is not None:
                        if output:
                            chunk_tokens.append(usage.completion_tokens - counted)
                        counted = usage.completion_tokens
                        sample.output_tokens = counted
                        sample.output_tokens_source = "usage"
    except sdk.errors as error:
        sample.status, sample.error = sdk.error_of(error)
    finally:
        sample.e2e_s = time.perf_counter() - start
    record_times(sample, start, first_event, arrivals, finished, chunk_tokens)
    return sample
