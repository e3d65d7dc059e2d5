#!/usr/bin/env bash
# Runtime-core check in one call: export cores with Ignition, then rebuild and replay
# them with `flare` (no Python) and compare bitwise with the recorded Python replay.
# Results go to OUT_DIR.
#
#   bench/core_check.sh OUT_DIR MODEL FLARE_BIN [WHEEL_DIR] [-- EXTRA_PREPARE_ARGS...]
#
# MODEL: the checkpoint to export (e.g. SmolLM2-135M-Instruct.Q4_1.gguf). FLARE_BIN:
# a release build of `flare` (`cargo build --release -p flare`). WHEEL_DIR: wheels to
# install first (the flare_heliopause wheel; `gguf` for a .gguf model).
set -uo pipefail
usage="usage: bench/core_check.sh OUT_DIR MODEL FLARE_BIN [WHEEL_DIR] [-- PREPARE_ARGS...]"
out=${1:?$usage}
model=${2:?$usage}
flare=${3:?$usage}
shift 3
wheels=""
if [ $# -gt 0 ] && [ "$1" != "--" ]; then wheels=$1; shift; fi
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/flare-site "$wheels"/*.whl || exit 1
  export PYTHONPATH=/tmp/flare-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
export FLARE_BIN=$flare
status=0
# Tiny random Llama and Qwen3: export, agreement, native replay (pytest).
python3 -m pytest tests/test_export.py -m gpu -q -p no:cacheprovider -rs 2>&1 \
  | tee "$out/pytest-export.log" || status=1
core=$(mktemp -d)/core
python3 -m ignition.cli prepare "$model" --out "$core" "$@" > "$out/export.json" \
  2> "$out/export.log" || { tail -20 "$out/export.log"; exit 1; }
cat "$out/export.json"
"$flare" inspect "$core" > "$out/inspect.txt" 2>&1
"$flare" replay "$core" --check --json "$out/replay-check.json" > "$out/replay-check.log" 2>&1
check=$?
cat "$out/replay-check.log"
if [ $check -ne 0 ]; then
  status=1
  # A fault poisons the process: find the first faulting node in a fresh one.
  "$flare" replay "$core" --isolate --json "$out/replay-isolate.json" 2>&1 \
    | tee "$out/replay-isolate.log"
fi
for capacity in 1 4; do
  "$flare" replay "$core" --bench-decode "$capacity" --steps 256 \
    --json "$out/replay-bench-c$capacity.json" 2>&1 | tee "$out/replay-bench-c$capacity.log"
done
exit $status
