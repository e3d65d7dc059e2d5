#!/usr/bin/env bash
# issue 23: programmatic launch on by default, no prefetch: GPU test, then a SmolLM2 core prepared with the defaults, flare replay --check
set -uo pipefail
. .carry/common.sh
o=/tmp/oF; mkdir -p $o/core
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $o/machine.txt 2>&1
timeout 90 python3 -m pytest -m gpu tests/test_programmatic_launch.py -v -p no:cacheprovider -rs > $o/pytest-gpu.log 2>&1
echo "pytest rc=$? at ${SECONDS}s"; tail -3 $o/pytest-gpu.log
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out /tmp/smol --safetensors > /dev/null || exit 1
WORK=/tmp/w23 timeout $((300 - SECONDS)) bash bench/issue23_check.sh pdl-core $o/core /tmp/smol $PWD/.carry/flare \
  --max-concurrency 4 --context-limit 4096 --prefill-chunk-size 256 > $o/core/check.log 2>&1
echo "pdl-core rc=$? at ${SECONDS}s" | tee -a $o/core/check.log; tail -14 $o/core/check.log
sed -i 's#/tmp/w23#WORK#g' $o/core/*.log $o/core/*.json 2>/dev/null
pack $o final
