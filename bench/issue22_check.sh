#!/usr/bin/env bash
# Issue 22's check on the GPU machine (the hybrid qwen4_exp recipe), in parts that
# each fit one call. Results go to OUT.
#
#   bench/issue22_check.sh tests OUT
#       the hybrid's GPU tests: fla's GDN kernels, the QSA Triton kernels and the
#       grouped experts captured (and compiled) against Transformers in bf16, split,
#       snapshot and restore through graphs (tests/test_qwen4_exp.py), the QSA
#       kernels against their references at serving shapes (tests/test_selector_kernels.py)
#       and the decode experts' kernels against theirs (tests/test_routed_experts.py);
#       then those kernels timed against grouped_mm at the H200 expert geometry, each
#       block choice (bench/experts_bench.py).
#   bench/issue22_check.sh experts OUT
#       the experts benchmark alone (the last step of `tests`).
#   bench/issue22_check.sh tiny OUT FLARE
#       the tiny hybrid checkpoint exported as a runtime core and `flare replay --check`
#       (Rust replay bitwise against the Python replay of the same graphs).
#   bench/issue22_check.sh h200 OUT FLARE [prepare options...]
#       the GEOMETRY (default qwen4-exp-h200-e64: Qwen3.8 Flash's per-token work with
#       64 experts, random weights generated on load; the 128-expert core's 75 GB
#       outgrow the GPU machine's disk) exported with --max-concurrency 4, compiled
#       layer by layer, then `flare replay --check` and the native decode step at
#       capacities 1 and 4.
#   bench/issue22_check.sh corpus OUT FLARE [prepare options...]
#       bench/serve_check.sh's corpus part on the GEOMETRY (SERVE_PARTS=corpus): the core
#       exported with a 24,576-token context (the longest agent prompt, 20K tokens of
#       this character-level tokenizer, and its answer) and, in the same process over
#       the exported graphs, the Python harness's answers to the 50 agent prompts;
#       `flare run` serving them at concurrency 1, 2 and 4 against those answers,
#       cancellation and drain. Sized for one call at 128 experts with --no-compile
#       (the last run's phases add up to about 8 minutes; a compiled export's Inductor
#       work adds about 2.5 more).
#   bench/issue22_check.sh trace OUT FLARE [prepare options...]
#       the GEOMETRY's core exported with a 40,960-token context, then served: the
#       suite's 32K tool-append agent trace with its fork (cached plus prefilled tokens
#       and TTFT per turn, the fork's restore, and two repeats of earlier turns that
#       must answer as the first time: restores are bitwise) and tools workload; then,
#       while the call's time lasts (TRACE_BUDGET_S, default 540 s from the start), the whole-
#       prompt restores of bench/serve_check.sh (SERVE_PARTS=prefix) and the native
#       decode step at capacities 1 and 4 with each checkpoint's snapshot and restore.
#   bench/issue22_check.sh reexport OUT BEFORE AFTER [prepare options...]
#       the recipe interface left the llama recipe's cores unchanged: random weights of
#       SmolLM2-135M's geometry written as an ordinary safetensors checkpoint (no GGUF
#       to carry), exported by the trees BEFORE and AFTER the interface (made where git
#       is: `git archive 2aa5a51 ignition recipes | tar x -C BEFORE` and
#       `git archive 9c28a6b ignition recipes | tar x -C AFTER`), BEFORE's first
#       export only warming the compile cache, AFTER's twice (the control), through
#       bench/reexport_check.sh. Compiled on a fresh machine the four exports take
#       about 200 s (cold) and 80 s each (warm); --no-compile, about a minute each.
#   bench/issue22_check.sh transformers OUT
#       Transformers' own generate on the GEOMETRY's weights at batches 1 and 4
#       (bench/transformers_decode.py): the baseline for the decode step; run it in the
#       same call as `timeline`.
#   bench/issue22_check.sh timeline OUT [kernel_timeline options...]
#       the same geometry prepared in this process (no core: its 75 GB of weights
#       outgrow the disk), its decode graphs at capacities 1 and 4 timed against the
#       roofline (bench/suite/sparse_geometry.py, bandwidth probed in the same run)
#       and their kernels attributed (bench/kernel_timeline.py).
#
# Needs fla-core 0.6.0 and einops importable, and the flare_heliopause wheel (WHEELS,
# as bench/suite_gpu.sh installs them).
set -uo pipefail
usage="usage: bench/issue22_check.sh tests OUT | experts OUT | tiny OUT FLARE | reexport OUT BEFORE AFTER [options] | h200 OUT FLARE [options] | corpus OUT FLARE [options] | trace OUT FLARE [options] | transformers OUT | timeline OUT [options]"
part=${1:?$usage}
out=${2:?$usage}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
caller=$PWD  # relative tree arguments (reexport) are the caller's
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
work=${WORK:-/tmp/flare-issue22}
mkdir -p "$work"
status=0

export_and_check() {  # CHECKPOINT CORE FLARE [prepare options...]
  local checkpoint=$1 core=$2 flare=$3
  shift 3
  rm -rf "$core"
  python3 -m ignition.cli prepare "$checkpoint" --out "$core" "$@" \
    > "$out/prepare-$(basename "$core").log" 2>&1 \
    || { tail -30 "$out/prepare-$(basename "$core").log"; return 1; }
  "$flare" replay "$core" --check --json "$out/replay-check-$(basename "$core").json" \
    > "$out/replay-check-$(basename "$core").log" 2>&1 || status=1
  tail -3 "$out/replay-check-$(basename "$core").log"
}

experts_bench() {
  python3 bench/experts_bench.py --tokens 1 4 --out "$out/experts-bench.json" 2>&1 \
    | tee "$out/experts-bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ]
}

case $part in
  tests)
    python3 -m pytest -m gpu tests/test_qwen4_exp.py tests/test_selector_kernels.py \
      tests/test_routed_experts.py -q \
      -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    experts_bench || status=1
    ;;
  experts)
    experts_bench || status=1
    ;;
  tiny)
    flare=${1:?$usage}
    python3 -c "import sys; from pathlib import Path; from checkpoints import write_tiny_hybrid; \
write_tiny_hybrid(Path(sys.argv[1]))" "$work/tiny-hybrid" || exit 1
    export_and_check "$work/tiny-hybrid" "$work/tiny-hybrid-core" "$flare" \
      --max-concurrency 2 --context-limit 1024 --prefill-chunk-size 128 || status=1
    ;;
  h200)
    flare=${1:?$usage}
    shift
    geometry=${GEOMETRY:-qwen4-exp-h200-e64}
    python3 -m ignition.loading.random_weights --geometry "$geometry" \
      --out "$work/$geometry" > /dev/null || exit 1
    export_and_check "$work/$geometry" "$work/$geometry-core" "$flare" \
      --max-concurrency 4 --context-limit 32768 --compile-scope layer "$@" || status=1
    for capacity in 1 4; do
      "$flare" replay "$work/$geometry-core" --bench-decode $capacity \
        --json "$out/bench-decode-c$capacity.json" > "$out/bench-decode-c$capacity.log" 2>&1 \
        || status=1
    done
    ;;
  corpus | trace)
    flare=${1:?$usage}
    shift
    geometry=${GEOMETRY:-qwen4-exp-h200-e64}
    dir=$work/$geometry
    # The marker file is written last: a directory without it is incomplete.
    [ -f "$dir/random-weights.json" ] || python3 -m ignition.loading.random_weights \
      --geometry "$geometry" --out "$dir" > /dev/null || exit 1
    if [ "$part" = corpus ]; then
      # The core goes beside the weights in WORK: the default, a temporary folder on
      # the GPU machine's 64 GiB disk, cannot hold the 128-expert core's 75 GB.
      rm -rf "$work/$geometry-corpus-core"
      SERVE_PARTS=corpus SERVE_CORE=$work/$geometry-corpus-core \
        bash bench/serve_check.sh "$out" "$dir" "$flare" -- \
        --max-concurrency 4 --context-limit 24576 --prefill-chunk-size 512 \
        --snapshot-rows 4 "$@" || status=1
      exit $status
    fi
    core=$work/$geometry-trace-core
    rm -rf "$core"
    python3 -m ignition.cli prepare "$dir" --out "$core" --max-concurrency 4 \
      --context-limit 40960 --prefill-chunk-size 512 "$@" > "$out/export.log" 2>&1 \
      || { tail -20 "$out/export.log"; exit 1; }
    # The suite sizes the trace by its messages' words; the geometry's character-level
    # tokenizer and the template make 28,672 of them about 39K prompt tokens, within
    # the 40,960-token context (32,768 ran past it at turn 89).
    python3 -m bench.suite --url http://127.0.0.1:18080/v1 \
      --launch "$flare run $core --port 18080" --engine flare --workloads agent tools \
      --agent-tokens 28672 --tokenizer "$dir" --geometry "$dir/config.json" \
      --measure-bandwidth --out "$out/suite-flare.json" 2>&1 | tee "$out/suite-flare.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    budget=${TRACE_BUDGET_S:-540}
    # Each part below loads the core again (about 40 s at 128 experts).
    if [ $SECONDS -lt $((budget - 200)) ]; then
      SERVE_PARTS=prefix SERVE_CORE=$core \
        timeout $((budget - SECONDS)) bash bench/serve_check.sh "$out" "$dir" "$flare" \
        || status=1
    else
      echo "trace: no time left for the whole-prompt restores" | tee -a "$out/skipped.txt"
    fi
    for capacity in 1 4; do
      if [ $SECONDS -lt $((budget - 80)) ]; then
        timeout $((budget - SECONDS)) "$flare" replay "$core" --bench-decode $capacity \
          --steps 256 --json "$out/bench-decode-c$capacity.json" \
          > "$out/bench-decode-c$capacity.log" 2>&1 || status=1
      else
        echo "trace: no time left for the decode step at $capacity" | tee -a "$out/skipped.txt"
      fi
    done
    ;;
  reexport)
    before=$(cd "$caller" && cd "${1:?$usage}" && pwd) || exit 2
    after=$(cd "$caller" && cd "${2:?$usage}" && pwd) || exit 2
    shift 2
    dir=$work/smollm2-135m-safetensors
    [ -f "$dir/model.safetensors.index.json" ] || python3 -m ignition.loading.random_weights \
      --geometry smollm2-135m --out "$dir" --safetensors > /dev/null || exit 1
    WORK=$work/reexport bash bench/reexport_check.sh "$out" "$dir" "$before" "$after" -- "$@" \
      || status=1
    ;;
  transformers)
    geometry=${GEOMETRY:-qwen4-exp-h200-e64}
    dir=$work/$geometry
    [ -f "$dir/random-weights.json" ] || python3 -m ignition.loading.random_weights \
      --geometry "$geometry" --out "$dir" > /dev/null || exit 1
    python3 bench/transformers_decode.py "$dir" --batches 1 4 --new-tokens 16 --repeats 3 \
      --out "$out/transformers-decode.json" > "$out/transformers-decode.log" 2>&1 || status=1
    tail -3 "$out/transformers-decode.log"
    ;;
  timeline)
    python3 -m ignition.loading.random_weights --geometry qwen4-exp-h200 \
      --out "$work/qwen4-exp-h200" > /dev/null || exit 1
    python3 bench/kernel_timeline.py "$work/qwen4-exp-h200" --capacities 1 4 \
      --prompt-tokens 512 --prefill-chunk-size 512 --context-limit 4096 \
      --geometry "$work/qwen4-exp-h200/config.json" --trace-dir "$work/traces" \
      --out "$out/timeline.json" "$@" 2>&1 | tee "$out/timeline.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
exit $status
