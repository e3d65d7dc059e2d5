#!/usr/bin/env bash
# issue 23: PDL A/B, prefetching kernels stream their weights evict_first: 8B then SmolLM2, default fusion
set -uo pipefail
. .carry/common.sh
if [ ! -e /dev/shm/chainA/started ]; then
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/machine.txt 2>&1
bash bench/detached.sh start /dev/shm/chainA 'export PYTHONPATH=/tmp/site:$PWD:$PWD/tests TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor; D=$DETACHED_OUT;
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out /tmp/q8 > /dev/null || exit 1
AB="--capacities 1 4 --compare-programmatic-launch --compare-prefetch-bytes 0 2097152 --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
python3 bench/kernel_timeline.py /tmp/q8 $AB --geometry qwen3-8b --out $D/8b-default.json > $D/8b-default.log 2>&1; echo "8b default rc=$? at ${SECONDS}s"; grep "^c=" $D/8b-default.log
rm -rf /tmp/q8; python3 -m ignition.loading.random_weights --geometry smollm2-135m --out /tmp/smol > /dev/null || exit 1
python3 bench/kernel_timeline.py /tmp/smol $AB --geometry smollm2-135m --out $D/smol-default.json > $D/smol-default.log 2>&1; echo "smol default rc=$? at ${SECONDS}s"; grep "^c=" $D/smol-default.log'
sleep 2
fi
bash bench/detached.sh wait /dev/shm/chainA ${1:-560} $OUT/a
tail -12 /dev/shm/chainA/log
