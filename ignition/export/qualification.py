"""Qualification: a recorded sequence of launches that Helios must replay bitwise.

Recording wraps ``PreparedModel.execute``. Before each launch it records the bytes
the host changed since the previous launch (state and staging are the only buffers
the host writes: page tables and packed inputs), as the smallest differing span per
buffer; after the launch it records SHA-256 digests of the buffers the graphs write
(every ``full_every`` steps, also the KV pages and snapshot pages; at the last, also
the weights). ``full_every`` grows with those pages' size, so a large pool is
digested a bounded number of times (hashing runs at a few GB/s). The
sequence starts from the prepared model right after ``reset()``, which is what an
exported core holds at load: initial contents, zeros elsewhere.

The workload exercises what serving does, not only warm-up inputs: several requests
of different lengths (multi-chunk prompts included) and sampling settings through
the replay harness, so decode capacities and slot assignments change between steps,
then a prefix snapshot, a restore into another slot, a resume and decodes of both,
then decodes of both under token masks (all-ones, a few tokens per row, one row
masked beside an unmasked one). Where those requests never decode as many rows
together as the widest decode graph holds (a wide --max-concurrency), as many short
requests as it has rows follow them, so every decode capacity runs.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ignition.export import flare_core_pb2 as pb
from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel
from ignition.replay.harness import Harness, Request
from ignition.replay.packing import (
    SamplingParams,
    pack_admission,
    pack_chunk,
    pack_decode,
    pack_resume,
    token_mask,
)

# Buffers the host may write between launches (by manifest-name prefix).
HOST_WRITTEN = ("state.", "staging.")
# Buffers too large to digest after every step: pages and snapshot-row pages, and a
# recipe's further paged tensors and continuation rows with their snapshot rows (a
# hybrid's recurrent state: ~112 MiB a row at Qwen3.8 Flash's geometry) every
# ``full_every`` steps, weights (which no graph writes) only at the last step.
LARGE = ("kv.", "weight.", "snapshot.kv", "paged.", "rows.", "snapshot.paged.", "snapshot.rows.")
READ_ONLY = ("weight.",)
# One full digest of the large written buffers per 8 steps for each 2 GiB of them.
FULL_EVERY_PER_SIZE = 8
FULL_DIGEST_BYTES = 2 << 30
# Device buffers are hashed through host copies of this many bytes at a time, on up
# to this many threads (SHA-256 releases the GIL; the 8B's 16 GiB of weights hash in
# seconds instead of ten).
DIGEST_CHUNK = 256 << 20
DIGEST_THREADS = min(8, os.cpu_count() or 1)


def buffer_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous tensor, on the host."""
    if not tensor.is_contiguous():
        raise ValueError("qualification reads contiguous buffers only")
    return tensor.detach().reshape(-1).view(torch.uint8).cpu().numpy()


def digest(tensor: torch.Tensor, chunk: int = DIGEST_CHUNK) -> str:
    """SHA-256 of a contiguous tensor's bytes, streamed through the host ``chunk``
    bytes at a time (no host copy of a whole page pool)."""
    if not tensor.is_contiguous():
        raise ValueError("qualification reads contiguous buffers only")
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    sha = hashlib.sha256()
    for start in range(0, flat.numel(), chunk):
        sha.update(flat[start : start + chunk].cpu().numpy())
    return sha.hexdigest()


@functools.cache
def _digest_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(DIGEST_THREADS, thread_name_prefix="digest")


def digests(tensors: Sequence[torch.Tensor]) -> list[str]:
    """``digest`` of each tensor, in order, hashed on ``DIGEST_THREADS`` threads."""
    if len(tensors) < 2 or DIGEST_THREADS < 2:
        return [digest(tensor) for tensor in tensors]
    return list(_digest_pool().map(digest, tensors))


def full_digest_period(buffers: dict[str, torch.Tensor]) -> int:
    """Steps between full digests: 8 per started 2 GiB of the large written buffers."""
    large = sum(
        tensor.numel() * tensor.element_size()
        for name, tensor in buffers.items()
        if name.startswith(LARGE) and not name.startswith(READ_ONLY)
    )
    return FULL_EVERY_PER_SIZE * max(1, math.ceil(large / FULL_DIGEST_BYTES))


def changed_span(before: np.ndarray, after: np.ndarray) -> tuple[int, int] | None:
    """[first, last + 1) of the bytes that differ, or None when none do."""
    differ = np.flatnonzero(before != after)
    if differ.size == 0:
        return None
    return int(differ[0]), int(differ[-1]) + 1


class QualificationRecorder:
    """Records launches of ``prepared`` as ``QualificationStep`` messages."""

    def __init__(
        self,
        prepared: PreparedModel,
        buffers: dict[str, torch.Tensor],
        graph_index: dict[GraphKey, int],
        full_every: int | None = None,
    ) -> None:
        self.prepared = prepared
        self.buffers = buffers
        self.graph_index = graph_index
        self.full_every = full_every or full_digest_period(buffers)
        self.steps: list[pb.QualificationStep] = []
        self._mirror = {
            name: buffer_bytes(t).copy()
            for name, t in buffers.items()
            if name.startswith(HOST_WRITTEN)
        }

    def execute(self, key: GraphKey) -> None:
        writes = []
        for name, before in self._mirror.items():
            now = buffer_bytes(self.buffers[name])
            span = changed_span(before, now)
            if span is not None:
                lo, hi = span
                writes.append(pb.BufferWrite(buffer=name, offset=lo, data=now[lo:hi].tobytes()))
        self.prepared.execute(key)
        if self.prepared.storage.cache.kv.is_cuda:
            torch.cuda.synchronize()
        full = len(self.steps) % self.full_every == self.full_every - 1
        self.steps.append(
            pb.QualificationStep(
                graph=self.graph_index[key], writes=writes, digests=self._digests(full)
            )
        )
        for name in self._mirror:
            self._mirror[name] = buffer_bytes(self.buffers[name]).copy()

    def _digests(self, full: bool, last: bool = False) -> list[pb.BufferDigest]:
        names = [
            name
            for name in self.buffers
            if last or (full and not name.startswith(READ_ONLY)) or not name.startswith(LARGE)
        ]
        hashes = digests([self.buffers[name] for name in names])
        return [
            pb.BufferDigest(buffer=name, sha256=sha)
            for name, sha in zip(names, hashes, strict=True)
        ]

    def finish(self) -> pb.Qualification:
        """The recorded sequence; its last step digests every buffer."""
        if self.steps:
            last = self.steps[-1]
            del last.digests[:]
            last.digests.extend(self._digests(full=True, last=True))
        return pb.Qualification(steps=self.steps)


def replay_qualification(
    prepared: PreparedModel,
    qualification: pb.Qualification,
    buffers: dict[str, torch.Tensor],
    keys: list[GraphKey],
) -> list[str]:
    """Replays a recorded sequence on ``prepared`` (reset first) and returns one line
    per digest that differs: the Python side of ``flare replay --check``."""
    prepared.reset()
    mismatches = []
    for index, step in enumerate(qualification.steps):
        for write in step.writes:
            target = buffer_bytes(buffers[write.buffer]).copy()
            target[write.offset : write.offset + len(write.data)] = np.frombuffer(
                write.data, dtype=np.uint8
            )
            flat = buffers[write.buffer].reshape(-1).view(torch.uint8)
            flat.copy_(torch.from_numpy(target))
        prepared.execute(keys[step.graph])
        actual = digests([buffers[expected.buffer] for expected in step.digests])
        for expected, sha in zip(step.digests, actual, strict=True):
            if sha != expected.sha256:
                mismatches.append(f"step {index} ({keys[step.graph]}): {expected.buffer}")
    return mismatches


def _prompt(gen: torch.Generator, length: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (length,), generator=gen).tolist()


def run_workload(prepared: PreparedModel, execute: Callable[[GraphKey], None]) -> None:
    """The recorded workload: serving-like traffic, then the prefix operations."""
    catalog = prepared.catalog
    vocab = prepared.model.geometry.vocab
    chunk = catalog.prefill_chunk_size
    gen = torch.Generator().manual_seed(11)
    # Every prefill capacity exactly, page boundaries, and a prompt of two chunks.
    lengths = [*catalog.prefill, 37, 63, 65, min(chunk + 5, catalog.context_limit - 64)]
    samplings = [
        SamplingParams(temperature=1.0, top_k=20, top_p=0.95),
        SamplingParams(temperature=0.7, top_k=1),
        SamplingParams(
            temperature=1.0, repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1
        ),
        SamplingParams(temperature=0.9, min_p=0.05),
    ]
    requests = [
        Request(i, _prompt(gen, n, vocab), 4 + 2 * i, samplings[i % len(samplings)], 500 + i)
        for i, n in enumerate(lengths)
    ]
    ran: set[GraphKey] = set()

    def noted(key: GraphKey) -> None:
        ran.add(key)
        execute(key)

    Harness(prepared, execute=noted).run(requests)
    # A wide preparation (more decode rows than those requests ever decode together):
    # as many short requests as it has rows, each decoding until all were admitted (one
    # prefill chunk an iteration), then ending one by one, so the batch passes through
    # every capacity from the largest down.
    widest = catalog.decode[-1]
    if any(GraphKey(GraphKind.DECODE, c) not in ran for c in catalog.decode):
        prompts = [_prompt(gen, 5 + i % 7, vocab) for i in range(widest)]
        short = [
            Request(
                len(requests) + i,
                prompt,
                min(widest + 1 + i, catalog.context_limit - len(prompt)),
                samplings[i % len(samplings)],
                700 + i,
            )
            for i, prompt in enumerate(prompts)
        ]
        Harness(prepared, execute=noted).run(short)

    # Prefix operations: prompt into slot 1, snapshot its tail, restore into slot 2
    # (sharing the full pages), resume slot 2 from the hidden vector, decode both.
    state, staging = prepared.storage.state, prepared.storage.staging
    page = catalog.page_size
    prompt = _prompt(gen, 2 * page + page // 2, vocab)
    state.page_table[1].zero_()
    state.page_table[2].zero_()
    state.page_table[1, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    sampling = samplings[0]
    pack_admission(staging, 1, prompt, 16, sampling, seed=77)
    execute(GraphKey(GraphKind.ADMIT, 1))
    # In chunks of the prepared size (2.5 pages can exceed it).
    for start in range(0, len(prompt), chunk):
        piece = prompt[start : start + chunk]
        pack_chunk(staging, 1, piece, ends_prompt=start + len(piece) == len(prompt))
        execute(GraphKey(GraphKind.PREFILL, catalog.prefill_capacity(len(piece))))
    staging.maint_slot.fill_(1)
    staging.maint_row.fill_(1)
    execute(GraphKey(GraphKind.SNAPSHOT, 1))
    state.page_table[2, :4] = torch.tensor([1, 2, 5, 6], dtype=torch.int32)
    pack_admission(staging, 2, prompt, 16, sampling, seed=77, consumed=len(prompt))
    execute(GraphKey(GraphKind.ADMIT, 1))
    staging.maint_slot.fill_(2)
    staging.maint_expect.fill_(len(prompt))
    execute(GraphKey(GraphKind.RESTORE, 1))
    pack_resume(staging, 2)
    execute(GraphKey(GraphKind.RESUME, 1))
    for capacity in sorted({catalog.decode_capacity(2), catalog.decode_capacity(1)}):
        for _ in range(3):
            pack_decode(staging, [2, 1] if capacity > 1 else [1], capacity)
            execute(GraphKey(GraphKind.DECODE, capacity))

    # Token masks (constrained decoding): all-ones masks, then a recorded mask of a
    # few tokens per row, then one row masked beside an unmasked one, then none.
    if not prepared.token_masks:
        return
    capacity = catalog.decode_capacity(2)
    everything = token_mask(range(vocab), vocab)
    few = [token_mask(_prompt(gen, 5, vocab), vocab) for _ in range(2)]
    for masks in ([everything, everything], few, [None, few[0]], []):
        pack_decode(staging, [2, 1], capacity, masks)
        execute(GraphKey(GraphKind.DECODE, capacity))
