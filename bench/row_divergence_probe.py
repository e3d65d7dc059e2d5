"""Where a decode row's arithmetic follows its batch: the first ops whose output for
one request differs between a step of that request alone and steps beside others.

A hybrid geometry at its real widths with fewer layers and experts (random weights,
eager, uncaptured, so every op runs through the dispatcher): four prompts are
prefilled and snapshotted; then request 1 takes one teacher-forced decode step three
times, restored before each: alone at capacity 1, alone in a capacity-4 step (padding
rows), and beside the other three. Every op's output is recorded (its slice for
request 1, where the batch is the one dimension whose size differs); the report
lists the ops whose slices differ from the capacity-1 step, in execution order, with
the model-code line that ran them.

    python3 bench/row_divergence_probe.py --out OUT.json [--geometry qwen4-exp-h200]
        [--layers 4] [--experts 16] [--prompt-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_qwen4_exp import _admit, _pages, _prefill, _restore, _snapshot  # noqa: E402

from ignition.loading.random_weights import GEOMETRIES, write_random_checkpoint  # noqa: E402
from ignition.preparation.catalog import GraphKey, GraphKind  # noqa: E402
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare  # noqa: E402
from ignition.replay.packing import pack_decode  # noqa: E402

# Outputs larger than this are state buffers written in place (pages, rows): skipped.
MAX_RECORDED = 1 << 24


# Source files whose lines name where an op ran.
SOURCES = ("/recipes/", "/ignition/components/", "/transformers/models/", "/fla/")


def _caller() -> str:
    """The innermost model-code line running the current op."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(part in name for part in SOURCES):
            return f"{Path(name).name}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


class OpRecorder(TorchDispatchMode):
    """Each op's name, the model-code line running it, and a copy of its first tensor
    output (or none)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str, torch.Tensor | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        kept = None
        if isinstance(first, torch.Tensor) and 0 < first.numel() <= MAX_RECORDED:
            kept = first.detach().clone()
        self.ops.append((str(func.overloadpacket), _caller(), kept))
        return out


def _slice(batched: torch.Tensor, alone: torch.Tensor) -> torch.Tensor | None:
    """``batched``'s part for the request at row 0: where exactly one dimension's size
    differs, its leading ``alone`` entries; the whole tensor where none does."""
    if batched.dim() != alone.dim():
        return None
    differ = [d for d in range(alone.dim()) if batched.shape[d] != alone.shape[d]]
    if not differ:
        return batched
    if len(differ) > 1 or batched.shape[differ[0]] < alone.shape[differ[0]]:
        return None
    return batched.narrow(differ[0], 0, alone.shape[differ[0]])


def _step(
    prepared: PreparedModel,
    slots: list[int],
    capacity: int,
    prompts: list[list[int]],
) -> tuple[list[tuple[str, str, torch.Tensor | None]], torch.Tensor]:
    state, staging = prepared.storage.state, prepared.storage.staging
    for slot in slots:
        _pages(prepared, slot, [2 * slot - 1, 2 * slot])
        _restore(prepared, slot, slot - 1, prompts[slot - 1], len(prompts[slot - 1]))
        state.pending[slot] = 17 + slot
    pack_decode(staging, slots, capacity)
    with OpRecorder() as recorder:
        prepared.execute(GraphKey(GraphKind.DECODE, capacity))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return recorder.ops, staging.logits[0].clone()


def compare(
    alone: list[tuple[str, str, torch.Tensor | None]],
    other: list[tuple[str, str, torch.Tensor | None]],
) -> dict[str, Any]:
    """The ops of ``other`` whose request-1 slice differs from ``alone``'s output."""
    differing: list[dict[str, Any]] = []
    for index, ((name, module, a), (name_b, _, b)) in enumerate(zip(alone, other, strict=False)):
        if name != name_b:
            return {"aligned_until": index, "then": [name, name_b], "differing": differing}
        if a is None or b is None:
            continue
        part = _slice(b, a)
        if part is None or part.shape != a.shape or part.dtype != a.dtype:
            continue
        if not torch.equal(part, a):
            diff = (part.float() - a.float()).abs()
            differing.append(
                {
                    "index": index,
                    "op": name,
                    "where": module,
                    "shape_alone": list(a.shape),
                    "shape_batched": list(b.shape),
                    "max_abs_diff": float(diff.max()),
                    "elements_differing": int((part != a).sum()),
                }
            )
    return {"aligned_until": min(len(alone), len(other)), "differing": differing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/flare-row-probe"))
    parser.add_argument("--geometry", default="qwen4-exp-h200", choices=sorted(GEOMETRIES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda, or cpu (with TRITON_INTERPRET=1 exported: the kernels interpreted)",
    )
    args = parser.parse_args()
    config = GEOMETRIES[args.geometry]()
    config.num_hidden_layers = args.layers
    if hasattr(config, "layer_types"):
        config.layer_types = config.layer_types[: args.layers]
    if hasattr(config, "num_experts"):
        config.num_experts = args.experts
    if hasattr(config, "ngram_vocab_size_base"):
        config.ngram_vocab_size_base = 10_000
    path = write_random_checkpoint(args.work / "geometry", config)
    options = PrepareOptions(
        max_concurrency=4,
        prefill_chunk_size=128,
        context_limit=1024,
        snapshot_rows=4,
        compile=False,
        capture=False,
        device=args.device,
        dtype=torch.bfloat16 if args.device == "cuda" else torch.float32,
    )
    prepared = prepare(path, options)
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, config.vocab_size, (args.prompt_tokens + i,), generator=generator).tolist()
        for i in range(4)
    ]
    prepared.reset()
    for slot, prompt in enumerate(prompts, start=1):
        _pages(prepared, slot, [2 * slot - 1, 2 * slot])
        _admit(prepared, slot, prompt)
        _prefill(prepared, slot, prompt, 0, len(prompt), last=True)
        _snapshot(prepared, slot, slot - 1)
    alone, logits_alone = _step(prepared, [1], 1, prompts)
    report: dict[str, Any] = {"geometry": args.geometry, "layers": args.layers,
                              "experts": args.experts, "ops": len(alone)}  # fmt: skip
    for label, slots, capacity in [("padded", [1], 4), ("beside", [1, 2, 3, 4], 4)]:
        ops, logits = _step(prepared, slots, capacity, prompts)
        found = compare(alone, ops)
        found["logits_equal"] = bool(torch.equal(logits, logits_alone))
        found["logits_max_abs_diff"] = float((logits.float() - logits_alone.float()).abs().max())
        report[label] = found
        print(f"{label}: logits equal {found['logits_equal']}, "
              f"{len(found['differing'])} ops differ")  # fmt: skip
        for entry in found["differing"][:25]:
            print("  ", json.dumps(entry))
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
