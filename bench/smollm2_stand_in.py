"""SmolLM2-135M's stand-in, written from this repository alone: its geometry with
random weights (``ignition.loading.random_weights``) and SmolLM2's own tokenizer,
chat template and special tokens (the fixture ``helios/tests/fixtures/chat`` holds,
as ``tests/agent_fixtures.fixture_tokenizer`` loads them).

It renders and tokenizes chats, tools included, as SmolLM2 does, so the serving path
measures as it would on the real model; the weights suit time and memory, not
quality. Written on the GPU machine, it spares each call the 3.4 MB the directory
would cost to carry (and the GGUF's 98 MB).

    python bench/smollm2_stand_in.py OUT [--seed N]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from agent_fixtures import fixture_tokenizer  # noqa: E402

from ignition.loading.random_weights import write_random_checkpoint  # noqa: E402

GEOMETRY = "smollm2-135m"


def write_stand_in(out: Path, seed: int = 0) -> Path:
    """The stand-in directory at ``out``: ``config.json``, ``random-weights.json`` and
    the fixture's tokenizer and chat template."""
    return write_random_checkpoint(out, GEOMETRY, seed, tokenizer=fixture_tokenizer("smollm2"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_stand_in(args.out, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
