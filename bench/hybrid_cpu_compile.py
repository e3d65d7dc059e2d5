"""The tiny hybrid prepared twice on the CPU, compiled (Inductor) and eager, and the
teacher-forced logits of both compared: the compiled forwards (custom operators,
in-place writes, their fakes) compute what the eager ones do.

    python bench/hybrid_cpu_compile.py --out RESULT.json [--compile-scope forward|layer]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from checkpoints import write_tiny_hybrid  # noqa: E402

from ignition.preparation.compile_flags import COMPILE_SCOPES  # noqa: E402
from ignition.preparation.prepared import PrepareOptions, prepare  # noqa: E402
from ignition.replay.teacher_forcing import compare_logits, teacher_forced_logits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compile-scope", choices=COMPILE_SCOPES, default="forward")
    args = parser.parse_args()
    options = PrepareOptions(
        max_concurrency=2,
        prefill_chunk_size=128,
        context_limit=256,
        snapshot_rows=2,
        compile=True,
        compile_scope=args.compile_scope,
        capture=False,
        device="cpu",
        dtype=torch.float32,
    )
    with tempfile.TemporaryDirectory() as work:
        path = write_tiny_hybrid(Path(work) / "tiny")
        t0 = time.perf_counter()
        compiled = prepare(path, options)
        compile_s = time.perf_counter() - t0
        eager = prepare(path, replace(options, compile=False))
        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(3, 512, (150,), generator=gen).tolist()
        a = teacher_forced_logits(compiled, tokens, 130, chunk=64)
        b = teacher_forced_logits(eager, tokens, 130, chunk=64)
    result = {
        "compile_scope": args.compile_scope,
        "prepare_compiled_s": compile_s,
        "positions": a.shape[0],
        "max_abs_difference": float((a - b).abs().max()),
        **compare_logits(a, b).as_dict(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
