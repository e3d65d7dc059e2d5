#!/usr/bin/env bash
# Widths of the served projections, the reader bench's pipeline budgets, SmolLM2's
# trees (bdb2574 against this tree: the fused rotary write and 16-column tiles), the
# SmolLM2 core's replay check on the defaults, then the 8B's trees.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
TLS="--geometry smollm2-135m --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
TL8="--geometry qwen3-8b --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
PYTHONPATH=$PWD:$PWD/tests:SITE timeout 300 python3 -m bench.rows_linear_bench --widths \
  --out "$out/widths.json" > "$out/widths.log" 2>&1; step widths $?
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $WORK/smollm2-135m > /dev/null 2>&1
step smol-weights $?
bash bench/issue23_check.sh trees "$out/smol-trees" .carry/before $WORK/smollm2-135m $TLS \
  > "$out/smol-trees.log" 2>&1; step smol-trees $?
bash bench/issue23_check.sh pdl-core "$out/smol-core" $WORK/smollm2-135m .carry/flare \
  > "$out/smol-core.log" 2>&1; step smol-core $?
PYTHONPATH=$PWD:$PWD/tests:SITE timeout 240 python3 -m bench.reader_after_producer_bench \
  --out "$out/reader.json" > "$out/reader.log" 2>&1; step reader $?
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1
step 8b-weights $?
bash bench/issue23_check.sh trees "$out/8b-trees" .carry/before $WORK/qwen3-8b $TL8 \
  > "$out/8b-trees.log" 2>&1; step 8b-trees $?
echo chain done
