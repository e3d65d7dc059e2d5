"""Transformers' static-cache generate loop as a suite engine: the same requests through
``model.generate`` with a ``StaticCache``, in this process, timed from a streamer that
stamps each token as generate hands it over. Transformers compiles the decode step
itself on CUDA, once per cache length; each request takes the cache of the smallest
power-of-two length (at least ``MIN_CACHE_LEN``, at most the context limit) that holds
its prompt and answer, as a user sizing the cache to the work would. With one cache of
the context limit every step attends over all of it; the Qwen3-8B geometry then took
61 ms per token at 66,560 positions (the share of that length in it is not measured).

It is the baseline a user gets from Transformers without a server: one request at a
time. Concurrency ``c`` submits requests in groups of ``c`` and answers them one after
another, so TTFT includes the wait behind the group's earlier requests (what a client
of such a loop sees) and throughput is the loop's. Prompts render with the tokenizer's
own chat template, as the other engines render them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from bench.suite.client import Sample
from bench.suite.instructed import ChatRenderer
from bench.suite.workloads import BenchRequest

# The shortest static cache: a few compiled lengths serve every request.
MIN_CACHE_LEN = 1024


def cache_len(tokens: int, context_limit: int) -> int:
    """The static cache length for a request of ``tokens`` (prompt plus answer)."""
    length = MIN_CACHE_LEN
    while length < tokens:
        length *= 2
    return min(length, context_limit)


class TokenTimes:
    """A ``generate`` streamer that records when each new token reaches the host."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True  # generate first hands over the prompt
            return
        now = time.perf_counter()
        self.times.extend(now for _ in range(value.numel()))

    def end(self) -> None:
        pass


class GenerateLoopEngine:
    """A Transformers model answering requests with a static cache, batch 1."""

    def __init__(
        self,
        model_dir: Path,
        *,
        device: str = "cuda",
        dtype: torch.dtype = torch.bfloat16,
        context_limit: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.chats = ChatRenderer(self.tokenizer)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        self.model.eval()
        if self.compiles:
            # One compiled decode step per cache length (8 for a 64K context): more than
            # Dynamo's default recompile limit allows before it falls back to eager.
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, 16)
        config = self.model.config
        limit = context_limit or int(config.max_position_embeddings)
        self.context_limit = limit
        self.device = device
        self.caches: dict[int, Any] = {}
        self.epoch = time.perf_counter()

    @property
    def compiles(self) -> bool:
        """Whether generate compiles its decode step (Transformers does on CUDA)."""
        return self.model.device.type == "cuda"

    def cache_for(self, tokens: int) -> Any:
        """The reset static cache for a request of ``tokens``, made on first use."""
        from transformers import StaticCache

        length = cache_len(tokens, self.context_limit)
        cache = self.caches.get(length)
        if cache is None:
            cache = StaticCache(config=self.model.config, max_cache_len=length)
            self.caches[length] = cache
        cache.reset()
        return cache

    def prompt_ids(self, request: BenchRequest) -> list[int]:
        if request.messages is None:
            prompt = request.prompt
            if isinstance(prompt, list):
                return list(prompt)
            return list(self.tokenizer.encode(str(prompt)))
        # The server's prompt (tools declared where the template shows none), so that
        # both engines prefill the same tokens.
        return self.chats.ids(request.messages, request.tools)

    def run(self, requests: Sequence[BenchRequest], concurrency: int) -> list[Sample]:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        samples: list[Sample] = []
        for first in range(0, len(requests), concurrency):
            group = requests[first : first + concurrency]
            submitted = time.perf_counter()
            samples += [self._answer(request, concurrency, submitted) for request in group]
        return samples

    def _answer(self, request: BenchRequest, concurrency: int, submitted: float) -> Sample:
        sample = Sample(
            request=request.name,
            workload=request.workload,
            concurrency=concurrency,
            meta=dict(request.meta),
            start_s=submitted - self.epoch,
        )
        ids = self.prompt_ids(request)
        sample.prompt_tokens = len(ids)
        if len(ids) + request.max_tokens > self.context_limit:
            sample.refuse_context(len(ids), request.max_tokens, self.context_limit)
            return sample
        sampling = request.sampling
        streamer = TokenTimes()
        cache = self.cache_for(len(ids) + request.max_tokens)
        torch.manual_seed(sampling.seed)
        options: dict[str, Any] = dict(
            max_new_tokens=request.max_tokens,
            do_sample=True,
            temperature=sampling.temperature,
            top_k=sampling.top_k or None,
            top_p=sampling.top_p,
            past_key_values=cache,
            streamer=streamer,
            pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        )
        inputs = torch.tensor([ids], device=self.device)
        # generate runs under no_grad; inference mode would make the cache's tensors
        # impossible to reset outside it.
        output = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **options)
        tokens = output[0, len(ids) :].tolist()
        eos = self.model.generation_config.eos_token_id
        stops = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        sample.status = 200
        sample.output_tokens = len(tokens)
        sample.output_tokens_source = "generate"
        sample.finish_reason = "stop" if tokens and tokens[-1] in stops else "length"
        sample.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        times = streamer.times
        if times:
            sample.ttft_s = times[0] - submitted
            sample.gaps_s = [b - a for a, b in pairwise(times)]
            sample.e2e_s = times[-1] - submitted
        return sample
