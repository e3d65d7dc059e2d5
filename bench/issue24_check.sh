#!/usr/bin/env bash
# Issue 24's checks that one GPU allows. Results go to OUT.
#
#   bench/issue24_check.sh tp-logits OUT
#       a tiny Qwen3 checkpoint's teacher-forced logits from two tensor-parallel
#       ranks (both on this GPU, over Gloo: ignition.parallel.logits_check) against
#       one rank's, in bfloat16 and float32, with the GPU kernels.
set -uo pipefail
usage="usage: bench/issue24_check.sh tp-logits OUT"
part=${1:?$usage}
out=${2:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton
work=${WORK:-/tmp/flare-issue24}
mkdir -p "$work"
status=0

case $part in
  tp-logits)
    python3 -c "import sys; from pathlib import Path; from checkpoints import write_tiny; \
write_tiny(Path(sys.argv[1]), 'qwen3')" "$work/tiny-qwen3" > /dev/null || exit 1
    for dtype in bfloat16 float32; do
      python3 -m ignition.parallel.logits_check "$work/tiny-qwen3" --world 2 --device cuda \
        --dtype "$dtype" --out "$out/tp-logits-$dtype.json" > "$out/tp-logits-$dtype.log" 2>&1 \
        || status=1
      tail -16 "$out/tp-logits-$dtype.log"
    done
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
exit $status
