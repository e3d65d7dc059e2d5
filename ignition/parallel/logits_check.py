"""A tensor-parallel group's teacher-forced logits against one rank's, same checkpoint.

The checkpoint is prepared once without tensor parallelism (in this process) and once
per rank of a group of ``--world`` (``ignition.parallel.launch``), compile and
capture off; each runs the same tokens through the same prefill chunks and decode
steps (``ignition.replay.teacher_forcing``). Every rank gathers the whole
vocabulary's logits, so the ranks' logits must be bitwise equal to each other, and
within the reduction-order bound of the dtype to the single rank's: the group sums
each row-parallel projection from its ranks' partial sums, rounded to the dtype
before the sum, where one rank accumulates the whole dot product. Float32: a few
ulps through the layers (relative L2 under 1e-5, KL under 2^-20); bfloat16: each
extra rounding is up to 2^-8 relative (relative L2 under 2^-4, KL under 2^-8).

The group's collectives are Gloo's (``--collectives group``, host copies), or with
``--collectives window`` (two ranks) also the export-safe kernels a captured graph
replays (``ignition.parallel.window_collectives``): over shared memory on the CPU (the
kernels interpreted), over each other's exported device memory on the GPU
(``shared_collectives``). The window run is held to Gloo's: a two-rank sum is one
rounding of ``a + b`` either way, so its logits must equal the Gloo group's bit for
bit.

    python -m ignition.parallel.logits_check CHECKPOINT --world 2 --out F [--dtype bfloat16]
        [--collectives group|window]

Exits 1 when a bound is not met.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ignition.loading.open import open_checkpoint
from ignition.parallel.launch import spawn_ranks
from ignition.parallel.shard import TensorParallel
from ignition.parallel.shared_collectives import (
    RANK_ADDRESSES,
    share_collectives,
    storage_elements,
)
from ignition.parallel.window_collectives import CollectiveStorage, WindowCollectives
from ignition.preparation.prepared import PrepareOptions, prepare
from ignition.replay.teacher_forcing import compare_logits, teacher_forced_logits
from recipes.registry import served_checkpoint

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Per dtype: (relative L2, mean KL, top-10 overlap) the group must meet (module docs).
BOUNDS = {
    torch.float32: (1e-5, 2.0**-20, 0.99),
    torch.bfloat16: (2.0**-4, 2.0**-8, 0.9),
}


@dataclass(frozen=True)
class Run:
    """What every rank runs: the checkpoint, its options and the token sequence."""

    checkpoint: Path
    options: PrepareOptions
    tokens: list[int]
    prefill: int
    chunk: int


def rank_device(device: str, rank: int, world: int, gpus: int, current: int) -> torch.device:
    """Where rank ``rank`` of ``world`` runs: an unindexed ``cuda`` is ``cuda:rank``
    when there are ``gpus >= world``, else the ``current`` GPU (the ranks share it);
    any other device as given."""
    chosen = torch.device(device)
    if chosen.type != "cuda" or chosen.index is not None:
        return chosen
    return torch.device("cuda", rank if gpus >= world else current)


def _logits(run: Run, parallel: TensorParallel) -> torch.Tensor:
    options = replace(run.options, parallel=parallel)
    device = torch.device(options.device)
    if device.type == "cuda":
        device = rank_device(
            options.device,
            parallel.rank,
            parallel.world,
            torch.cuda.device_count(),
            torch.cuda.current_device(),
        )
        # Triton launches on the current device, whatever its tensors' device.
        torch.cuda.set_device(device)
        options = replace(options, device=str(device))
    prepared = prepare(run.checkpoint, options)
    return teacher_forced_logits(prepared, run.tokens, run.prefill, run.chunk)


def collective_capacity(run: Run) -> int:
    """Storage elements the window collectives need for ``run``
    (``shared_collectives.storage_elements``)."""
    config = served_checkpoint(open_checkpoint(run.checkpoint))[0].config()
    hidden, vocab = int(config.hidden_size), int(config.vocab_size)
    options = run.options
    return storage_elements(hidden, vocab, options.prefill_chunk_size, options.max_concurrency)


def _rank_main(
    parallel: TensorParallel,
    run: Run,
    out: Path,
    window: bool,
    storages: list[CollectiveStorage] | None,
) -> None:
    spans: list[Any] = []
    rank = parallel.rank
    if window and storages is not None:  # over the parent's shared memory (the CPU)
        parallel = TensorParallel(
            rank, 2, WindowCollectives(rank, storages[rank], storages[1 - rank])
        )
    elif window:  # over each other's exported device memory
        device = rank_device(run.options.device, rank, 2, torch.cuda.device_count(),
                             torch.cuda.current_device())  # fmt: skip
        torch.cuda.set_device(device)
        collectives, spans = share_collectives(
            rank, RANK_ADDRESSES, collective_capacity(run), run.options.dtype, device.index or 0
        )
        parallel = TensorParallel(rank, 2, collectives)
    try:
        torch.save(_logits(run, parallel), out / f"rank-{rank}.pt")
    finally:
        for span in spans:
            span.close()


def _group_logits(run: Run, world: int, out: Path, window: bool) -> list[torch.Tensor]:
    """Each rank's logits, over Gloo or (``window``) the window collectives."""
    out.mkdir()
    storages = None
    if window and run.options.device == "cpu":
        capacity = collective_capacity(run)
        storages = [CollectiveStorage.allocate(capacity, run.options.dtype, "cpu")
                    for _ in range(2)]  # fmt: skip
        for storage in storages:
            storage.buffers.share_memory_()
            storage.words.share_memory_()
    spawn_ranks(world, _rank_main, run, out, window, storages)
    return [torch.load(out / f"rank-{r}.pt") for r in range(world)]


def check(run: Run, world: int, collectives: str = "group") -> dict[str, object]:
    """The comparison's report (``passed`` says whether every bound held)."""
    if collectives not in ("group", "window"):
        raise ValueError(f"collectives are group or window, not {collectives}")
    if collectives == "window" and world != 2:
        raise ValueError(f"the window collectives join two ranks, not {world}")
    single = _logits(run, TensorParallel())
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # the ranks may share this process's GPU
    windowed = None
    with tempfile.TemporaryDirectory() as scratch:
        ranks = _group_logits(run, world, Path(scratch) / "group", window=False)
        if collectives == "window":
            windowed = _group_logits(run, world, Path(scratch) / "window", window=True)
    identical = all(torch.equal(ranks[0], other) for other in ranks[1:])
    comparison = compare_logits(ranks[0], single)
    relative_l2, kl, overlap = BOUNDS[run.options.dtype]
    passed = (
        identical
        and comparison.relative_l2 < relative_l2
        and comparison.kl < kl
        and comparison.top10_overlap >= overlap
    )
    report: dict[str, object] = {
        "checkpoint": run.checkpoint.name,
        "world": world,
        "dtype": str(run.options.dtype).removeprefix("torch."),
        "device": run.options.device,
        "collectives": collectives,
        "positions": int(single.shape[0]),
        "ranks_identical": identical,
        **comparison.as_dict(),
        "bounds": {"relative_l2": relative_l2, "kl": kl, "top10_overlap": overlap},
    }
    if windowed is not None:
        # Every window rank's logits, bit for bit the Gloo group's.
        report["window_matches_group"] = all(torch.equal(w, ranks[0]) for w in windowed)
        passed = passed and bool(report["window_matches_group"])
    report["passed"] = passed
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint directory or .gguf file of a dense model"
    )
    parser.add_argument("--world", type=int, default=2, help="ranks (default 2)")
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="(default float32; the GPU's attention kernels take bfloat16 only)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda: rank r on cuda:r where there are enough GPUs, else every rank "
        "on the current one",
    )
    parser.add_argument("--tokens", type=int, default=96, help="sequence length (default 96)")
    parser.add_argument(
        "--prefill", type=int, default=64, help="tokens read by prefill chunks (default 64)"
    )
    parser.add_argument("--chunk", type=int, default=32, help="prefill chunk (default 32)")
    parser.add_argument(
        "--collectives",
        choices=("group", "window"),
        default="group",
        help="Gloo's (default), or also the export-safe window collectives (two ranks), "
        "which must then match Gloo's bit for bit",
    )
    parser.add_argument("--out", type=Path, help="the report, JSON")
    args = parser.parse_args(argv)
    if args.collectives == "window" and args.world != 2:
        parser.error("--collectives window joins two ranks: --world 2")
    if torch.device(args.device).type == "cuda" and args.dtype != "bfloat16":
        # The prepared attention kernels take 16-bit floats on the GPU.
        parser.error(f"--dtype {args.dtype} runs on the CPU only; on the GPU use bfloat16")
    source, _ = served_checkpoint(open_checkpoint(args.checkpoint))
    vocab = int(source.config().vocab_size)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, vocab, (args.tokens,), generator=generator).tolist()
    context = -(-(args.tokens + 64) // 64) * 64
    options = PrepareOptions(
        max_concurrency=1,
        prefill_chunk_size=max(128, args.chunk),
        context_limit=context,
        # The sequence's pages and the null page, not what free memory allows: ranks
        # may share one GPU.
        kv_pages=context // 64 + 1,
        snapshot_rows=1,
        compile=False,
        capture=False,
        # The ranks' decode fusion for the reference too ("auto" would fuse the norms
        # on one GPU, which a rank of a group cannot): the two then
        # differ by the collectives' reduction order alone.
        decode_fusion="residuals",
        device=args.device,
        dtype=DTYPES[args.dtype],
    )
    run = Run(args.checkpoint, options, tokens, args.prefill, args.chunk)
    report = check(run, args.world, args.collectives)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
