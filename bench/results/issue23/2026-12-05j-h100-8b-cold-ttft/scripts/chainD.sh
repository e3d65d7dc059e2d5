#!/usr/bin/env bash
# Issue 23 (2026-12-05j): the Qwen3-8B geometry's cold TTFT at 512 and 4,096 prompt
# tokens through flare (random weights, this tree's defaults, context 8,192).
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE:$PWD PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1
step 8b-weights $?
python3 -m ignition.cli prepare $WORK/qwen3-8b --out $WORK/qwen3-8b-core --max-concurrency 4 \
  --context-limit 8192 --compile-scope layer > "$out/8b-prepare.log" 2>&1; step 8b-prepare $?
python3 -m bench.suite --url http://127.0.0.1:18080/v1 \
  --launch "$PWD/.carry/flare run $WORK/qwen3-8b-core --port 18080" --engine flare \
  --out "$out/flare.json" --tokenizer $WORK/qwen3-8b --geometry qwen3-8b --workloads long \
  --lengths 512 4096 --measure-bandwidth > "$out/flare.log" 2>&1; step flare-long $?
python3 -m bench.suite.report "$out/flare.json" --out-dir "$out/report" > "$out/report.log" 2>&1
step report $?
echo chain done
