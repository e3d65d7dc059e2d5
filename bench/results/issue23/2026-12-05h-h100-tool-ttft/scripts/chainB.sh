#!/usr/bin/env bash
# Issue 23 (2026-12-05h): tool-use TTFT with the floor prefilling the server's prompt
# (the tools declared as Helios declares them for a template that shows none): SmolLM2's
# geometry with its own tokenizer and template, then the Qwen3-8B geometry (random
# weights, character tokenizer with a ChatML template), each served by flare and
# answered by the Python floor in the same run; the server's inter-token gaps beside
# the client's.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
flare=$PWD/.carry/flare
mkdir -p $WORK && rm -rf $WORK/smollm2 && cp -r .carry/smolrw $WORK/smollm2
python3 -m ignition.cli prepare $WORK/smollm2 --out $WORK/smollm2-core --max-concurrency 4 \
  --context-limit 8192 > "$out/smol-prepare.log" 2>&1; step smol-prepare $?
export SUITE_ARGS="--workloads tools agent decode"
bash bench/suite_gpu.sh smollm2-flare "$out/smol" "$flare" > "$out/smol-flare.log" 2>&1; step smol-flare $?
bash bench/suite_gpu.sh smollm2-floor "$out/smol" > "$out/smol-floor.log" 2>&1; step smol-floor $?
bash bench/suite_gpu.sh report "$out/smol" > "$out/smol-report.log" 2>&1; step smol-report $?
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1 \
  && touch $WORK/qwen3-8b/.complete; step 8b-weights $?
python3 -m ignition.cli prepare $WORK/qwen3-8b --out $WORK/qwen3-8b-core --max-concurrency 4 \
  --context-limit 8192 --compile-scope layer > "$out/8b-prepare.log" 2>&1; step 8b-prepare $?
export SUITE_ARGS="--workloads tools"
bash bench/suite_gpu.sh qwen3-8b-flare "$out/8b" "$flare" > "$out/8b-flare.log" 2>&1; step 8b-flare $?
bash bench/suite_gpu.sh qwen3-8b-floor "$out/8b" > "$out/8b-floor.log" 2>&1; step 8b-floor $?
bash bench/suite_gpu.sh report "$out/8b" > "$out/8b-report.log" 2>&1; step 8b-report $?
echo chain done
