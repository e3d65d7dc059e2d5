"""A checkpoint with a real model's geometry and random weights.

Startup time and throughput at sizes such as a dense 8B model are measured on
machines that download nothing, so a geometry directory stands in for the
checkpoint: ``config.json`` (naming the Transformers class of its model type, as a
real checkpoint's does), a character-level tokenizer over the whole vocabulary with
a ChatML template (distinct prompts stay distinct and every sampled id streams
text), and ``random-weights.json`` (seed and scale). Its source lists every tensor the
canonical model declares and generates each one when loaded, one at a time like
any other source: values cycle through one block of 2^20 normal samples (drawn
from the seed), starting at an offset taken from the tensor's name, so 8B weights
come at memory-copy speed and identically every time; norm weights are ones. The
weights suit measurements of time and memory, not of quality.

    python -m ignition.loading.random_weights --geometry llama-8b --out DIR
        [--tokenizer default | CHECKPOINT_DIR | FILE.gguf]

``--tokenizer`` takes a real checkpoint's tokenizer and chat template instead of the
character tokenizer (``default``: the embedded SmolLM2 GGUF's): the geometry then
renders and tokenizes chats, tools included, as that model does, for measurements of
the serving path (SmolLM2's geometry with its own tokenizer stands in for the GGUF,
3.4 MB against 98, on machines that carry files in bounded calls).

With ``--safetensors`` the directory is an ordinary Transformers checkpoint instead:
the same generated weights written to safetensors shards with an index, so that
engines that only read checkpoints (Transformers itself) load exactly the tensors
Ignition generates.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import zlib
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Qwen3Config,
)
from transformers.core_model_loading import revert_weight_conversion
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from ignition.loading.default_model import default_model_path
from ignition.loading.source import CheckpointError, TensorInfo
from ignition.loading.synthetic_tokenizers import char_level_tokenizer

MARKER = "random-weights.json"
_BLOCK = 1 << 20


# Positions the geometries admit: enough for the 64K-token prompts of the benchmark
# suite. The weights are random, so the rotary variant changes no timing and no shape.
_MAX_POSITIONS = 131072


def _smollm2_135m() -> PretrainedConfig:
    """SmolLM2-135M's geometry (the embedded default model's GGUF: 30 layers at hidden
    576, GQA 9/3, vocab 49152, tied embeddings) at its 8192 positions: its decode step
    measured without carrying the checkpoint."""
    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )


def _llama_8b() -> PretrainedConfig:
    """Llama-3-8B's geometry (GQA 32/8, vocab 128256), up to 128K positions."""
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=_MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=2,
        eos_token_id=1,
        tie_word_embeddings=False,
    )


def _qwen3_8b() -> PretrainedConfig:
    """Qwen3-8B's geometry (GQA 32/8, head_dim 128, q/k norms, vocab 151936), up to
    128K positions."""
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=_MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=2,
        eos_token_id=1,
        tie_word_embeddings=False,
    )


def _qwen4_exp_h200(experts: int = 128) -> PretrainedConfig:
    """Qwen3.8 Flash's per-token work with 128 experts instead of 512, so that bf16
    weights fit one H200 (issue 22): 48 layers of hidden 2560 (36 Gated DeltaNet of
    16 key and 48 value heads of 128, 12 QSA of 16 heads of 256 with 2 KV heads),
    top-10 routed experts of 640 and a shared one, four hyperconnection streams, PLE
    on the first layer; the indexer (16 heads of 128, budget 2048, blocks of 4) and
    the PLE table (16 n-gram heads of 160 over about 1M rows each) are
    assumptions where the public config is silent. Its 75 GB of weights outgrow a
    64 GiB disk as a core; with ``experts=64`` (45 GB) a step reads the same bytes
    at one sequence (top-10 of 640 either way)."""
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

    return Qwen4ExpTextConfig(
        vocab_size=248320,
        hidden_size=2560,
        num_hidden_layers=48,
        layer_types=(["linear_attention"] * 3 + ["qwen_sparse_attention"]) * 12,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        moe_intermediate_size=640,
        shared_expert_intermediate_size=640,
        num_experts=experts,
        num_experts_per_tok=10,
        hc_count=4,
        hc_lowrank=320,
        ple_layer_ids=[1],
        ple_embed_dim=2560,
        ngram_size=3,
        heads_per_ngram=8,
        ngram_vocab_size_base=1_000_000,
        split_ngram_parts=16,
        indexer_n_heads=16,
        indexer_kv_heads=1,
        indexer_head_dim=128,
        indexer_budget=2048,
        indexer_compress_ratio=4,
        max_position_embeddings=_MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
        },
        bos_token_id=2,
        eos_token_id=1,
        tie_word_embeddings=False,
    )


GEOMETRIES = {
    "smollm2-135m": _smollm2_135m,
    "llama-8b": _llama_8b,
    "qwen3-8b": _qwen3_8b,
    "qwen4-exp-h200": _qwen4_exp_h200,
    "qwen4-exp-h200-e64": lambda: _qwen4_exp_h200(experts=64),
}


def write_random_checkpoint(
    out: Path,
    config: PretrainedConfig | str,
    seed: int = 0,
    std: float = 0.02,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> Path:
    """A geometry directory for ``config`` (or a name in ``GEOMETRIES``), with
    ``tokenizer`` (default: a character tokenizer over the whole vocabulary), whose
    ids must fit the geometry's vocabulary."""
    if isinstance(config, str):
        if config not in GEOMETRIES:
            raise CheckpointError(f"unknown geometry {config!r}; known: {', '.join(GEOMETRIES)}")
        config = GEOMETRIES[config]()
    out.mkdir(parents=True, exist_ok=True)
    if not config.architectures:
        causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        if causal is None:
            raise CheckpointError(f"no causal LM class for model_type {config.model_type!r}")
        config.architectures = [causal]
    if tokenizer is None:
        tokenizer = char_level_tokenizer(config.vocab_size)
    elif len(tokenizer) > config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {len(tokenizer)} ids, the geometry's vocabulary "
            f"{config.vocab_size}: pick a geometry whose vocabulary holds them"
        )
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"seed": seed, "std": std}))
    return out


class RandomWeightsCheckpoint:
    """The source of a geometry directory: every canonical tensor, generated on load."""

    def __init__(self, path: Path) -> None:
        self.path = path
        marker = json.loads((path / MARKER).read_text())
        self.seed = int(marker["seed"])
        self.std = float(marker["std"])
        self._config = AutoConfig.from_pretrained(path)
        gen = torch.Generator().manual_seed(self.seed)
        block = torch.randn(_BLOCK, generator=gen, dtype=torch.float32) * self.std
        # Twice over, so that any window of _BLOCK values starting inside is contiguous.
        self._block = block.to(torch.bfloat16).repeat(2)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self._config, dtype=torch.bfloat16)
        tied = bool(getattr(self._config, "tie_word_embeddings", False))
        parameters = {
            name: p
            for name, p in model.named_parameters(remove_duplicate=not tied)
            if not (tied and name == "lm_head.weight")
        }
        # Named as a saved checkpoint names them: Transformers' own saving conversion
        # (per-expert projections, sharded tables), on meta tensors; none for dense
        # families, whose parameters are their checkpoint tensors.
        stored = revert_weight_conversion(model, parameters)
        self._tensors = {
            name: TensorInfo(name, tuple(t.shape), torch.bfloat16) for name, t in stored.items()
        }

    def config(self) -> PretrainedConfig:
        return self._config

    def tensors(self) -> dict[str, TensorInfo]:
        return dict(self._tensors)

    def load(self, name: str) -> torch.Tensor:
        info = self._tensors.get(name)
        if info is None:
            raise CheckpointError(f"{self.path}: no tensor {name}")
        if name.endswith("norm.weight"):
            return torch.ones(info.shape, dtype=info.dtype)
        numel = math.prod(info.shape)
        start = zlib.crc32(name.encode()) % _BLOCK
        whole, rest = divmod(numel, _BLOCK)
        window = self._block[start : start + _BLOCK]
        parts = [window] * whole + [window[:rest]]
        return torch.cat(parts).view(info.shape)

    def tokenizer_source(self) -> tuple[Path, dict[str, str]]:
        return self.path, {}

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name in ("config.json", MARKER):
            digest.update((self.path / name).read_bytes())
        return digest.hexdigest()


def materialize(geometry_dir: Path, out: Path, shard_bytes: int = 4 << 30) -> Path:
    """Writes the geometry directory's generated weights as a Transformers checkpoint
    in ``out``: its config and tokenizer, safetensors shards of at most
    ``shard_bytes`` (one tensor may exceed it alone) and ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    source = RandomWeightsCheckpoint(geometry_dir)
    out.mkdir(parents=True, exist_ok=True)
    source.config().save_pretrained(out)
    AutoTokenizer.from_pretrained(geometry_dir).save_pretrained(out)
    shards: list[list[str]] = [[]]
    size = 0
    for name, info in source.tensors().items():
        nbytes = math.prod(info.shape) * info.dtype.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for index, names in enumerate(shards, start=1):
        file = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: source.load(name).contiguous() for name in names}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=1))
    return out


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer: a Transformers directory, a ``.gguf`` file (as
    Transformers converts it), or ``default``, the embedded model's GGUF."""
    from ignition.loading.open import open_checkpoint  # it opens this module's kind too

    path = default_model_path() if source == "default" else Path(source)
    directory, kwargs = open_checkpoint(path).tokenizer_source()
    return AutoTokenizer.from_pretrained(directory, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description="write a random-weight geometry directory")
    parser.add_argument("--geometry", choices=sorted(GEOMETRIES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizer",
        help="a checkpoint's tokenizer and chat template (a Transformers directory, a "
        ".gguf file, or 'default': the embedded SmolLM2 GGUF's) instead of the "
        "character tokenizer",
    )
    parser.add_argument(
        "--safetensors",
        action="store_true",
        help="write an ordinary Transformers checkpoint of the same weights",
    )
    args = parser.parse_args()
    tokenizer = None if args.tokenizer is None else load_tokenizer(args.tokenizer)
    if not args.safetensors:
        print(write_random_checkpoint(args.out, args.geometry, args.seed, tokenizer=tokenizer))
        return
    geometry_dir = args.out.with_name(args.out.name + ".geometry")
    write_random_checkpoint(geometry_dir, args.geometry, args.seed, tokenizer=tokenizer)
    print(materialize(geometry_dir, args.out))


if __name__ == "__main__":
    main()
