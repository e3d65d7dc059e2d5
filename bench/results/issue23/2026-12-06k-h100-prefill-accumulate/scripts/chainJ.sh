#!/usr/bin/env bash
# Issue 23 (2026-12-06 tenth session, second run), on whatever card comes, this tree's
# flare binary (aaacdbe's Rust): prefill with the folded scale as the only arithmetic
# and the residual additions summed into the residual by cuBLAS: the prefill part (GPU
# tests, the rotary write's bench, the 8B's cold 4,096-token chunk by kernel, and the
# canonical layer's for the A/B); the 8B's cold TTFT at 512 and 4,096 tokens through
# flare; prefill attention's long chunks against SDPA.
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
flare=BIN/flare
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1 \
  && touch $WORK/qwen3-8b/.complete; step 8b-weights $?
bash bench/issue23_check.sh prefill "$out/prefill" $WORK/qwen3-8b --prompt-tokens 4096 \
  --repeats 5 --geometry qwen3-8b --compile-scope layer > "$out/prefill.log" 2>&1; step prefill $?
python3 -m ignition.cli prepare $WORK/qwen3-8b --out $WORK/qwen3-8b-core --max-concurrency 4 \
  --context-limit 8192 --compile-scope layer > "$out/8b-prepare.log" 2>&1; step 8b-prepare $?
export SUITE_ARGS="--workloads long --lengths 512 4096"
bash bench/suite_gpu.sh qwen3-8b-flare "$out/8b" "$flare" > "$out/8b-flare.log" 2>&1; step 8b-flare $?
bash bench/suite_gpu.sh report "$out/8b" > "$out/8b-report.log" 2>&1; step 8b-report $?
python3 bench/prefill_attention_bench.py --long-only --no-tilings --out "$out/attention-long.json" > "$out/attention-long.log" 2>&1; step attention-long $?
echo chain done
