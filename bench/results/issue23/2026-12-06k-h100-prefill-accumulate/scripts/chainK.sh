#!/usr/bin/env bash
# Issue 23 (2026-12-06 tenth session, last run, 272 s of device time left): prefill
# with the folded scale as the only arithmetic and the residual additions summed into
# the residual by cuBLAS: their GPU tests, then the 8B's cold 4,096-token chunk by
# kernel with the fused layer and with the canonical one (a GEMM, then the addition).
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1 \
  && touch $WORK/qwen3-8b/.complete; step 8b-weights $?
timeout 100 python3 -m pytest -m gpu tests/test_accumulate_linear.py \
  "tests/test_attention.py::test_prefill_long_chunk_default_gpu" -q -p no:cacheprovider -rs \
  > "$out/pytest-gpu.log" 2>&1; step gpu-tests $?
for variant in fused canonical; do
  extra=(); [ $variant = canonical ] && extra=(--decode-fusion none)
  timeout 200 python3 bench/prefill_timeline.py $WORK/qwen3-8b --out "$out/timeline-$variant.json" \
    --prompt-tokens 4096 --repeats 5 --geometry qwen3-8b --compile-scope layer "${extra[@]}" \
    > "$out/timeline-$variant.log" 2>&1; step timeline-$variant $?
done
echo chain done
