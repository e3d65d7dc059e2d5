"""The Python replay harness: the design's diagnostic direct execution.

It schedules, packs and replays the prepared graphs with continuous batching, or
(``eager``) calls the same prepared operations without graphs. It is a diagnostic
and the performance floor of the captured computation, never production serving.

Scheduling follows the design's small scheduler: FIFO admission subject to a slot
and a page reservation (prompt plus output limit, so running requests never need
emergency eviction), then per iteration at most one prefill chunk followed by one
decode batch of every running request. The host synchronizes after each operation
to read its completion records.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ignition.components.kv_cache import NULL_PAGE
from ignition.components.token_state import (
    COMPLETION_FIELDS,
    FINISHED_LENGTH,
    FINISHED_STOP,
    RUNNING,
)
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel
from ignition.replay.errors import AdmissionError, InvalidSampling
from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode
from ignition.replay.sampling_policy import check_resolved, resolve_sampling

_FIELD = {name: i for i, name in enumerate(COMPLETION_FIELDS)}
FINISH_REASONS = {FINISHED_STOP: "stop", FINISHED_LENGTH: "length"}

__all__ = [
    "AdmissionError",
    "Harness",
    "InvalidSampling",
    "Request",
    "Result",
    "SamplingParams",
    "resolve_sampling",
]


@dataclass
class Request:
    """One request. ``sampling`` holds the graphs' resolved parameters, as Helios's
    scheduler receives them: a caller answering a request's sampling fields resolves
    them first (``resolve_sampling(prepared.defaults, ...)``, the policy Helios applies);
    admission refuses parameters that no request resolves to under the core's policy
    (``check_resolved``) rather than changing them."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int


@dataclass
class Result:
    id: int
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""
    ttft_s: float = 0.0
    token_times_s: list[float] = field(default_factory=list)


@dataclass
class _Running:
    request: Request
    slot: int
    reserved_pages: int
    pages: list[int] = field(default_factory=list)
    consumed: int = 0
    result: Result | None = None
    admitted_at: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.consumed < len(self.request.prompt)


class PagePool:
    """Physical KV pages 1..pages-1 (page 0 is the null page), with reservations."""

    def __init__(self, pages: int) -> None:
        self.free = deque(range(1, pages))
        self.reserved = 0

    def available(self) -> int:
        return len(self.free) - self.reserved

    def reserve(self, count: int) -> None:
        self.reserved += count

    def take(self) -> int:
        self.reserved -= 1
        return self.free.popleft()

    def release(self, pages: list[int], unused_reservation: int) -> None:
        self.free.extend(pages)
        self.reserved -= unused_reservation


@dataclass
class TracedStep:
    """Diagnostic record of one sampled step of one request: its logits (CPU float32)
    and where it ran (graph kind and capacity, row, slot, the request's pages)."""

    logits: torch.Tensor
    kind: str
    capacity: int
    row: int
    slot: int
    pages: tuple[int, ...]

    def context(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "row": self.row,
            "slot": self.slot,
            "pages": list(self.pages),
        }


@dataclass
class StepLog:
    kind: str
    capacity: int
    rows: int
    seconds: float


class Harness:
    def __init__(
        self,
        prepared: PreparedModel,
        trace_logits: bool = False,
        execute: Callable[[GraphKey], None] | None = None,
    ) -> None:
        """``execute`` replaces ``prepared.execute`` (an export records each launch)."""
        self.prepared = prepared
        self._launch = execute or prepared.execute
        # Diagnostic: per request, the logits and placement of each sampled step, to
        # locate the first step at which two runs of the same request diverge and why.
        self.logit_trace: dict[int, list[TracedStep]] | None = {} if trace_logits else None
        self.catalog = prepared.catalog
        self.storage = prepared.storage
        self.pages = PagePool(self.storage.cache.pages)
        self.free_slots = deque(range(1, self.catalog.max_concurrency + 1))
        self.steps: list[StepLog] = []

    # ------------------------------------------------------------------ validation
    def validate(self, request: Request) -> None:
        limit = self.catalog.context_limit
        if not request.prompt:
            raise AdmissionError(f"request {request.id}: empty prompt")
        if request.max_new_tokens < 1:
            raise AdmissionError(f"request {request.id}: max_new_tokens must be at least 1")
        if len(request.prompt) + request.max_new_tokens > limit:
            raise AdmissionError(
                f"request {request.id}: {len(request.prompt)} prompt + "
                f"{request.max_new_tokens} output tokens exceed the context limit {limit}"
            )
        try:
            check_resolved(self.prepared.defaults, request.sampling)
        except InvalidSampling as error:
            raise InvalidSampling(error.field, error.reason, f"request {request.id}: ") from None
        vocab = self.prepared.model.geometry.vocab
        if max(request.prompt) >= vocab or min(request.prompt) < 0:
            raise AdmissionError(f"request {request.id}: token id outside the vocabulary")
        if self._pages_for(request) > self.storage.cache.pages - 1:
            raise AdmissionError(f"request {request.id}: needs more pages than the whole pool")

    def _pages_for(self, request: Request) -> int:
        size = self.catalog.page_size
        return -(-(len(request.prompt) + request.max_new_tokens) // size)

    # ------------------------------------------------------------------ packing
    def _ensure_pages(self, run: _Running, end_position: int) -> None:
        """Back every logical page that positions [0, end_position) touch."""
        size = self.catalog.page_size
        needed = -(-end_position // size)
        table = self.storage.state.page_table
        while len(run.pages) < needed:
            page = self.pages.take()
            table[run.slot, len(run.pages)] = page
            run.pages.append(page)

    def _execute(self, key: GraphKey, rows: int) -> torch.Tensor:
        start = time.perf_counter()
        self._launch(key)
        completions = self.storage.staging.completions[: max(rows, 1)].cpu()
        self.steps.append(StepLog(key.kind.value, key.capacity, rows, time.perf_counter() - start))
        return completions

    # ------------------------------------------------------------------ lifecycle
    def _admit(self, request: Request) -> _Running:
        slot = self.free_slots.popleft()
        reserved = self._pages_for(request)
        self.pages.reserve(reserved)
        run = _Running(request, slot, reserved, admitted_at=time.perf_counter())
        run.result = Result(request.id, len(request.prompt))
        pack_admission(
            self.storage.staging,
            slot,
            request.prompt,
            request.max_new_tokens,
            request.sampling,
            request.seed,
        )
        self._execute(GraphKey(GraphKind.ADMIT, 1), 0)
        return run

    def _retire(self, run: _Running) -> None:
        table = self.storage.state.page_table
        table[run.slot].fill_(NULL_PAGE)
        self.pages.release(run.pages, run.reserved_pages - len(run.pages))
        self.free_slots.append(run.slot)

    def _record(self, run: _Running, row: torch.Tensor, now: float) -> bool:
        """Append a completion row's token; True when the request finished."""
        assert run.result is not None
        if int(row[_FIELD["valid"]]) == 0:
            return False
        if not run.result.tokens:
            run.result.ttft_s = now - run.admitted_at
        run.result.tokens.append(int(row[_FIELD["token"]]))
        run.result.token_times_s.append(now)
        done = int(row[_FIELD["done"]])
        if done != RUNNING:
            run.result.finish_reason = FINISH_REASONS[done]
            return True
        return False

    def _trace(self, batch: list[_Running], key: GraphKey) -> None:
        if self.logit_trace is None:
            return
        # A copy even on the CPU: the staging buffer is overwritten by the next step.
        logits = self.storage.staging.logits[: len(batch)].to("cpu", torch.float32, copy=True)
        for row, run in enumerate(batch):
            step = TracedStep(
                logits[row], key.kind.value, key.capacity, row, run.slot, tuple(run.pages)
            )
            self.logit_trace.setdefault(run.request.id, []).append(step)

    def _prefill_chunk(self, run: _Running) -> bool:
        prompt = run.request.prompt
        chunk = min(len(prompt) - run.consumed, self.catalog.prefill_chunk_size)
        capacity = self.catalog.prefill_capacity(chunk)
        ends_prompt = run.consumed + chunk == len(prompt)
        self._ensure_pages(run, run.consumed + chunk)
        tokens = prompt[run.consumed : run.consumed + chunk]
        pack_chunk(self.storage.staging, run.slot, tokens, ends_prompt)
        key = GraphKey(GraphKind.PREFILL, capacity)
        completions = self._execute(key, 1)
        if ends_prompt:
            self._trace([run], key)
        run.consumed += chunk
        return ends_prompt and self._record(run, completions[0], time.perf_counter())

    def _decode(self, batch: list[_Running]) -> list[_Running]:
        capacity = self.catalog.decode_capacity(len(batch))
        for run in batch:
            self._ensure_pages(run, run.consumed + 1)
        pack_decode(self.storage.staging, [run.slot for run in batch], capacity)
        key = GraphKey(GraphKind.DECODE, capacity)
        completions = self._execute(key, len(batch))
        self._trace(batch, key)
        now = time.perf_counter()
        finished = []
        for run, row in zip(batch, completions, strict=False):
            run.consumed += 1
            if self._record(run, row, now):
                finished.append(run)
        return finished

    def run(self, requests: list[Request]) -> list[Result]:
        for request in requests:
            self.validate(request)
        waiting = deque(requests)
        running: list[_Running] = []
        results: dict[int, Result] = {}
        while waiting or running:
            while (
                waiting
                and self.free_slots
                and self.pages.available() >= self._pages_for(waiting[0])
            ):
                running.append(self._admit(waiting.popleft()))
            finished: list[_Running] = []
            prefilling = [run for run in running if run.prefilling]
            if prefilling and self._prefill_chunk(prefilling[0]):
                finished.append(prefilling[0])
            batch = [run for run in running if not run.prefilling and run not in finished]
            if batch:
                finished += self._decode(batch)
            for run in finished:
                assert run.result is not None
                results[run.request.id] = run.result
                running.remove(run)
                self._retire(run)
        return [results[r.id] for r in requests]
