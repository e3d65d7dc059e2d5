"""Which compiled module makes the tiny hybrid's compiled CUDA forwards differ from
Transformers (issue 22: eager-captured graphs match, compiled ones did not).

Each variant prepares the tiny hybrid (``tests/checkpoints.write_tiny_hybrid``) on
CUDA in bf16 with ``torch.compile``, no capture, keeping the named module classes
out of the compiled regions (``torch.compiler.disable`` on their forwards), and
compares teacher-forced logits with Transformers' own bf16 forward, per position.
The variants run in parallel processes (compilation is CPU-bound); ``eager`` is the
uncompiled control. A second part compiles single canonical pieces on CUDA and
compares them with their eager results on identical operands.

    python bench/hybrid_compile_triage.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# A variant keeps the named callables out of the compiled regions: "module:Class"
# (its forward), "module:Class.method" or "module:function" ("canonical" is
# Transformers' modeling_qwen4_exp).
VARIANTS: dict[str, tuple[str, ...]] = {
    "eager": (),
    "compiled": (),
    "no-ple": ("recipes.qwen4_exp:PreparedPle",),
    "no-gdn": ("recipes.qwen4_exp:PreparedGatedDeltaNet",),
    "no-qsa": ("recipes.qwen4_exp:PreparedSparseAttention",),
    "no-moe": ("canonical:Qwen4ExpTextSparseMoeBlock",),
    "no-residual": ("canonical:Qwen4ExpTextGatedResidual",),
    # Within PLE (the variant above that matched):
    "ple-hash-eager": ("recipes.qwen4_exp:ngram_embeddings",),
    "row-reads-eager": ("recipes.qwen4_exp:StepContext.read",),
    "row-writes-eager": ("recipes.qwen4_exp:StepContext.write",),
    "conv-eager": ("torch.nn:Conv1d",),
}


def _disable(targets: tuple[str, ...]) -> None:
    import importlib

    from transformers.models.qwen4_exp import modeling_qwen4_exp

    for target in targets:
        module_name, attr = target.split(":")
        if module_name == "canonical":
            owner = modeling_qwen4_exp
        else:
            owner = importlib.import_module(module_name)
        name, _, method = attr.partition(".")
        if method or isinstance(getattr(owner, name), type):
            owner, name = getattr(owner, name), method or "forward"
        setattr(owner, name, torch.compiler.disable(getattr(owner, name)))


def run_variant(name: str, checkpoint: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    from ignition.preparation.prepared import PrepareOptions, prepare
    from ignition.replay.teacher_forcing import teacher_forced_logits

    _disable(VARIANTS[name])
    options = PrepareOptions(
        max_concurrency=1,
        prefill_chunk_size=128,
        context_limit=512,
        snapshot_rows=1,
        compile=name != "eager",
        capture=False,
        device="cuda",
        dtype=torch.bfloat16,
    )
    prepared = prepare(checkpoint, options)
    generator = torch.Generator().manual_seed(6)
    tokens = torch.randint(3, 512, (160,), generator=generator)
    tokens[160 // 3] = 2
    ids = tokens.tolist()
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16)
    reference = reference.cuda().eval()
    with torch.no_grad():
        want = reference(torch.tensor([ids], device="cuda")).logits[0].float().cpu()[139:]
    got = teacher_forced_logits(prepared, ids, 140, chunk=48)
    rows = ((got - want).norm(dim=-1) / want.norm(dim=-1)).tolist()
    top = [
        len(set(a.topk(10).indices.tolist()) & set(b.topk(10).indices.tolist())) / 10
        for a, b in zip(got, want, strict=True)
    ]
    result = {"variant": name, "disabled": VARIANTS[name], "relative_l2": rows, "top10": top}
    (out / f"variant-{name}.json").write_text(json.dumps(result, indent=1))


def _compare(name: str, fn, *args) -> dict[str, object]:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    with torch.no_grad():
        eager = fn(*args)
        compiled = torch.compile(fn, fullgraph=False, dynamic=False)(*args)
    eager_t = eager[0] if isinstance(eager, tuple) else eager
    compiled_t = compiled[0] if isinstance(compiled, tuple) else compiled
    diff = (eager_t.double() - compiled_t.double()).abs()
    scale = eager_t.double().abs().max().item()
    return {
        "piece": name,
        "equal": bool(torch.equal(eager_t, compiled_t)),
        "max_abs_diff": diff.max().item(),
        "max_abs": scale,
    }


def components(checkpoint: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    import recipes.qwen4_exp as hybrid
    from ignition.preparation.prepared import configure_compilation

    configure_compilation()
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).cuda().eval()
    config = model.config
    layers = model.model.layers
    ple_layer = next(i for i, layer in enumerate(layers) if getattr(layer, "ple", None) is not None)
    ngram = layers[ple_layer].ple.ple_embedding
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, config.vocab_size, (2, 48), generator=generator).cuda()
    tokens[0, 10] = 2
    history = torch.randint(0, config.vocab_size, (2, ngram.context_len), generator=generator)
    results = [
        _compare("ngram_ids", lambda t, h: hybrid.ngram_ids(ngram, t, h), tokens, history.cuda())
    ]
    hidden = torch.randn(1, 48, config.hidden_size, generator=generator).to("cuda", torch.bfloat16)
    moe = next(layer.mlp for layer in layers if hasattr(layer.mlp, "experts"))
    results.append(_compare("sparse_moe_block", lambda x: moe(x), hidden))
    stream = torch.randn(1, 48, config.hc_count * config.hidden_size, generator=generator).to(
        "cuda", torch.bfloat16
    )
    results.append(_compare("final_mixer", lambda x: model.model.hyper_connection_mixer(x), stream))
    (out / "components.json").write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--components", action="store_true")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), help="these variants")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.variant:
        run_variant(args.variant, args.checkpoint, args.out)
        return 0
    if args.components:
        components(args.checkpoint, args.out)
        return 0
    from checkpoints import write_tiny_hybrid

    checkpoint = write_tiny_hybrid(Path(tempfile.mkdtemp()) / "tiny")
    selected = args.only or list(VARIANTS)
    jobs = [
        subprocess.Popen(
            [sys.executable, __file__, "--out", str(args.out), "--checkpoint", str(checkpoint)]
            + (["--variant", name] if name else ["--components"]),
            stdout=open(args.out / f"log-{name or 'components'}.txt", "w"),
            stderr=subprocess.STDOUT,
        )
        for name in [*selected, None]
    ]
    codes = [job.wait() for job in jobs]
    # One file of every variant's rows (the device returns few files).
    summary: dict[str, object] = {
        "exit_codes": dict(zip([*selected, "components"], codes, strict=True))
    }
    for name in selected:
        path = args.out / f"variant-{name}.json"
        if path.exists():
            r = json.loads(path.read_text())
            r["max_relative_l2"], r["min_top10"] = max(r["relative_l2"]), min(r["top10"])
            summary[name] = r
            path.unlink()
    components_path = args.out / "components.json"
    if components_path.exists():
        summary["components"] = json.loads(components_path.read_text())
        components_path.unlink()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    for name in selected:
        r = summary.get(name)
        if isinstance(r, dict):
            print(f"{name:18} max rel L2 {r['max_relative_l2']:.4g}  min top-10 {r['min_top10']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
