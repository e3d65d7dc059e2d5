#!/usr/bin/env bash
# The split kernel's queries in registers: its GPU tests (bitwise the two launches'),
# then the 8B's step with the queries stored and read back (before7) and in registers.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
PYTHONPATH=$PWD:$PWD/tests:SITE timeout 200 python3 -m pytest -m gpu \
  tests/test_rope_decode_attention.py -q -p no:cacheprovider -rs > "$out/pytest-gpu.log" 2>&1
step rope-tests $?
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1
step 8b-weights $?
bash bench/issue23_check.sh trees "$out/8b-trees" .carry/before7 $WORK/qwen3-8b \
  --geometry qwen3-8b --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096 \
  > "$out/8b-trees.log" 2>&1; step 8b-trees $?
echo chain done
