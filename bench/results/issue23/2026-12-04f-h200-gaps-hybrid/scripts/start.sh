#!/usr/bin/env bash
# session start: 8B + SmolLM2 timelines with per-gap attribution (defaults, compared against plain), then the e64 hybrid core's replay --check with programmatic launch on; detached
set -uo pipefail
. .carry/common.sh
if [ ! -e DETACHED/started ]; then
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/machine.txt 2>&1
bash bench/detached.sh start DETACHED 'export PYTHONPATH=SITE:$PWD:$PWD/tests TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor; D=$DETACHED_OUT; F=$PWD/.carry/flare; chmod +x $F
AB="--capacities 1 4 --compare-programmatic-launch --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out Q8 > /dev/null || exit 1
python3 bench/kernel_timeline.py Q8 $AB --geometry qwen3-8b --out $D/8b-default.json > $D/8b-default.log 2>&1; echo "8b default rc=$? at ${SECONDS}s"; grep "^c=" $D/8b-default.log
rm -rf Q8; python3 -m ignition.loading.random_weights --geometry smollm2-135m --out SMOL > /dev/null || exit 1
python3 bench/kernel_timeline.py SMOL $AB --geometry smollm2-135m --out $D/smol-default.json > $D/smol-default.log 2>&1; echo "smol default rc=$? at ${SECONDS}s"; grep "^c=" $D/smol-default.log
mkdir -p WORK; GEOMETRY=qwen4-exp-h200-e64 WORK=WORK bash bench/issue22_check.sh h200 $D/hybrid $F; echo "hybrid rc=$? at ${SECONDS}s"'
sleep 2
fi
bash bench/detached.sh wait DETACHED ${1:-560} $OUT/a
tail -30 DETACHED/log
