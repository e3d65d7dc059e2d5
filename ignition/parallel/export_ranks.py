"""A tensor-parallel group's runtime core: one process per rank exports its own core
over the export-safe collectives, then the cores are merged.

Each rank (``ignition.parallel.launch``), on its device of ``--rank-devices`` (both on
GPU 0 by default; two devices need peer access between them, and have not run yet):

1. opens its window at its own base (``window.rank_base``: the ranks' windows side by
   side) with a ``collectives`` region last, at the same offset on every rank;
2. maps that region whole with exportable memory (``export_collectives``), passes its
   descriptor to its peer over the process group, and maps the peer's region at the
   peer's window address (``flare_heliopause.SharedSpan``), free in its own space;
3. prepares its shard with compile and capture on, its model's collectives the
   window collectives over the two regions (``window_collectives``): warm-up, capture
   and the qualification run the same calls in the same order on both ranks, which
   rendezvous in every collective;
4. walks its graphs accepting pointers into the peer's region, and writes its core.

Then ``ranks.merge_rank_cores`` writes the group's core. Two ranks (the window
collectives join two). A rank's own core (``CORE/ranks/rank-R``) holds a collectives
region but no rank layout: Helios refuses it alone, and reads only the group's.

    python -m ignition.parallel.export_ranks CHECKPOINT --out CORE
        [--max-concurrency 4] [--context-limit 4096] [--rank-devices 0,0]
        [--replay-out ANSWERS.json --prompts P.jsonl --max-new-tokens N --seed S ...]

With ``--replay-out``, once the cores are written every rank answers the prompts with
the Python replay harness over the very graphs it exported (reset to the core's
initial contents; the ranks run the same harness steps, their collectives meeting),
and rank 0 writes the answers as ``ignition prepare --replay-out`` does: what
``flare run`` serving the group's core must answer token for token
(``bench/serve_clients.py --python``).

"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ignition.cli import _add_requests, load_prompts
from ignition.export.exporter import export_core
from ignition.export.ranks import merge_rank_cores
from ignition.export.window import WindowPlacement, rank_base
from ignition.loading.open import open_checkpoint
from ignition.parallel.launch import spawn_ranks
from ignition.parallel.shard import TensorParallel
from ignition.parallel.shared_collectives import join_peer, storage_elements
from ignition.parallel.window_collectives import LIMIT_OFFSET, CollectiveStorage
from ignition.preparation.prepared import PrepareOptions
from recipes.registry import served_checkpoint

WORLD = 2


@dataclass
class RankSetup:
    """One rank's part in ``export_core``: its window's place and collectives region,
    and, once the window is open, the collectives over its and its peer's regions."""

    rank: int
    capacity: int
    dtype: torch.dtype
    device: int
    spans: list[Any] = field(default_factory=list)

    @property
    def collectives_bytes(self) -> int:
        return CollectiveStorage.span_bytes(self.capacity, self.dtype)

    def attach(self, window: WindowPlacement) -> tuple[TensorParallel, list[tuple[int, int]]]:
        """Exports this rank's collectives region, maps its peer's at the peer's
        address, and returns the rank's ``TensorParallel`` over the window collectives
        and the peer's region as the graph walk's ``peers``."""
        import torch.distributed as dist

        own_base = rank_base(self.rank, window.size)
        if own_base != window.base:
            raise RuntimeError(
                f"rank {self.rank}'s window is at {window.base:#x}, not {own_base:#x}"
            )
        address, size, fd = window.export_collectives()
        offset = address - window.base
        try:
            # Each rank's window and region as it laid them out: the peer's region is
            # mapped where the peer put it, and the two must agree in shape.
            places: list[Any] = [None] * WORLD
            dist.all_gather_object(places, (window.base, offset, size))
            peer = 1 - self.rank
            peer_base, peer_offset, peer_size = places[peer]
            if (peer_offset, peer_size) != (offset, size):
                raise RuntimeError(
                    f"rank {peer}'s collectives region ({peer_size} bytes at offset "
                    f"{peer_offset:#x}) is not rank {self.rank}'s ({size} bytes at {offset:#x})"
                )
        except BaseException:
            os.close(fd)
            raise
        peer_address = peer_base + peer_offset
        collectives, span = join_peer(
            self.rank, address, peer_address, size, fd, self.capacity, self.dtype, self.device
        )
        self.spans.append(span)
        return TensorParallel(self.rank, WORLD, collectives), [(peer_address, size)]

    def close(self) -> None:
        for span in self.spans:
            span.close()
        self.spans.clear()


@dataclass
class Answers:
    """The harness's requests (``ignition prepare``'s request flags, as parsed) and
    where rank 0 writes their answers."""

    requests: argparse.Namespace
    prompts: list[dict[str, object]]
    out: Path


def _rank_main(
    parallel: TensorParallel,
    checkpoint: Path,
    options: PrepareOptions,
    out: Path,
    answers: Answers | None,
    devices: tuple[int, int],
) -> None:
    from ignition.cli import answer_prompts

    config = served_checkpoint(open_checkpoint(checkpoint))[0].config()
    hidden, vocab = int(config.hidden_size), int(config.vocab_size)
    capacity = storage_elements(hidden, vocab, options.prefill_chunk_size, options.max_concurrency)
    device = devices[parallel.rank]
    setup = RankSetup(parallel.rank, capacity, options.dtype, device=device)
    after = None
    if answers is not None:

        def after(prepared: Any) -> None:
            # Every rank runs the harness (its launches meet the peer's collectives);
            # rank 0's tokens are every rank's (broadcast before any state update).
            quiet = contextlib.redirect_stdout(io.StringIO()) if parallel.rank else None
            with quiet or contextlib.nullcontext():
                result = answer_prompts(prepared, answers.requests, answers.prompts)
            if parallel.rank == 0:
                answers.out.write_text(json.dumps(result, indent=1))

    export_core(
        checkpoint,
        options,
        out / f"rank-{parallel.rank}",
        device=device,
        after_export=after,
        group=setup,
    )


def export_group(
    checkpoint: Path,
    options: PrepareOptions,
    out: Path,
    answers: Answers | None = None,
    devices: tuple[int, int] = (0, 0),
) -> Path:
    """Exports ``checkpoint`` at two ranks into ``out``/rank-R, then the group's core
    into ``out``; returns ``out``. With ``answers``, the harness's answers over the
    exported graphs are written too."""
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA is already initialized in this process: the ranks export")
    ranks = out / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    spawn_ranks(WORLD, _rank_main, checkpoint, options, ranks, answers, devices)
    merge_rank_cores([ranks / f"rank-{rank}" for rank in range(WORLD)], out, LIMIT_OFFSET)
    return out


def _devices(text: str) -> tuple[int, int]:
    """``--rank-devices``: two comma-separated device ordinals."""
    parts = text.split(",")
    if len(parts) != WORLD or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"name {WORLD} device ordinals, as 0,1: {text!r}")
    return (int(parts[0]), int(parts[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", type=Path, help="a checkpoint directory of a recipe that shards"
    )
    parser.add_argument("--out", type=Path, required=True, help="the group's core directory")
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--context-limit", type=int, default=4096)
    parser.add_argument(
        "--rank-devices",
        type=_devices,
        default=(0, 0),
        help="each rank's CUDA device, rank 0's first (default 0,0: both on one GPU)",
    )
    parser.add_argument(
        "--replay-out",
        type=Path,
        help="also answer the requests below with the Python harness over the exported "
        "graphs, written here as `ignition prepare --replay-out` writes them",
    )
    _add_requests(parser.add_argument_group("requests for --replay-out"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("a tensor-parallel export needs a CUDA GPU (both ranks may share one)")
    # The recipe's page size, not a family's constant.
    page_size = served_checkpoint(open_checkpoint(args.checkpoint))[1].page_size
    pages_per_request = -(-args.context_limit // page_size)
    options = PrepareOptions(
        max_concurrency=args.max_concurrency,
        # A chunk at most half the context: the qualification workload prompts every
        # prefill capacity exactly, plus output tokens.
        prefill_chunk_size=min(4096, args.context_limit // 2),
        context_limit=args.context_limit,
        # The requests' pages and the null page, not what free memory allows: the
        # ranks may share one GPU.
        kv_pages=args.max_concurrency * pages_per_request + 1,
        # Fusing the norms into the decode step needs the whole hidden row on one
        # rank; a rank's residual fusion is its own.
        decode_fusion="residuals",
    )
    answers = None
    if args.replay_out is not None:
        # Read now: a bad prompts file must fail before minutes of preparation.
        prompts = load_prompts(args.prompts, args.prompt or [])
        answers = Answers(args, prompts, args.replay_out.resolve())
    if max(args.rank_devices) >= torch.cuda.device_count():
        parser.error(
            f"--rank-devices {args.rank_devices} names a device this machine lacks "
            f"({torch.cuda.device_count()} visible)"
        )
    export_group(args.checkpoint, options, args.out, answers, args.rank_devices)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
