"""The Python replay floor as a suite engine: the same requests through Ignition's
replay harness (``ignition replay``'s scheduler over the same captured graphs), in
this process, timed from the harness's own token times.

``ignition replay`` has no HTTP server, so the suite drives its ``Harness`` directly
(``python -m bench.suite --replay [MODEL]``). Concurrency ``c`` runs the requests in
groups of ``c`` submitted together (the harness admits FIFO under its slots and
pages); TTFT and gaps are measured from the group's submission, so the numbers
exclude HTTP and tokenization but include the harness's host work per step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import torch

from bench.suite.client import Sample
from bench.suite.instructed import ChatRenderer
from bench.suite.workloads import BenchRequest
from ignition.preparation.compile_flags import (
    DEFAULT_DECODE_FUSION,
    CompileScope,
    DecodeFusion,
)
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.harness import AdmissionError, Harness, Request
from ignition.replay.sampling_policy import resolve_sampling


def prepare_floor(
    model: Path,
    *,
    max_concurrency: int,
    context_limit: int | None,
    eager: bool,
    compile: bool = True,
    compile_sampling: bool | None = None,
    compile_scope: CompileScope = "forward",
    decode_fusion: DecodeFusion = DEFAULT_DECODE_FUSION,
    programmatic_launch: bool = True,
    early_weights: bool = False,
) -> PreparedModel:
    """``model`` prepared as ``ignition replay`` prepares it (bf16, compiled unless
    not ``compile``, in regions of ``compile_scope``, the sampler as ``compile_sampling``
    says, decode layers fused as ``decode_fusion`` says, the row projections launched
    programmatically as ``programmatic_launch`` says, with ``early_weights`` or not,
    captured on CUDA), or
    ``eager``: float32 on the CPU, no graphs (for tests)."""
    if eager:
        options = PrepareOptions(
            max_concurrency=max_concurrency,
            prefill_chunk_size=128,
            context_limit=context_limit,
            compile=False,
            capture=False,
            device="cpu",
            dtype=torch.float32,
        )
    else:
        options = PrepareOptions(
            max_concurrency=max_concurrency,
            context_limit=context_limit,
            compile=compile,
            compile_sampling=compile_sampling,
            compile_scope=compile_scope,
            decode_fusion=decode_fusion,
            programmatic_launch=programmatic_launch,
            early_weights=early_weights,
        )
    return prepare(model, options)


class ReplayFloorEngine:
    """A prepared model answered by the replay harness."""

    def __init__(self, prepared: PreparedModel) -> None:
        self.prepared = prepared
        self.harness = Harness(prepared)
        self.chats = ChatRenderer(prepared.tokenizer)
        self.epoch = time.perf_counter()

    @property
    def context_limit(self) -> int:
        return self.prepared.catalog.context_limit

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt, as Flare encodes one (special tokens on)."""
        return list(self.prepared.tokenizer.encode(text))

    def prompt_ids(self, request: BenchRequest) -> list[int]:
        """The tokens Flare prefills for ``request``: a chat rendered as Helios renders
        it (tools declared by the server where the template shows none)."""
        if request.messages is None:
            prompt = request.prompt
            return list(prompt) if isinstance(prompt, list) else self.encode(str(prompt))
        return self.chats.ids(request.messages, request.tools)

    def run(self, requests: Sequence[BenchRequest], concurrency: int) -> list[Sample]:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        samples: list[Sample] = []
        for first in range(0, len(requests), concurrency):
            samples += self._group(requests[first : first + concurrency], concurrency)
        return samples

    def _group(self, group: Sequence[BenchRequest], concurrency: int) -> list[Sample]:
        samples = [
            Sample(request=r.name, workload=r.workload, concurrency=concurrency, meta=dict(r.meta))
            for r in group
        ]
        runnable: list[Request] = []
        for index, (request, sample) in enumerate(zip(group, samples, strict=True)):
            ids = self.prompt_ids(request)
            sample.prompt_tokens = len(ids)
            try:
                # The fields the client sends (``client.request_body``), resolved by the
                # policy Helios applies before anything else; the rest take the defaults.
                sampling = resolve_sampling(
                    self.prepared.defaults,
                    temperature=request.sampling.temperature,
                    top_k=request.sampling.top_k,
                    top_p=request.sampling.top_p,
                )
            except AdmissionError as error:
                sample.status = 400
                sample.error = {"code": "invalid_request", "message": str(error)}
                continue
            harness_request = Request(
                index, ids, request.max_tokens, sampling, request.sampling.seed
            )
            if len(ids) + request.max_tokens > self.context_limit:
                sample.refuse_context(len(ids), request.max_tokens, self.context_limit)
                continue
            try:
                self.harness.validate(harness_request)
            except AdmissionError as error:
                sample.status = 400
                sample.error = {"code": "invalid_request", "message": str(error)}
                continue
            runnable.append(harness_request)
        start = time.perf_counter()
        results = self.harness.run(runnable) if runnable else []
        for result in results:
            sample = samples[result.id]
            sample.status = 200
            sample.start_s = start - self.epoch
            times = result.token_times_s
            sample.output_tokens = len(result.tokens)
            sample.output_tokens_source = "harness"
            sample.finish_reason = result.finish_reason
            sample.text = self.prepared.tokenizer.decode(result.tokens, skip_special_tokens=True)
            if times:
                sample.ttft_s = times[0] - start
                sample.gaps_s = [b - a for a, b in pairwise(times)]
                sample.e2e_s = times[-1] - start
        return samples
