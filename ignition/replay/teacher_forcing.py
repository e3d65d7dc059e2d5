"""Teacher-forced logits through the prepared operations, and their comparison metrics.

A token sequence is consumed by prefill chunks (the last one samples) and then one
decode step per remaining token, with the host overwriting the pending token by
the reference token before each step. The logits every step writes to its
diagnostic buffer are collected, so each position's logits come from exactly the
operation (and graph, when captured) that serving would run at that position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ignition.preparation.catalog import GraphKey, GraphKind
from ignition.preparation.prepared import PreparedModel
from ignition.replay.packing import SamplingParams, pack_admission, pack_chunk, pack_decode

SLOT = 1


def teacher_forced_logits(
    prepared: PreparedModel, tokens: list[int], prefill_tokens: int, chunk: int | None = None
) -> torch.Tensor:
    """Float32 logits [len(tokens) - prefill_tokens + 1, vocab] for positions
    prefill_tokens - 1 .. len(tokens) - 1."""
    storage, catalog = prepared.storage, prepared.catalog
    state, staging = storage.state, storage.staging
    chunk = chunk or catalog.prefill_chunk_size
    size = catalog.page_size
    pages = -(-len(tokens) // size)
    if pages >= storage.cache.pages:
        raise ValueError(f"{len(tokens)} tokens need {pages} pages; the cache has fewer")
    prepared.reset()
    state.page_table[SLOT, :pages] = torch.arange(1, pages + 1, dtype=torch.int32)
    pack_admission(staging, SLOT, tokens, 1 << 30, SamplingParams(temperature=1.0), seed=0)
    prepared.execute(GraphKey(GraphKind.ADMIT, 1))
    rows: list[torch.Tensor] = []
    consumed = 0
    while consumed < prefill_tokens:
        n = min(chunk, prefill_tokens - consumed)
        ends = consumed + n == prefill_tokens
        pack_chunk(staging, SLOT, tokens[consumed : consumed + n], ends)
        prepared.execute(GraphKey(GraphKind.PREFILL, catalog.prefill_capacity(n)))
        consumed += n
    rows.append(staging.logits[0].clone())
    pack_decode(staging, [SLOT], catalog.decode[0])
    for position in range(prefill_tokens, len(tokens)):
        state.pending[SLOT] = tokens[position]
        state.done[SLOT] = 0
        prepared.execute(GraphKey(GraphKind.DECODE, catalog.decode[0]))
        rows.append(staging.logits[0].clone())
    result = torch.stack(rows).float().cpu()
    prepared.reset()
    return result


@dataclass(frozen=True)
class LogitComparison:
    relative_l2: float  # ||actual - reference|| / ||reference||, over all positions
    top10_overlap: float  # mean |top10(actual) & top10(reference)| / 10
    kl: float  # mean KL(reference || actual) per position, FP32
    max_kl: float

    def as_dict(self) -> dict[str, float]:
        return {
            "relative_l2": self.relative_l2,
            "top10_overlap": self.top10_overlap,
            "kl": self.kl,
            "max_kl": self.max_kl,
        }


def compare_logits(actual: torch.Tensor, reference: torch.Tensor) -> LogitComparison:
    actual, reference = actual.float(), reference.float()
    relative = float((actual - reference).norm() / reference.norm())
    top_a = actual.topk(10, dim=-1).indices
    top_r = reference.topk(10, dim=-1).indices
    overlap = (top_a.unsqueeze(-1) == top_r.unsqueeze(-2)).any(-1).float().sum(-1) / 10
    log_p = torch.log_softmax(reference, dim=-1)
    log_q = torch.log_softmax(actual, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return LogitComparison(relative, float(overlap.mean()), float(kl.mean()), float(kl.max()))
