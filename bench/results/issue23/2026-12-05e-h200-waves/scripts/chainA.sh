#!/usr/bin/env bash
# H200: widths and the reader bench; the 8B's step as this tree prepares it, with its qkv
# at 64 columns (vq64), with that and the norms fusion, and the norms fusion alone;
# SmolLM2's step as this tree prepares it and with its gate/up at 64 columns (vgu64).
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
bash bench/issue23_check.sh widths "$out/widths" > "$out/widths.log" 2>&1; step widths $?
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1
step 8b-weights $?
timeline 8b-head "$root" $WORK/qwen3-8b $TL8
timeline 8b-vq64 "$root/.carry/vq64" $WORK/qwen3-8b $TL8
timeline 8b-vq64-norms "$root/.carry/vq64" $WORK/qwen3-8b $TL8 --decode-fusion norms
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $WORK/smollm2-135m > /dev/null 2>&1
step smol-weights $?
timeline smol-head "$root" $WORK/smollm2-135m $TLS
timeline smol-vgu64 "$root/.carry/vgu64" $WORK/smollm2-135m $TLS
timeline 8b-norms "$root" $WORK/qwen3-8b $TL8 --decode-fusion norms
echo chain done
