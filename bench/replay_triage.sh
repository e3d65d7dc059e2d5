#!/usr/bin/env bash
# Native-replay triage in one call: export a tiny random core, replay it with
# `flare`, and when the replay fails, name the faulting node (--isolate), dump
# its kernel's SASS and resource usage, and run it under compute-sanitizer.
#
#   bench/replay_triage.sh OUT_DIR FLARE_BIN [FAMILY] [-- EXTRA_PREPARE_ARGS...]
#
# FAMILY: llama (default) or qwen3. PREPARE_ARGS default to a small core
# (4 requests, 512-token chunks, 2048 context, 200 pages). Needs `flare_heliopause` importable.
set -uo pipefail
usage="usage: bench/replay_triage.sh OUT_DIR FLARE_BIN [FAMILY] [-- PREPARE_ARGS...]"
out=${1:?$usage}
flare=${2:?$usage}
shift 2
family=llama
if [ $# -gt 0 ] && [ "$1" != "--" ]; then family=$1; shift; fi
[ "${1:-}" = "--" ] && shift
[ $# -eq 0 ] && set -- --max-concurrency 4 --prefill-chunk-size 512 --context-limit 2048 --kv-pages 200
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
work=$(mktemp -d)
python3 -c "import sys; from pathlib import Path; from checkpoints import write_tiny; \
write_tiny(Path(sys.argv[1]), sys.argv[2])" "$work/model" "$family" || exit 1
python3 -m ignition.cli prepare "$work/model" --out "$work/core" --no-compile "$@" \
  > "$out/export.json" 2> "$out/export.log" || { tail -30 "$out/export.log"; exit 1; }
"$flare" inspect "$work/core" > "$out/inspect.txt" 2>&1
if "$flare" replay "$work/core" --check --json "$out/replay-check.json" \
  > "$out/replay-check.log" 2>&1; then
  cat "$out/replay-check.log"
  exit 0
fi
cat "$out/replay-check.log"
"$flare" replay "$work/core" --isolate --json "$out/replay-isolate.json" \
  > "$out/replay-isolate.log" 2>&1
cat "$out/replay-isolate.log"
cuda=/usr/local/cuda/bin
python3 - "$out/replay-isolate.json" "$work/core/images" > "$out/faulting.txt" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
node = (report.get("failure") or {}).get("node") or {}
if node.get("image"):
    print(f"{sys.argv[2]}/{node['image']}.bin {node['function']}")
EOF
if read -r image function < "$out/faulting.txt"; then
  "$cuda/cuobjdump" -sass -fun "$function" "$image" > "$out/faulting-sass.txt" 2>&1
  "$cuda/cuobjdump" -res-usage "$image" > "$out/faulting-res-usage.txt" 2>&1
  "$cuda/cuobjdump" -elf "$image" 2>&1 | head -400 > "$out/faulting-elf.txt"
  head -60 "$out/faulting-sass.txt"
fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$sanitizer" ]; then
  timeout 240 "$sanitizer" --print-limit 20 "$flare" replay "$work/core" --check \
    > "$out/sanitizer.log" 2>&1
  head -80 "$out/sanitizer.log"
else
  echo "no compute-sanitizer on this machine"
fi
exit 1
