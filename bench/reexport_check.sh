#!/usr/bin/env bash
# Issue 22's re-export check on the GPU machine: the recipe interface leaves the
# llama recipe's cores unchanged. CHECKPOINT is exported by the tree in BEFORE (an
# older checkout's Python packages: `git archive REV ignition recipes | tar x -C
# BEFORE`), then twice by this tree (two exports of one tree, the check's control),
# each with bench/suite_gpu.sh's SmolLM2 options, and bench/core_diff.py compares
# them. Results go to OUT; the status is 0 when BEFORE's core equals this tree's.
#
#   bench/reexport_check.sh OUT CHECKPOINT BEFORE
#
# Needs the flare_heliopause wheel (and gguf for a .gguf checkpoint) importable, as
# bench/suite_gpu.sh installs them (PYTHONPATH).
set -uo pipefail
usage="usage: bench/reexport_check.sh OUT CHECKPOINT BEFORE"
out=${1:?$usage}
checkpoint=${2:?$usage}
before=${3:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
before=$(cd "$before" && pwd)
checkpoint=$(realpath "$checkpoint")
cd "$(dirname "$0")/.."
here=$PWD
site=${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
work=${WORK:-/tmp/flare-reexport}
mkdir -p "$work"

# export_core TREE CORE NAME: CHECKPOINT exported by TREE's packages into CORE.
export_core() {
  local tree=$1 core=$2 name=$3
  rm -rf "$core"
  (cd "$tree" && PYTHONPATH=$tree${site:+:$site} python3 -m ignition.cli prepare "$checkpoint" \
    --out "$core" --max-concurrency 4 --context-limit 8192) > "$out/export-$name.log" 2>&1 \
    || { tail -30 "$out/export-$name.log"; return 1; }
  tail -3 "$out/export-$name.log"
}

export_core "$before" "$work/before" before || exit 1
export_core "$here" "$work/now" now || exit 1
export_core "$here" "$work/again" again || exit 1
status=0
PYTHONPATH=$here${site:+:$site} python3 bench/core_diff.py "$work/before" "$work/now" \
  --out "$out/before-now.json" || status=1
PYTHONPATH=$here${site:+:$site} python3 bench/core_diff.py "$work/now" "$work/again" \
  --out "$out/now-again.json"
echo "status $status" | tee "$out/exit.txt"
exit $status
