"""``ignition``: prepare a checkpoint into captured graphs, and replay them from Python."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ignition.export.graph_walk import ExportError
from ignition.export.window import WindowError
from ignition.loading.default_model import default_model_path
from ignition.loading.source import CheckpointError
from ignition.preparation.catalog import CatalogError
from ignition.preparation.compile_flags import add_compile_options, compile_options
from ignition.preparation.memory import MemoryPlanError
from ignition.preparation.prepared import PreparedModel, PrepareOptions, prepare
from ignition.replay.harness import AdmissionError, Harness, Request
from ignition.replay.sampling_policy import resolve_sampling

DESCRIPTION = """Ignition prepares a checkpoint (a Transformers directory with config.json and
safetensors, or a GGUF file) into compiled, captured CUDA graphs over fixed storage.
Without MODEL it prepares the embedded default model, SmolLM2-135M-Instruct."""


def _add_preparation(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        type=Path,
        help="checkpoint directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=4,
        help="request slots, at most 64; decode graphs at 1, 2, 4, ... up to it (default 4)",
    )
    parser.add_argument(
        "--prefill-chunk-size",
        type=int,
        default=4096,
        help="largest prefill chunk, a multiple of 64; prefill graphs at 128, 256, ... "
        "up to it (default 4096)",
    )
    parser.add_argument(
        "--context-limit",
        type=int,
        help="longest request in tokens, a multiple of 64 (default: the model's maximum)",
    )
    parser.add_argument("--kv-pages", type=int, help="KV pages (default: sized from free memory)")
    parser.add_argument(
        "--snapshot-rows",
        type=int,
        default=None,
        help="prefix-checkpoint rows (default 32 per concurrent request, within a 4 GiB "
        "checkpoint-state budget)",
    )
    parser.add_argument(
        "--gpu-reserve-gib",
        type=float,
        default=2.0,
        help="GPU memory left free after pages are sized (default 2)",
    )
    add_compile_options(parser)
    parser.add_argument(
        "--no-token-masks",
        dest="token_masks",
        action="store_false",
        help="sampling graphs without the token-mask input (constrained decoding is then "
        "refused); for measuring what the input costs",
    )
    parser.add_argument(
        "--device", default="cuda", help="cuda (serving) or cpu (diagnostics; no graphs)"
    )


def _options(args: argparse.Namespace, capture: bool) -> PrepareOptions:
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return PrepareOptions(
        max_concurrency=args.max_concurrency,
        prefill_chunk_size=args.prefill_chunk_size,
        context_limit=args.context_limit,
        kv_pages=args.kv_pages,
        snapshot_rows=args.snapshot_rows,
        gpu_reserve_gib=args.gpu_reserve_gib,
        **compile_options(args),
        token_masks=args.token_masks,
        capture=capture and device == "cuda",
        device=device,
        dtype=dtype,
    )


def _prepare(args: argparse.Namespace, capture: bool) -> PreparedModel:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(
            "no CUDA device: preparation for serving needs a GPU (or --device cpu)"
        )
    path = args.model or default_model_path()
    return prepare(path, _options(args, capture))


def _cmd_prepare(args: argparse.Namespace) -> int:
    if args.out is not None:
        return _cmd_export(args)
    if args.replay_out is not None:
        raise CheckpointError("--replay-out answers over exported graphs: it needs --out")
    prepared = _prepare(args, capture=True)
    catalog = prepared.catalog
    print(f"model        {prepared.name} ({prepared.fingerprint[:16]})")
    print(f"decode       {list(catalog.decode)}")
    print(f"prefill      {list(catalog.prefill)}")
    print(f"graphs       {len(prepared.graphs)} captured")
    print(f"timings      {json.dumps({k: round(v, 2) for k, v in prepared.timings.items()})}")
    prepared.close()
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ignition.export.exporter import export_core

    if args.device != "cuda":
        raise CheckpointError("--out exports graphs, which needs --device cuda")
    if args.out.exists() and any(args.out.iterdir()):
        raise CheckpointError(f"{args.out} exists and is not empty; choose a new directory")
    replay_out: Path | None = args.replay_out
    after = None
    if replay_out is not None:
        # Read now: a bad prompts file must fail before minutes of preparation.
        prompts = load_prompts(args.prompts, args.prompt or [])

        def after(prepared: PreparedModel) -> None:
            replay_out.write_text(json.dumps(answer_prompts(prepared, args, prompts), indent=1))

    report = export_core(
        args.model or default_model_path(), _options(args, True), args.out, after_export=after
    )
    print(report.to_json())
    return 0


def load_prompts(path: Path | None, texts: list[str]) -> list[dict[str, object]]:
    """Prompts as JSON objects: ``{"messages": [...]}`` (chat) or ``{"text": "..."}``."""
    prompts: list[dict[str, object]] = [
        {"messages": [{"role": "user", "content": text}]} for text in texts
    ]
    if path is not None:
        for line in path.read_text().splitlines():
            if line.strip():
                prompts.append(json.loads(line))
    if not prompts:
        prompts.append(
            {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
        )
    return prompts


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: dict[str, object]) -> list[int]:
    """Token ids of a prompt: chat messages through the checkpoint's template, or text."""
    if "messages" in prompt:
        text = tokenizer.apply_chat_template(
            prompt["messages"], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(str(text), add_special_tokens=False))
    return list(tokenizer.encode(str(prompt["text"])))


def answer_prompts(
    prepared: PreparedModel, args: argparse.Namespace, prompts: list[dict[str, object]]
) -> dict[str, object]:
    """The Python harness's answers to ``prompts`` with the request flags of ``args``
    (``_add_requests``), printed one per line and returned as ``replay --out`` writes
    them."""
    # The flags are a request's sampling fields (an omitted flag is an omitted field),
    # resolved by the policy Helios applies to the same request.
    sampling = resolve_sampling(
        prepared.defaults,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
    )
    requests = [
        Request(
            i, encode_prompt(prepared.tokenizer, p), args.max_new_tokens, sampling, args.seed + i
        )
        for i, p in enumerate(prompts)
    ]
    results = Harness(prepared).run(requests)
    records = []
    for prompt, result in zip(prompts, results, strict=True):
        text = prepared.tokenizer.decode(result.tokens, skip_special_tokens=True)
        records.append(
            {
                "id": result.id,
                "prompt": prompt,
                "prompt_tokens": result.prompt_tokens,
                "tokens": result.tokens,
                "text": text,
                "finish_reason": result.finish_reason,
            }
        )
        print(f"[{result.id}] ({result.finish_reason}, {len(result.tokens)} tokens) {text}")
    return {"sampling": sampling.__dict__, "results": records}


def _cmd_replay(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts, args.prompt or [])
    prepared = _prepare(args, capture=not args.eager)
    answers = answer_prompts(prepared, args, prompts)
    if args.out:
        args.out.write_text(json.dumps(answers, indent=1))
    prepared.close()
    return 0


def _add_requests(parser: argparse.ArgumentParser) -> None:
    """The requests the harness answers: prompts, length and sampling fields."""
    parser.add_argument("--prompt", action="append", help="a user message (repeatable)")
    parser.add_argument(
        "--prompts", type=Path, help='JSONL: {"messages": [...]} or {"text": "..."} per line'
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    # Resolved as Helios resolves a request's fields (ignition.replay.sampling_policy):
    # a value clamps into the core's declared range; without a range, or omitted, the
    # parameter takes the declared default.
    parser.add_argument("--temperature", type=float, help="> 0 (default: the core's)")
    parser.add_argument("--top-k", type=int, help="0 or -1 disables (default: the core's)")
    parser.add_argument("--top-p", type=float, help="1 disables (default: the core's)")
    parser.add_argument("--min-p", type=float, help="0 disables (default: the core's)")
    parser.add_argument("--seed", type=int, default=0, help="request i uses seed + i")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ignition", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser(
        "prepare",
        help="prepare MODEL into captured graphs and report catalog, memory and timings",
    )
    _add_preparation(prep)
    prep.add_argument(
        "--out",
        type=Path,
        help="export the runtime core to this new directory (manifest, initial buffer "
        "contents, kernel images, qualification sequence) for `flare run` / `flare replay`; "
        "needs flare_heliopause and CUPTI",
    )
    prep.add_argument(
        "--replay-out",
        type=Path,
        help="with --out: once the core is written, answer the requests below with the "
        "Python harness over the exported graphs, in this process, and write them as "
        "`replay --out` does (the same graphs `flare run` serves, prepared once)",
    )
    _add_requests(prep.add_argument_group("requests for --replay-out"))
    prep.set_defaults(func=_cmd_prepare)
    replay = sub.add_parser(
        "replay",
        help="diagnostic direct execution: prepare, then schedule and replay the graphs "
        "from Python with continuous batching (never production serving)",
    )
    _add_preparation(replay)
    _add_requests(replay)
    replay.add_argument(
        "--eager", action="store_true", help="run the prepared operations without graphs"
    )
    replay.add_argument("--out", type=Path, help="write results as JSON")
    replay.set_defaults(func=_cmd_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (CheckpointError, CatalogError, MemoryPlanError, AdmissionError) as error:
        print(f"ignition: error: {error}", file=sys.stderr)
        return 2
    except (ExportError, WindowError) as error:
        print(f"ignition: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
