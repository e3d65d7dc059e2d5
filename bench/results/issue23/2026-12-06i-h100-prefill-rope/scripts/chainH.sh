#!/usr/bin/env bash
# Issue 23 (2026-12-06h), second chain: prefill's rotary and KV write in blocks of
# tokens (bitwise against one token a program, its bench at every tile), then the 8B's
# cold 4,096-token prefill chunk by kernel with it.
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
python3 -m ignition.loading.random_weights --geometry qwen3-8b --out $WORK/qwen3-8b > /dev/null 2>&1 \
  && touch $WORK/qwen3-8b/.complete; step 8b-weights $?
bash bench/issue23_check.sh prefill "$out/prefill" $WORK/qwen3-8b --prompt-tokens 4096 \
  --repeats 5 --geometry qwen3-8b --compile-scope layer > "$out/prefill.log" 2>&1; step prefill $?
echo chain done
