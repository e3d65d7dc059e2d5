#!/usr/bin/env bash
# Issue 23 (2026-12-05g): the served projections over K steps and pipeline depths;
# SmolLM2's geometry with its own tokenizer and chat template (random weights) served by
# flare and by the Python floor: tool-use TTFT, the agent trace, decode ITL; then the
# serving GPU tests on this tree's defaults.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
bash bench/issue23_check.sh stages "$out/stages" > "$out/stages.log" 2>&1; step stages $?
mkdir -p $WORK && rm -rf $WORK/smollm2 && cp -r .carry/smolrw $WORK/smollm2
python3 -m ignition.cli prepare $WORK/smollm2 --out $WORK/smollm2-core --max-concurrency 4 \
  --context-limit 8192 > "$out/prepare.log" 2>&1; step prepare $?
export SUITE_ARGS="--workloads tools agent decode"
bash bench/suite_gpu.sh smollm2-flare "$out/suite" "$PWD/.carry/flare" > "$out/suite-flare.log" 2>&1
step flare $?
bash bench/suite_gpu.sh smollm2-floor "$out/suite" > "$out/suite-floor.log" 2>&1; step floor $?
bash bench/suite_gpu.sh report "$out/suite" > "$out/suite-report.log" 2>&1; step report $?
bash bench/issue23_check.sh serving "$out/serving" > "$out/serving.log" 2>&1; step serving $?
echo chain done
