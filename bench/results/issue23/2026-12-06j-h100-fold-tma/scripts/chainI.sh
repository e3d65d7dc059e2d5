#!/usr/bin/env bash
# Issue 23 (2026-12-06 tenth session), on whatever card comes, this tree's flare binary
# (aaacdbe's Rust): prefill attention's long chunks with the folded scale and with
# tensor-memory copies against the default (bits compared); the prefill part (GPU tests,
# the rotary write's bench, the 8B's cold 4,096-token chunk by kernel); the 8B's cold
# TTFT at 512 and 4,096 tokens through flare; SmolLM2's tools, agent and decode
# workloads, flare and the floor; the serving GPU tests.
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
flare=BIN/flare
python3 bench/prefill_attention_bench.py --long-only --no-tilings --out "$out/attention-long.json" > "$out/attention-long.log" 2>&1; step attention-long $?
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1 \
  && touch $WORK/qwen3-8b/.complete; step 8b-weights $?
bash bench/issue23_check.sh prefill "$out/prefill" $WORK/qwen3-8b --prompt-tokens 4096 \
  --repeats 5 --geometry qwen3-8b --compile-scope layer > "$out/prefill.log" 2>&1; step prefill $?
python3 -m ignition.cli prepare $WORK/qwen3-8b --out $WORK/qwen3-8b-core --max-concurrency 4 \
  --context-limit 8192 --compile-scope layer > "$out/8b-prepare.log" 2>&1; step 8b-prepare $?
export SUITE_ARGS="--workloads long --lengths 512 4096"
bash bench/suite_gpu.sh qwen3-8b-flare "$out/8b" "$flare" > "$out/8b-flare.log" 2>&1; step 8b-flare $?
bash bench/suite_gpu.sh report "$out/8b" > "$out/8b-report.log" 2>&1; step 8b-report $?
python3 bench/smollm2_stand_in.py $WORK/smolrw > /dev/null; step smol-stand-in $?
bash bench/suite_gpu.sh smollm2-prepare "$out/smol" $WORK/smolrw > "$out/smol-prepare.log" 2>&1; step smol-prepare $?
export SUITE_ARGS="--workloads tools agent decode --decode-rounds 10"
bash bench/suite_gpu.sh smollm2-flare "$out/smol" "$flare" > "$out/smol-flare.log" 2>&1; step smol-flare $?
bash bench/suite_gpu.sh smollm2-floor "$out/smol" > "$out/smol-floor.log" 2>&1; step smol-floor $?
bash bench/suite_gpu.sh report "$out/smol" > "$out/smol-report.log" 2>&1; step smol-report $?
bash bench/issue23_check.sh serving "$out/serving" > "$out/serving.log" 2>&1; step serving $?
echo chain done
