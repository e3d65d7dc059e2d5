"""Writes a GGUF checkpoint as a bf16 Transformers directory (config, safetensors,
tokenizer), so that Transformers' own serving and Flare (``ignition prepare DIR``)
run identical weights in a benchmark.

    python -m bench.suite.convert_gguf MODEL.gguf --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def convert(gguf: Path, out: Path) -> Path:
    """Dequantizes ``gguf`` through Transformers' GGUF loader, in bf16, into ``out``."""
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The GGUF loader marks its model quantized (not serializable) although its
    # tensors are already dequantized: move them into a plain model of the config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(convert(args.gguf, args.out))


if __name__ == "__main__":
    main()
