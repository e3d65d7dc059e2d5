#!/usr/bin/env bash
# Issue 22's re-export check on the GPU machine: the recipe interface leaves the
# llama recipe's cores unchanged. CHECKPOINT is exported by the tree in BEFORE (an
# older checkout's Python packages: `git archive REV ignition recipes | tar x -C
# BEFORE`), then twice by AFTER (the same for a later revision; default: this tree's
# ignition and recipes), each with bench/suite_gpu.sh's SmolLM2 options plus
# OPTIONS, and bench/core_diff.py compares BEFORE's core with AFTER's, AFTER's
# second export as the control: two exports of one tree differ in the padding bytes
# of PyTorch's kernel parameters, which no kernel reads, and core_diff counts a
# difference as that capture noise only where the control shows it too.
#
# Every export runs from one staging folder (WORK/tree), the trees taking turns in
# it: compiled kernels carry their source's path in their line info, so two trees at
# two paths would compile to different images from the same code. The exports share
# one compile cache, which BEFORE fills in a first export that is thrown away: a cold
# compilation leaves its autotuning's allocations in the graph pool (SmolLM2's was
# 282 MiB cold and 240 MiB warm, so the window differed), so every compared export
# compiles warm. Where the bytes still differ, core_diff says whether the two cores'
# recorded qualifications (every written buffer's digest after every launch) agree.
#
# Results go to OUT; the status is 0 when BEFORE's core equals AFTER's (but for
# capture noise).
#
#   bench/reexport_check.sh OUT CHECKPOINT BEFORE [AFTER] [-- OPTIONS...]
#
# Needs the flare_heliopause wheel (and gguf for a .gguf checkpoint) importable, as
# bench/suite_gpu.sh installs them (PYTHONPATH).
set -uo pipefail
usage="usage: bench/reexport_check.sh OUT CHECKPOINT BEFORE [AFTER] [-- OPTIONS...]"
out=${1:?$usage}
checkpoint=${2:?$usage}
before=${3:?$usage}
shift 3
after=
if [ $# -gt 0 ] && [ "$1" != -- ]; then
  after=$(cd "$1" && pwd) || { echo "$usage: no tree at $1" >&2; exit 2; }
  shift
fi
if [ $# -gt 0 ]; then
  [ "$1" = -- ] || { echo "$usage: options go after --" >&2; exit 2; }
  shift
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
before=$(cd "$before" && pwd)
checkpoint=$(realpath "$checkpoint")
cd "$(dirname "$0")/.."
here=$PWD
after=${after:-$here}
site=${PYTHONPATH:-}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
work=${WORK:-/tmp/flare-reexport}
stage=$work/tree
mkdir -p "$work"
rm -f "$out/times.txt"

# export_core TREE NAME [OPTIONS...]: CHECKPOINT exported by TREE's ignition and
# recipes, staged at WORK/tree, into WORK/NAME.
export_core() {
  local tree=$1 name=$2
  shift 2
  rm -rf "$stage" "${work:?}/$name"
  mkdir -p "$stage"
  cp -r "$tree/ignition" "$tree/recipes" "$stage/"
  local start=$SECONDS
  (cd "$stage" && PYTHONPATH=$stage${site:+:$site} python3 -m ignition.cli prepare \
    "$checkpoint" --out "$work/$name" --max-concurrency 4 --context-limit 8192 "$@") \
    > "$out/export-$name.log" 2>&1 \
    || { tail -30 "$out/export-$name.log"; return 1; }
  echo "export $name: $((SECONDS - start)) s" | tee -a "$out/times.txt"
}

export_core "$before" warm-up "$@" || exit 1
rm -rf "${work:?}/warm-up"
export_core "$before" before "$@" || exit 1
export_core "$after" after "$@" || exit 1
export_core "$after" control "$@" || exit 1
status=0
PYTHONPATH=$here${site:+:$site} python3 bench/core_diff.py "$work/before" "$work/after" \
  --control "$work/control" --out "$out/before-after.json" 2> "$out/before-after.log" \
  || status=1
PYTHONPATH=$here${site:+:$site} python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
c = d.get("control", {})
print("identical", d["identical"], "| equal but for capture noise",
      d.get("equal_but_for_capture_noise"), "| parameter bytes differing",
      c.get("bytes_differing"), "in", len(c.get("bytes_differing_by_kernel", {})), "kernels",
      "| unexplained", c.get("unexplained_count"), "of which in noisy parameters",
      c.get("unexplained_in_noisy_parameters"),
      "| buffers identical", d["buffers_identical"], "| images only in one",
      len(d["images_only_in_a"]), len(d["images_only_in_b"]),
      "| manifest fields differing", [f for f in d["manifest_fields_differing"]
                                       if not f.startswith("graphs[")],
      "| qualification identical", d["qualification_identical"],
      "over", d["qualification_steps"], "steps")' "$out/before-after.json" \
  | tee "$out/summary.txt"
echo "status $status" | tee "$out/exit.txt"
exit $status
