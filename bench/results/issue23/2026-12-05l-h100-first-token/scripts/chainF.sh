#!/usr/bin/env bash
# Issue 23 (2026-12-05l): the first token sampled before its prompt's captures and
# handed out before they complete (edb4ef1). The serving GPU tests (message checkpoints
# inside a chunk answer as the harness), then SmolLM2 (decode with 10 rounds a stream,
# tools, the agent trace; flare before the change too) and the Qwen3-8B geometry (tools), flare and the floor each.
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
mkdir -p BIN && for f in flare flare-old; do python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/$f.xz BIN/$f && chmod +x BIN/$f; done
flare=BIN/flare
bash bench/issue23_check.sh serving "$out/serving" > "$out/serving.log" 2>&1; step serving $?
bash bench/suite_gpu.sh smollm2-prepare "$out/smol" .carry/smolrw > "$out/smol-prepare.log" 2>&1; step smol-prepare $?
export SUITE_ARGS="--workloads tools agent decode --decode-rounds 10"
bash bench/suite_gpu.sh smollm2-flare "$out/smol" "$flare" > "$out/smol-flare.log" 2>&1; step smol-flare $?
# The baseline in the same run: flare built at 4c25c4f (before edb4ef1).
bash bench/suite_gpu.sh smollm2-flare "$out/smol-before" BIN/flare-old > "$out/smol-before.log" 2>&1; step smol-before $?
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
