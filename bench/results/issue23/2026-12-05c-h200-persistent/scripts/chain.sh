#!/usr/bin/env bash
# This session's GPU chain (short budget): the default path's GPU tests, then the
# persistent kernel's tests and bench, then the rest while the budget lasts.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE PATH=SITE/bin:$PATH WORK=WORK
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
bash bench/issue23_check.sh rope "$out/rope" > "$out/rope.log" 2>&1; step rope $?
bash bench/issue23_check.sh persistent "$out/persistent" > "$out/persistent.log" 2>&1; step persistent $?
mkdir -p $WORK
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $WORK/smollm2-135m > /dev/null 2>&1
step weights $?
bash bench/issue23_check.sh pdl-core "$out/smol-core" $WORK/smollm2-135m .carry/flare > "$out/smol-core.log" 2>&1; step smol-core $?
python3 bench/kernel_timeline.py $WORK/smollm2-135m --capacities 1 4 --decode-fusion persistent \
  --geometry smollm2-135m --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096 \
  --out "$out/persistent-timeline.json" > "$out/persistent-timeline.log" 2>&1; step persistent-timeline $?
echo chain done
