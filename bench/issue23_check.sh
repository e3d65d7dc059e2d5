#!/usr/bin/env bash
# Issue 23's checks on the GPU machine, in parts that each fit one call. Results go
# to OUT.
#
#   bench/issue23_check.sh serving OUT
#       the in-process serving GPU tests (tests/test_serving.py: answers against the
#       Python harness, prefix hits, shutdown with snapshots in flight, and message
#       checkpoints captured after the one chunk holding them on a positional-KV
#       core, sampled by the resume graph) and the maintenance graphs' GPU tests
#       (tests/test_prefix_operations.py, the interior-endpoint capture included).
#   bench/issue23_check.sh concurrency OUT MODEL [kernel_timeline options...]
#       the prepared-concurrency options (OPTIONS, default "4 8 16 32"): MODEL
#       prepared once per option with --max-concurrency of it (compiled, captured),
#       each decode step timed at capacity 1 and at the option and attributed by
#       kernel (bench/kernel_timeline.py, OUT/option-N.json), then the options side by
#       side (bench/concurrency_report.py, OUT/options.md): capture time, scratch and
#       graph pool, KV pages, step, tokens per second. Pass --geometry (a
#       bench/suite/report.py name or config.json) for the roofline; the 8B's four
#       preparations outlast one call, so run it detached (bench/detached.sh).
#   bench/issue23_check.sh pdl OUT MODEL [kernel_timeline options...]
#       programmatic dependent launch of the decode projections: its GPU test (the
#       same bits as a plain launch, eager and captured, and programmatic edges in the
#       captured graph; tests/test_programmatic_launch.py), then MODEL's decode graphs
#       timed as prepared (programmatic, the default) and captured again with the other
#       launch, over the same storage, their steps in alternating blocks
#       (bench/kernel_timeline.py --compare-programmatic-launch; OUT/pdl.json and .md).
#       Pass --geometry for the roofline.
#   bench/issue23_check.sh sampler OUT
#       the sampler's thresholds by radix selection: their GPU tests (against the
#       sorted rows' at the served vocabularies, bitwise repeats;
#       tests/test_sampling_thresholds.py, tests/test_sampling.py,
#       tests/test_cumulative.py), then the compiled sampler captured with them and
#       with a sort's (bench/sampler_bench.py; OUT/sampler.json).
#   bench/issue23_check.sh fusion OUT MODEL [kernel_timeline options...]
#       the decode fusions' kernels on the GPU (tests/test_linear.py: the norm's
#       statistic from partial squares with the gain folded into the weight, the
#       residual epilogue's partial squares, bitwise at every batch and every tile;
#       tests/test_programmatic_launch.py), then MODEL's decode step under each fusion
#       of FUSIONS (default "norms residuals"), one timeline process each, in turn
#       (bench/kernel_timeline.py --decode-fusion F; OUT/F.json and .md), each with
#       the bandwidth probed in its run. Pass --geometry for the roofline.
#   bench/issue23_check.sh early OUT MODEL [kernel_timeline options...]
#       early weights (each decode projection loads its last K step's weight tile
#       before it waits for the kernel before): the GPU tests (the same bits as
#       without, eager and captured; tests/test_linear.py -k early_weights,
#       tests/test_programmatic_launch.py), then MODEL's decode graphs timed as
#       prepared (programmatic launch, late weights) and captured again with early
#       weights over the same storage, their steps in alternating blocks
#       (bench/kernel_timeline.py --compare-early-weights; OUT/early.json and .md).
#       Pass --geometry for the roofline.
#   bench/issue23_check.sh trees OUT BEFORE MODEL [kernel_timeline options...]
#       MODEL's decode step as the tree BEFORE prepares it (made where git is, e.g.
#       `git archive 5f4f455 ignition recipes bench tests | tar x -C BEFORE`) and as
#       this one does, one timeline process each, in turn (OUT/before.json and
#       OUT/after.json, .md beside them), each with the bandwidth probed in its run:
#       what a set of changes without a switch of its own gained. Pass --geometry, and
#       --decode-fusion where the trees' defaults differ (5f4f455's "residuals", this
#       tree's "auto", which is "norms" on one rank).
#       AFTER_OPTIONS: more kernel_timeline options for this tree's side alone (one
#       the tree before lacks, e.g. --compare-early-weights).
#   bench/issue23_check.sh rope OUT
#       decode attention finishing its rows' packed projection (the rotary write in the
#       split kernel): its GPU tests (the two launches' bits, output and cache;
#       tests/test_rope_decode_attention.py), the programmatic-launch test (its
#       programmatic edges, bitwise) and the compile-scope GPU test; then its split
#       kernel with four and eight warps (bench/decode_attention_bench.py,
#       OUT/decode-attention.json).
#   bench/issue23_check.sh prefill OUT MODEL [prefill_timeline options...]
#       the rotary and KV write of prefill chunks in blocks of tokens: its GPU tests
#       (blocks against one token a program, bitwise, at the 8B's heads; the canonical
#       modules; tests/test_kv_write.py) and decode attention's rotary write, which
#       shares its arithmetic (tests/test_rope_decode_attention.py), and the 4K chunk's
#       prefill attention against SDPA and its tile orders
#       (tests/test_attention.py), the residual additions summed into the residual
#       by cuBLAS (tests/test_accumulate_linear.py), a long chunk's attention in two
#       parts, cuDNN within the chunk and Triton over its history
#       (tests/test_prefill_two_parts.py); the write at every tile
#       (bench/rope_write_bench.py, OUT/rope-write.json); the two parts against the
#       one kernel (bench/prefill_two_parts_bench.py, OUT/two-parts.json); then MODEL's cold
#       prefill chunks by kernel (bench/prefill_timeline.py, OUT/timeline.json), and
#       again with the canonical decoder layer (--decode-fusion none: a GEMM, then
#       the residual addition; OUT/timeline-canonical.json). Pass --geometry and
#       --prompt-tokens for the timelines.
#   bench/issue23_check.sh widths OUT
#       each served projection of SmolLM2 and the 8B as the decode layer launches it,
#       at every tile width, 1 and 4 rows (bench/rows_linear_bench.py --widths;
#       OUT/widths.json), and a projection read right after one that fills the device
#       against after a one-program kernel, per tile width and pipeline budget
#       (bench/reader_after_producer_bench.py; OUT/reader.json).
#   bench/issue23_check.sh stages OUT
#       each served projection of SmolLM2 and the 8B at one row as the decode layer
#       launches it, over K steps and pipeline depths, each against the served launch's
#       time and bits, the fastest also at four rows (bench/rows_linear_bench.py
#       --stages; OUT/stages.json).
#   bench/issue23_check.sh boundaries OUT
#       what a phase boundary costs: a grid barrier in one persistent kernel against a
#       kernel boundary, plain and programmatic (bench/grid_barrier_bench.py, bounded
#       at two minutes).
#   bench/issue23_check.sh persistent OUT [MODEL [FLARE]]
#       SmolLM2's decode layer as one persistent kernel: its GPU tests (its grid
#       barriers give the phase-by-phase launches' bits, replayed from one graph;
#       tests/test_persistent_layer.py), then its 30 layers against the per-kernel
#       chain (bench/persistent_layer_bench.py, OUT/persistent.json), and with MODEL
#       (SmolLM2's geometry) its decode step prepared with --decode-fusion persistent
#       (bench/kernel_timeline.py, OUT/timeline.json), and with FLARE too a core so
#       prepared through `flare replay --check` (pdl-core, OUT/core); each bounded in
#       time (eight, eight and five minutes; the kernel compiles in many
#       specializations), since a barrier that never opens would hang.
#   bench/issue23_check.sh changes OUT BEFORE FLARE
#       a set of changes as a whole, on random weights of both geometries (written
#       under WORK), in this order: the part rope, a SmolLM2 core prepared with this
#       tree's defaults through `flare replay --check` (pdl-core, OUT/smol-core), the
#       part persistent (with SmolLM2's step), SmolLM2's decode step as BEFORE and this
#       tree prepare it (trees, OUT/smol-trees), the parts boundaries and widths, then
#       the 8B's trees (OUT/8b-trees); about 30 minutes, so run it detached
#       (bench/detached.sh).
#   bench/issue23_check.sh pdl-core OUT CHECKPOINT FLARE [prepare options...]
#       CHECKPOINT exported with the defaults, programmatic launch on (programmatic
#       edges in the core's graphs), then `flare replay --check` (Helios's rebuilt
#       graphs bitwise against the Python replay) and the native decode step at
#       capacities 1 and 4.
#
# Needs the flare_heliopause wheel importable (WHEELS, as bench/suite_gpu.sh installs
# them).
set -uo pipefail
usage="usage: bench/issue23_check.sh serving OUT | concurrency OUT MODEL [options...] | pdl OUT MODEL [options...] | early OUT MODEL [options...] | sampler OUT | fusion OUT MODEL [options...] | trees OUT BEFORE MODEL [options...] | rope OUT | prefill OUT MODEL [options...] | widths OUT | stages OUT | boundaries OUT | persistent OUT [MODEL [FLARE]] | changes OUT BEFORE FLARE | pdl-core OUT CHECKPOINT FLARE [options...]"
part=${1:?$usage}
out=${2:?$usage}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
caller=$PWD  # a relative tree argument (trees) is the caller's
incoming=${PYTHONPATH:-}  # the wheels' path, without either tree
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
status=0

case $part in
  serving)
    python3 -m pytest -m gpu tests/test_serving.py tests/test_prefix_operations.py -q \
      -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ;;
  concurrency)
    model=${1:?$usage}
    shift
    results=()
    for option in ${OPTIONS:-4 8 16 32}; do
      python3 bench/kernel_timeline.py "$model" --capacities 1 "$option" \
        --out "$out/option-$option.json" "$@" > "$out/option-$option.log" 2>&1 \
        && results+=("$out/option-$option.json") || { status=1; tail -5 "$out/option-$option.log"; }
    done
    [ ${#results[@]} -gt 0 ] && python3 bench/concurrency_report.py "${results[@]}" \
      --out "$out/options.md" || status=1
    ;;
  pdl)
    model=${1:?$usage}
    shift
    python3 -m pytest -m gpu tests/test_programmatic_launch.py -q -p no:cacheprovider -rs 2>&1 \
      | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 bench/kernel_timeline.py "$model" --capacities 1 4 --compare-programmatic-launch \
      --out "$out/pdl.json" "$@" > "$out/pdl.log" 2>&1 || { status=1; tail -20 "$out/pdl.log"; }
    grep "^c=" "$out/pdl.log"
    ;;
  early)
    model=${1:?$usage}
    shift
    python3 -m pytest -m gpu tests/test_linear.py tests/test_programmatic_launch.py -q \
      -k "early_weights or programmatic" -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 bench/kernel_timeline.py "$model" --capacities 1 4 --compare-early-weights \
      --out "$out/early.json" "$@" > "$out/early.log" 2>&1 || { status=1; tail -20 "$out/early.log"; }
    grep "^c=" "$out/early.log"
    ;;
  sampler)
    python3 -m pytest -m gpu tests/test_sampling_thresholds.py tests/test_sampling.py \
      tests/test_cumulative.py -q -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 bench/sampler_bench.py --out "$out/sampler.json" > "$out/sampler.log" 2>&1 \
      || { status=1; tail -20 "$out/sampler.log"; }
    cat "$out/sampler.log"
    ;;
  fusion)
    model=${1:?$usage}
    shift
    python3 -m pytest -m gpu tests/test_linear.py tests/test_programmatic_launch.py -q \
      -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    for fusion in ${FUSIONS:-norms residuals}; do
      python3 bench/kernel_timeline.py "$model" --capacities 1 4 --decode-fusion "$fusion" \
        --out "$out/$fusion.json" "$@" > "$out/$fusion.log" 2>&1 \
        || { status=1; tail -20 "$out/$fusion.log"; }
      grep "^c=" "$out/$fusion.log"
    done
    ;;
  trees)
    before=$(cd "$caller" && cd "${1:?$usage}" && pwd)
    model=${2:?$usage}
    shift 2
    for side in before after; do
      tree=$PWD
      [ "$side" = before ] && tree=$before
      extra=()
      [ "$side" = after ] && read -ra extra <<< "${AFTER_OPTIONS:-}"
      (cd "$tree" && PYTHONPATH=$tree:$tree/tests${incoming:+:$incoming} python3 \
        bench/kernel_timeline.py "$model" --capacities 1 4 --out "$out/$side.json" "$@" \
        "${extra[@]}") \
        > "$out/$side.log" 2>&1 || { status=1; tail -20 "$out/$side.log"; }
      echo "$side:"
      grep "^c=" "$out/$side.log"
    done
    ;;
  rope)
    python3 -m pytest -m gpu tests/test_rope_decode_attention.py tests/test_programmatic_launch.py \
      tests/test_compile_scope.py -q -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    python3 -m bench.decode_attention_bench --out "$out/decode-attention.json" \
      > "$out/decode-attention.log" 2>&1 || status=1
    cat "$out/decode-attention.log"
    ;;
  prefill)
    model=$(cd "$caller" && realpath "${1:?$usage}")
    shift
    timeout 300 python3 -m pytest -m gpu tests/test_kv_write.py tests/test_rope_decode_attention.py \
      "tests/test_attention.py::test_prefill_long_chunk_default_gpu" \
      tests/test_accumulate_linear.py tests/test_prefill_two_parts.py -q -p no:cacheprovider -rsP \
      2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout 180 python3 -m bench.rope_write_bench --out "$out/rope-write.json" \
      > "$out/rope-write.log" 2>&1 || status=1
    cat "$out/rope-write.log"
    timeout 300 python3 -m bench.prefill_two_parts_bench --out "$out/two-parts.json" \
      > "$out/two-parts.log" 2>&1 || status=1
    cat "$out/two-parts.log"
    timeout 300 python3 bench/prefill_timeline.py "$model" --out "$out/timeline.json" "$@" \
      > "$out/timeline.log" 2>&1 || { status=1; tail -20 "$out/timeline.log"; }
    timeout 300 python3 bench/prefill_timeline.py "$model" --out "$out/timeline-canonical.json" \
      "$@" --decode-fusion none > "$out/timeline-canonical.log" 2>&1 \
      || { status=1; tail -20 "$out/timeline-canonical.log"; }
    ;;
  widths)
    timeout 300 python3 -m bench.rows_linear_bench --widths --out "$out/widths.json" \
      > "$out/widths.log" 2>&1 || status=1
    cat "$out/widths.log"
    timeout 240 python3 -m bench.reader_after_producer_bench --out "$out/reader.json" \
      > "$out/reader.log" 2>&1 || status=1
    cat "$out/reader.log"
    ;;
  stages)
    timeout 420 python3 -m bench.rows_linear_bench --stages --out "$out/stages.json" \
      > "$out/stages.log" 2>&1 || status=1
    cat "$out/stages.log"
    ;;
  boundaries)
    timeout 120 python3 -m bench.grid_barrier_bench --out "$out/grid-barrier.json" \
      > "$out/grid-barrier.log" 2>&1 || status=1
    cat "$out/grid-barrier.log"
    ;;
  changes)
    before=$(cd "$caller" && cd "${1:?$usage}" && pwd)
    flare=$(cd "$caller" && realpath "${2:?$usage}")
    work=${WORK:-/tmp/flare-issue23}
    mkdir -p "$work"
    for geometry in smollm2-135m qwen3-8b; do
      [ -f "$work/$geometry/random-weights.json" ] || python3 -m ignition.loading.random_weights \
        --geometry "$geometry" --out "$work/$geometry" > /dev/null || exit 1
    done
    shapes="--prompt-tokens 128 --prefill-chunk-size 128 --context-limit 4096"
    self=bench/issue23_check.sh
    # Correctness of the default path first, then what decides the next step.
    bash "$self" rope "$out/rope" || status=1
    bash "$self" pdl-core "$out/smol-core" "$work/smollm2-135m" "$flare" || status=1
    bash "$self" persistent "$out/persistent" "$work/smollm2-135m" || status=1
    bash "$self" trees "$out/smol-trees" "$before" "$work/smollm2-135m" \
      --geometry smollm2-135m $shapes || status=1
    bash "$self" boundaries "$out/boundaries" || status=1
    bash "$self" widths "$out/widths" || status=1
    bash "$self" trees "$out/8b-trees" "$before" "$work/qwen3-8b" --geometry qwen3-8b $shapes \
      || status=1
    ;;
  persistent)
    timeout 480 python3 -m pytest -m gpu tests/test_persistent_layer.py -q -p no:cacheprovider \
      -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    timeout 480 python3 -m bench.persistent_layer_bench --out "$out/persistent.json" \
      > "$out/persistent.log" 2>&1 || status=1
    cat "$out/persistent.log"
    if [ $# -gt 0 ]; then
      model=$(cd "$caller" && realpath "$1")
      timeout 300 python3 bench/kernel_timeline.py "$model" --capacities 1 4 \
        --decode-fusion persistent --geometry smollm2-135m --prompt-tokens 128 \
        --prefill-chunk-size 128 --context-limit 4096 --out "$out/timeline.json" \
        > "$out/timeline.log" 2>&1 || { status=1; tail -20 "$out/timeline.log"; }
      grep "^c=" "$out/timeline.log"
      if [ $# -gt 1 ]; then
        bash bench/issue23_check.sh pdl-core "$out/core" "$model" "$(cd "$caller" && realpath "$2")" \
          --decode-fusion persistent || status=1
      fi
    fi
    ;;
  pdl-core)
    checkpoint=${1:?$usage}
    flare=${2:?$usage}
    shift 2
    core=${WORK:-/tmp/flare-issue23}/pdl-core
    rm -rf "$core"
    mkdir -p "$(dirname "$core")"
    python3 -m ignition.cli prepare "$checkpoint" --out "$core" "$@" \
      > "$out/prepare.log" 2>&1 || { tail -30 "$out/prepare.log"; exit 1; }
    python3 -c "import sys; from ignition.export import flare_core_pb2 as pb; \
from ignition.export.core_dir import MANIFEST; from pathlib import Path; \
core = pb.Core.FromString((Path(sys.argv[1]) / MANIFEST).read_bytes()); \
edges = [sum(1 for e in g.edges if e.type) for g in core.graphs]; \
print('programmatic edges per graph:', edges); sys.exit(0 if sum(edges) else 1)" \
      "$core" | tee "$out/edges.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; echo "pdl-core: no programmatic edge in the core"; }
    . bench/replay_check.sh
    replay_check "$flare" "$core" "$out" || status=1
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
exit $status
