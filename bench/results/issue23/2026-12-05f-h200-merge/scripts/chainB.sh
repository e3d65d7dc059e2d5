#!/usr/bin/env bash
# H200: the merge in the split kernel's GPU tests; the 8B's and SmolLM2's decode steps
# as 1640e6e prepares them (head) and as this tree does (new: 64-column qkv where its
# waves fill as well, "auto" = norms, the merge in the split kernel); the SmolLM2 core
# through flare replay --check; then the 8B as this tree without the merge (mid).
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
root=$PWD
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
timeline() {  # NAME TREE MODEL options...
  local name=$1 tree=$2 model=$3; shift 3
  (cd "$tree" && PYTHONPATH=$tree:$tree/tests:SITE python3 bench/kernel_timeline.py \
    "$model" --capacities 1 4 --out "$out/$name.json" "$@") > "$out/$name.log" 2>&1
  step "$name" $?
  grep "^c=" "$out/$name.log" | tee -a "$out/steps.txt"
}
TLS="--geometry smollm2-135m --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
TL8="--geometry qwen3-8b --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
PYTHONPATH=$root:$root/tests:SITE timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
  tests/test_decode_merge.py tests/test_rope_decode_attention.py tests/test_programmatic_launch.py \
  > "$out/pytest-gpu.log" 2>&1; step gpu-tests $?
tail -3 "$out/pytest-gpu.log" | tee -a "$out/steps.txt"
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1
step 8b-weights $?
timeline 8b-head "$root/.carry/head" $WORK/qwen3-8b $TL8
timeline 8b-new "$root" $WORK/qwen3-8b $TL8
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $WORK/smollm2-135m > /dev/null 2>&1
step smol-weights $?
timeline smol-head "$root/.carry/head" $WORK/smollm2-135m $TLS
timeline smol-new "$root" $WORK/smollm2-135m $TLS
bash bench/issue23_check.sh pdl-core "$out/smol-core" $WORK/smollm2-135m .carry/flare \
  > "$out/smol-core.log" 2>&1; step smol-core $?
grep -iE "bitwise|steps|native|alloc" "$out/smol-core.log" | tail -8 | tee -a "$out/steps.txt"
timeline 8b-mid "$root/.carry/mid" $WORK/qwen3-8b $TL8
echo chain done
