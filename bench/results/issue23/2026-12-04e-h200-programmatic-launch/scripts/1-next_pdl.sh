#!/usr/bin/env bash
# issue 23: PDL on the 8B geometry (GPU test + A/B timeline in one run), then the PDL core's replay check on SmolLM2
set -uo pipefail
. .carry/common.sh
o=/tmp/oP; mkdir -p $o/pdl $o/core
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $o/machine.txt 2>&1
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out /tmp/q8 > /dev/null || exit 1
timeout 400 bash bench/issue23_check.sh pdl $o/pdl /tmp/q8 --geometry qwen3-8b --prompt-tokens 128 \
  --prefill-chunk-size 128 --context-limit 4096 ${PDL_ARGS:-} > $o/pdl/check.log 2>&1
echo "pdl rc=$? at ${SECONDS}s" | tee -a $o/pdl/check.log; tail -12 $o/pdl/check.log
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out /tmp/smol --safetensors > /dev/null || exit 1
WORK=/tmp/w23 timeout $((580 - SECONDS)) bash bench/issue23_check.sh pdl-core $o/core /tmp/smol $PWD/.carry/flare \
  --max-concurrency 4 --context-limit 8192 > $o/core/check.log 2>&1
echo "pdl-core rc=$? at ${SECONDS}s" | tee -a $o/core/check.log; tail -12 $o/core/check.log
pack $o pdl
