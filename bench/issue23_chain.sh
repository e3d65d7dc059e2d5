#!/usr/bin/env bash
# Issue 23's measurement chain on the GPU machine, run detached (bench/detached.sh),
# each PART in the order given, each step logged to steps.txt:
#
#   bash bench/detached.sh start DIR "bash bench/issue23_chain.sh PART..."
#
# - prefill:   the 8B geometry's random weights, then `issue23_check.sh prefill`
#              (GPU tests, the rotary write's bench, the cold 4,096-token chunk by
#              kernel with the fused layer and with the canonical one);
# - 8b:        the 8B's core (concurrency 4, 8,192 tokens, layer scope) and its cold
#              TTFT through flare at 512 and 4,096 tokens, with the decode bench and
#              the qualification replay (`suite_gpu.sh qwen3-8b-flare`), then its report;
# - smol:      the SmolLM2 stand-in's core, its tools (32 conversations), agent and
#              decode (10 rounds) workloads ($SMOL_SUITE_ARGS instead, if set) through
#              flare and the Python floor, then their report;
# - smol-before: the smol part's preparation and flare stage again (tools and decode
#              workloads, $BEFORE_SUITE_ARGS instead, if set; no floor) from a copy of
#              the tree with the files under $BEFORE_FILES laid over it (a folder
#              mirroring the tree: an earlier commit's versions of the files a change
#              touched), results under smol-before/: the change against the tree before
#              it, in one run on one card;
# - 8b-before: the 8b part's preparation and flare stage (no report) from the tree
#              before a change ($BEFORE_FILES, as smol-before), results under 8b-before/;
# - sampler:   `issue23_check.sh sampler` (the thresholds' GPU tests, the compiled
#              sampler with them and with a sort's, the thresholds alone per chunk);
# - sampler-before: `bench/sampler_bench.py` from the before tree ($BEFORE_FILES, as
#              smol-before), results under sampler-before/: the sampler before the
#              change, in the same run on the same card (the sort's times in both are
#              the same kernels: the drift between the two runs; the bench is this
#              tree's, with the sampler's own digit, which an earlier tree's takes);
# - serving:   `issue23_check.sh serving` (the serving GPU tests);
# - maintenance: the GPU tests of admission, snapshot and restore in their own launches
#              and of the compiled step I/O (bitwise against the eager code);
# - attention: `bench/prefill_attention_bench.py --long-only --no-tilings`;
# - timeline:  SmolLM2's stand-in's decode step by kernel and by gap at capacities 1
#              and 4 (`bench/kernel_timeline.py`, 50 profiled steps), results under
#              timeline/smol.json and .md;
# - concurrency, concurrency-8b: prepared concurrency as an option, for SmolLM2's
#              stand-in or the 8B: per N of $CONCURRENCY_OPTIONS (default 8 16 32), a
#              core prepared with --max-concurrency N and `flare replay --bench-decode
#              N`, then `bench/concurrency_options.py summarize` (capture time, memory
#              by region, the step at full capacity and tokens per second). Options run
#              in the order given; each records whether the compile caches were cold
#              or held an earlier option's kernels (cN/caches.txt).
#
# The flare binary: $FLARE, else .carry/flare.xz unpacked, else .carry/flare. The
# carried wheels: bench/chain_env.sh's. Before the first of 8b, smol and serving, a
# preflight step: flare_heliopause and openai import and the binary runs, or the chain
# ends there.
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
flare=${FLARE:-}
if [ -z "$flare" ] && [ -e .carry/flare.xz ]; then
  mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
  flare=BIN/flare
fi
flare=${flare:-.carry/flare}
qwen=$WORK/qwen3-8b
# Before the first part that serves (8b, smol, serving): the carried wheels import and
# the binary runs, or the chain stops here rather than failing each step minutes later.
preflight() {
  [ -n "${preflight_done:-}" ] && return 0
  python3 -c "import flare_heliopause, openai" > "$out/preflight.log" 2>&1 \
    && "$flare" --help >> "$out/preflight.log" 2>&1
  local rc=$?
  step preflight $rc
  [ $rc -eq 0 ] || { echo "issue23_chain.sh: preflight failed (preflight.log)" >&2; exit 1; }
  preflight_done=1
}
weights() {
  [ -e "$qwen/.complete" ] && return 0
  python3 -m ignition.loading.random_weights --geometry qwen3-8b --out "$qwen" > /dev/null 2>&1 \
    && touch "$qwen/.complete"
  step 8b-weights $?
}
# The tree before a change, once: a copy of this one with the files under
# $BEFORE_FILES laid over it (their list under DIR), at $before.
before_tree() {
  local dir=$out/$1
  mkdir -p "$dir"
  [ -d "${BEFORE_FILES:-}" ] || { echo "issue23_chain.sh: $1 needs BEFORE_FILES" >&2; step "$1-tree" 2; return 1; }
  local files
  files=$(realpath "$BEFORE_FILES")
  before=$WORK/before-src
  (cd "$files" && find . -type f) > "$dir/files.txt"
  [ -n "${before_done:-}" ] && return 0
  rm -rf "$before" && mkdir -p "$before" \
    && tar --exclude=./BIN -cf - . | tar -xf - -C "$before" && cp -r "$files/." "$before/"
  local rc=$?
  step before-tree $rc
  [ $rc -eq 0 ] && before_done=1
}
for part in "$@"; do
  case $part in
    prefill)
      weights
      bash bench/issue23_check.sh prefill "$out/prefill" "$qwen" --prompt-tokens 4096 \
        --repeats 5 --geometry qwen3-8b --compile-scope layer > "$out/prefill.log" 2>&1
      step prefill $?
      ;;
    8b)
      preflight
      weights
      python3 -m ignition.cli prepare "$qwen" --out "$WORK/qwen3-8b-core" --max-concurrency 4 \
        --context-limit 8192 --compile-scope layer > "$out/8b-prepare.log" 2>&1
      step 8b-prepare $?
      SUITE_ARGS="--workloads long --lengths 512 4096" \
        bash bench/suite_gpu.sh qwen3-8b-flare "$out/8b" "$flare" > "$out/8b-flare.log" 2>&1
      step 8b-flare $?
      bash bench/suite_gpu.sh report "$out/8b" > "$out/8b-report.log" 2>&1
      step 8b-report $?
      ;;
    smol)
      preflight
      python3 bench/smollm2_stand_in.py "$WORK/smolrw" > /dev/null
      step smol-stand-in $?
      bash bench/suite_gpu.sh smollm2-prepare "$out/smol" "$WORK/smolrw" \
        > "$out/smol-prepare.log" 2>&1
      step smol-prepare $?
      export SUITE_ARGS=${SMOL_SUITE_ARGS:-"--workloads tools agent decode --decode-rounds 10 --tool-conversations 32"}
      bash bench/suite_gpu.sh smollm2-flare "$out/smol" "$flare" > "$out/smol-flare.log" 2>&1
      step smol-flare $?
      bash bench/suite_gpu.sh smollm2-floor "$out/smol" > "$out/smol-floor.log" 2>&1
      step smol-floor $?
      unset SUITE_ARGS
      bash bench/suite_gpu.sh report "$out/smol" > "$out/smol-report.log" 2>&1
      step smol-report $?
      ;;
    8b-before)
      preflight
      before_tree 8b-before || continue
      weights
      binary=$(realpath "$flare")
      ( cd "$before" || exit 1
        export PYTHONPATH=$SITE:$before:$before/tests WORK=$WORK/before
        # suite_gpu.sh finds the weights and the core under WORK.
        mkdir -p "$WORK" && ln -sfn "$qwen" "$WORK/qwen3-8b"
        python3 -m ignition.cli prepare "$qwen" --out "$WORK/qwen3-8b-core" --max-concurrency 4 \
          --context-limit 8192 --compile-scope layer > "$out/8b-before-prepare.log" 2>&1 || exit 1
        SUITE_ARGS="--workloads long --lengths 512 4096" \
          bash bench/suite_gpu.sh qwen3-8b-flare "$out/8b-before" "$binary" \
          > "$out/8b-before-flare.log" 2>&1 )
      step 8b-before $?
      ;;
    smol-before)
      preflight
      before_tree smol-before || continue
      [ -e "$WORK/smolrw/config.json" ] || python3 bench/smollm2_stand_in.py "$WORK/smolrw" > /dev/null
      # Absolute before the subshell's cd: once, a relative binary path failed there.
      checkpoint=$WORK/smolrw binary=$(realpath "$flare")
      ( cd "$before" || exit 1
        export PYTHONPATH=$SITE:$before:$before/tests WORK=$WORK/before
        bash bench/suite_gpu.sh smollm2-prepare "$out/smol-before" "$checkpoint" \
          > "$out/smol-before-prepare.log" 2>&1 || exit 1
        SUITE_ARGS=${BEFORE_SUITE_ARGS:-"--workloads tools decode --decode-rounds 10 --tool-conversations 32"} \
          bash bench/suite_gpu.sh smollm2-flare "$out/smol-before" "$binary" \
          > "$out/smol-before-flare.log" 2>&1 )
      step smol-before $?
      ;;
    sampler)
      bash bench/issue23_check.sh sampler "$out/sampler" > "$out/sampler.log" 2>&1
      step sampler $?
      ;;
    sampler-before)
      before_tree sampler-before || continue
      ( cd "$before" && PYTHONPATH=$SITE:$before:$before/tests \
          python3 bench/sampler_bench.py --out "$out/sampler-before/sampler.json" ) \
        > "$out/sampler-before.log" 2>&1
      step sampler-before $?
      ;;
    serving)
      preflight
      bash bench/issue23_check.sh serving "$out/serving" > "$out/serving.log" 2>&1
      step serving $?
      ;;
    maintenance)
      # Admission, snapshot and restore in their launches, and the compiled step I/O,
      # against the eager code.
      python3 -m pytest -m gpu tests/test_triton_admission.py tests/test_triton_state_transfer.py \
        tests/test_step_io.py \
        -q -p no:cacheprovider -rs > "$out/maintenance-gpu.log" 2>&1
      step maintenance-gpu $?
      ;;
    concurrency|concurrency-8b)
      preflight
      if [ "$part" = concurrency ]; then
        [ -e "$WORK/smolrw/config.json" ] || python3 bench/smollm2_stand_in.py "$WORK/smolrw" > /dev/null
        checkpoint=$WORK/smolrw model=smollm2-135m scope=()
      else
        weights
        # As the 8B's served core is prepared (the 8b part).
        checkpoint=$qwen model=qwen3-8b scope=(--compile-scope layer)
      fi
      # Compile caches of this part's own: its first option compiles from scratch even
      # after other parts ran on the machine.
      export TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor-$part TRITON_CACHE_DIR=/tmp/flare-triton-$part
      for n in ${CONCURRENCY_OPTIONS:-8 16 32}; do
        dir=$out/$part/c$n
        mkdir -p "$dir"
        rm -rf "$WORK/core-c$n"
        # Whether this option compiled from scratch or found an earlier option's
        # kernels in the compile caches (options run in the order given).
        caches=cold
        [ -n "$(ls -A "$TORCHINDUCTOR_CACHE_DIR" 2>/dev/null)" ] && caches=warm
        echo "$caches" > "$dir/caches.txt"
        python3 -m ignition.cli prepare "$checkpoint" --out "$WORK/core-c$n" --max-concurrency "$n" \
          --context-limit 8192 "${scope[@]}" > "$dir/prepare.log" 2>&1
        step "$part-c$n-prepare" $?
        "$flare" replay "$WORK/core-c$n" --bench-decode "$n" --steps 256 \
          --json "$dir/replay.json" > "$dir/replay.log" 2>&1
        step "$part-c$n-bench" $?
        rm -rf "$WORK/core-c$n"
      done
      python3 bench/concurrency_options.py summarize "$out/$part" --model "$model" \
        > "$out/$part/summary.md" 2>&1
      step "$part-summary" $?
      ;;
    timeline)
      [ -e "$WORK/smolrw/config.json" ] || python3 bench/smollm2_stand_in.py "$WORK/smolrw" > /dev/null
      mkdir -p "$out/timeline"
      python3 bench/kernel_timeline.py "$WORK/smolrw" --capacities 1 4 --geometry smollm2-135m \
        --prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096 \
        --out "$out/timeline/smol.json" > "$out/timeline.log" 2>&1
      step timeline $?
      ;;
    attention)
      python3 bench/prefill_attention_bench.py --long-only --no-tilings \
        --out "$out/attention-long.json" > "$out/attention-long.log" 2>&1
      step attention-long $?
      ;;
    *)
      echo "issue23_chain.sh: unknown part $part (prefill, 8b, 8b-before, smol, smol-before, sampler," \
        "sampler-before, serving, attention, timeline, concurrency, concurrency-8b, maintenance)" >&2
      step "$part" 2
      ;;
  esac
done
echo chain done
