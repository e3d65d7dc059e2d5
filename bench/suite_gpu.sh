#!/usr/bin/env bash
# The benchmark suite on the GPU machine, one stage per call (each fits 10 minutes;
# stages of one model share WORK, so later stages must follow while the machine is
# still up). Every stage writes its raw results and logs under OUT.
#
#   bench/suite_gpu.sh smollm2-prepare   OUT GGUF|DIR GGUF -> bf16 checkpoint, Flare core (DIR:
#                                                    a checkpoint or geometry directory used
#                                                    as it is, e.g. `python -m
#                                                    ignition.loading.random_weights --geometry
#                                                    smollm2-135m --tokenizer default`: the
#                                                    GGUF's tokenizer and template, random
#                                                    weights, 3.4 MB to carry)
#   bench/suite_gpu.sh smollm2-flare     OUT FLARE   flare run (cache on, off, without message
#                                                    checkpoints, without the idle poll),
#                                                    decode bench
#   bench/suite_gpu.sh smollm2-baselines OUT [ENGINE] transformers serve (continuous batching:
#                                                    ENGINE cb), the static-cache generate loop
#                                                    (static); both without ENGINE
#   bench/suite_gpu.sh smollm2-floor     OUT         the Python replay floor
#   bench/suite_gpu.sh smollm2-timeline  OUT [FUSION] per-kernel timeline of decode at c=1, 4
#                                                    (FUSION: a --decode-fusion to prepare with,
#                                                    over PREPARE_ARGS')
#   bench/suite_gpu.sh qwen3-8b-weights  OUT         random Qwen3-8B weights (safetensors)
#   bench/suite_gpu.sh qwen3-8b-prepare  OUT         the weights (unless written), core
#   bench/suite_gpu.sh qwen3-8b-fusion   OUT         timelines of each --decode-fusion; the one
#                                                    with the fastest c=1 step is then used by
#                                                    the later qwen3-8b stages (WORK keeps it)
#   bench/suite_gpu.sh qwen3-8b-flare    OUT FLARE
#   bench/suite_gpu.sh qwen3-8b-baselines OUT [ENGINE]
#   bench/suite_gpu.sh qwen3-8b-floor    OUT
#   bench/suite_gpu.sh qwen3-8b-timeline OUT [FUSION]
#   bench/suite_gpu.sh gpu-tests         OUT         pytest -m gpu (OUT/pytest-gpu.log)
#   bench/suite_gpu.sh attention-bench   OUT         prefill attention against KV splits and,
#                                                    on a 64K prompt's chunks, SDPA; the decode
#                                                    projection against its tiles
#   bench/suite_gpu.sh report            OUT         summary table and plots of OUT/*.json
#   bench/suite_gpu.sh caches-save       OUT         the Inductor and Triton caches as
#                                                    15 MiB parts (a later machine restores
#   bench/suite_gpu.sh caches-restore    OUT DIR     them from DIR and skips recompiling)
#
# WORK (default /tmp/flare-suite) holds checkpoints and cores between stages;
# WHEELS, when set, names folders of wheels (space-separated) installed first (the
# machine has no registry): gguf and flare_heliopause, plus the openai SDK with its
# dependencies and transformers serve's (`bench/baseline_wheels.sh DIR` downloads
# those where there is a registry). The flare and baselines stages need the SDK (the
# suite's clients measurement times TTFT through it): without it they stop first.
# SUITE_ARGS, when set, adds options to every suite run of the model stages (for
# example --workloads tools agent: only those workloads, in every launch).
# PREPARE_ARGS, when set, adds
# options to `ignition prepare` (for example --no-compile, --compile-scope=layer or
# --decode-fusion=norms: written with `=`, as the floor and the timeline follow
# it; a fusion chosen by qwen3-8b-fusion is added to the qwen3-8b stages' options
# unless PREPARE_ARGS names one). PORT (default 18080)
# is where launched servers listen: stages on two GPUs of one machine need two.
# bench/suite_queue.sh runs several stages in a row.
set -uo pipefail
usage="usage: bench/suite_gpu.sh STAGE OUT [GGUF|FLARE|DIR|ENGINE] (see the header)"
stage=${1:?$usage}
out=${2:?$usage}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/flare-suite}
mkdir -p "$work"
if [ -n "${WHEELS:-}" ]; then
  wheels=()
  for folder in $WHEELS; do
    wheels+=("$folder"/*.whl)
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/flare-site "${wheels[@]}" || exit 1
  export PYTHONPATH=/tmp/flare-site${PYTHONPATH:+:$PYTHONPATH}
  export PATH=/tmp/flare-site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
port=${PORT:-18080}

environment() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.memory \
      --format=csv
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    git log -1 --format='commit %H' 2>/dev/null
  } > "$out/environment.txt" 2>&1
}

# The suite's clients measurement times TTFT through the openai SDK beside its own
# client; a stage that runs it stops here, before launching anything, without it.
need_openai() {
  python3 -c 'import openai' 2> /dev/null && return 0
  echo "the openai SDK is not importable (the suite's clients measurement needs it):" \
    "set WHEELS to a folder of bench/baseline_wheels.sh's wheels" >&2
  return 1
}

# Runs the suite against a server it launches: ENGINE LAUNCH_COMMAND GEOMETRY TOKENIZER
# [suite options...]
suite_http() {
  local engine=$1 launch=$2 geometry=$3 tokenizer=$4
  shift 4
  python3 -m bench.suite --url "http://127.0.0.1:$port/v1" --launch "$launch" \
    --engine "$engine" --out "$out/$engine.json" --tokenizer "$tokenizer" \
    --geometry "$geometry" --measure-bandwidth "$@" 2>&1 | tee "$out/$engine.log"
}

# Prepares a checkpoint into a Flare core: CHECKPOINT CORE [prepare options...]
prepare_core() {
  local checkpoint=$1 core=$2
  shift 2
  rm -rf "$core"
  # shellcheck disable=SC2086 # PREPARE_ARGS is a list of options
  python3 -m ignition.cli prepare "$checkpoint" --out "$core" --max-concurrency 4 "$@" ${PREPARE_ARGS:-} \
    > "$out/prepare.log" 2>&1 || { tail -30 "$out/prepare.log"; return 1; }
  tail -25 "$out/prepare.log"
}

# The flare stages of one model: CORE CHECKPOINT GEOMETRY FLARE [suite options...]
flare_stage() {
  local core=$1 checkpoint=$2 geometry=$3 flare=$4
  shift 4
  need_openai || return 1
  # Cold start: drop the page cache when allowed (the first launch then reads the
  # core from disk; the second, without the prefix cache, is the warm start).
  if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
    echo "page cache dropped before the first flare launch" > "$out/startup-caches.txt"
  else
    echo "page cache not dropped (no permission): both launches are warm" > "$out/startup-caches.txt"
  fi
  suite_http flare "$flare run $core --port $port" "$geometry" "$checkpoint" "$@"
  suite_http flare-no-cache "$flare run $core --port $port --no-prefix-cache" \
    "$geometry" "$checkpoint" --workloads prefix agent "$@"
  # The cache capturing only prompt and answer ends: one prefill chunk per agent turn.
  suite_http flare-no-message-checkpoints "$flare run $core --port $port --message-checkpoints 0" \
    "$geometry" "$checkpoint" --workloads prefix agent tools "$@"
  # The model thread sleeping at once when idle (flare run's poll off, --idle-spin-ms
  # 0): the default's first tokens against a sleeping thread's.
  suite_http flare-no-idle-spin "$flare run $core --port $port --idle-spin-ms 0" \
    "$geometry" "$checkpoint" --workloads tools "$@"
  # Native decode steps (after the suite: each replay first checks the qualification,
  # which hashes every buffer, 16 GiB of weights for the 8B).
  mkdir -p "$out/decode-bench"
  for capacity in 1 4; do
    "$flare" replay "$core" --bench-decode "$capacity" --steps 256 \
      --json "$out/decode-bench/flare-c$capacity.json" > "$out/decode-bench/flare-c$capacity.log" 2>&1
  done
}

# Transformers' baselines of one model: CHECKPOINT GEOMETRY ENGINE [suite options...]
# (ENGINE: cb, static, or empty for both; two GPUs can run one each).
baselines_stage() {
  local checkpoint=$1 geometry=$2 engine=$3
  shift 3
  case $engine in
    "" | cb | static) ;;
    *) echo "unknown baseline engine '$engine' (cb or static)" >&2; return 2 ;;
  esac
  if [ "$engine" != static ]; then
    need_openai || return 1
    suite_http transformers-cb \
      "python3 -m transformers.cli.transformers serve $checkpoint --continuous-batching --cb-use-cuda-graph --dtype bfloat16 --device cuda:0 --host 127.0.0.1 --port $port" \
      "$geometry" "$checkpoint" --dialect transformers --model "$checkpoint" "$@"
  fi
  if [ "$engine" != cb ]; then
    python3 -m bench.suite --generate "$checkpoint" --engine transformers-static \
      --out "$out/transformers-static.json" --tokenizer "$checkpoint" --geometry "$geometry" \
      --measure-bandwidth "$@" 2>&1 | tee "$out/transformers-static.log"
  fi
}

smol=$work/smollm2
smol_core=$work/smollm2-core
# SmolLM2 admits 8K positions: the 32K and 64K rows are skipped by the suite itself,
# and the agent trace stops before the context limit.
# shellcheck disable=SC2206 # SUITE_ARGS is a list of options
smol_suite=(--lengths 512 4096 32768 65536 --agent-tokens 7000 ${SUITE_ARGS:-})
qwen=$work/qwen3-8b
qwen_core=$work/qwen3-8b-core
# The random Qwen3-8B geometry admits 128K positions: the core serves 65,536-token
# prompts plus their answers (66,560 = 1,040 pages of 64 tokens).
# shellcheck disable=SC2206 # SUITE_ARGS is a list of options
qwen_suite=(--lengths 512 4096 32768 65536 --agent-tokens 32768 ${SUITE_ARGS:-})
# The 8B compiles layer by layer: one compilation per shape serves its 36 layers
# (whole forwards outlast a call). A --compile-scope in PREPARE_ARGS, later, wins.
case $stage in
  qwen3-8b-*) PREPARE_ARGS="--compile-scope=layer ${PREPARE_ARGS:-}" ;;
esac
# The decode fusion qwen3-8b-fusion measured fastest in this run, for the 8B's core,
# floor and timeline (not for the fusion stage, which tries each).
qwen_fusion=$work/qwen3-8b.decode-fusion
case $stage:${PREPARE_ARGS:-} in
  qwen3-8b-fusion:* | *--decode-fusion=*) ;;
  qwen3-8b-*)
    if [ -s "$qwen_fusion" ]; then
      PREPARE_ARGS="$PREPARE_ARGS --decode-fusion=$(cat "$qwen_fusion")"
      echo "decode fusion from qwen3-8b-fusion: $(cat "$qwen_fusion")"
    fi
    ;;
esac

# Random Qwen3-8B weights, unless a completed earlier stage wrote them (they depend
# only on the geometry and its seed).
qwen_weights() {
  [ -e "$qwen/.complete" ] && return 0
  rm -rf "$qwen" "$qwen.geometry"
  python3 -m ignition.loading.random_weights --geometry qwen3-8b --out "$qwen" --safetensors \
    > "$out/weights.log" 2>&1 || { tail -30 "$out/weights.log"; return 1; }
  touch "$qwen/.complete"
}

# The floor (`as_prepared floor`) and the timeline (`as_prepared timeline`) prepare
# their forwards as the core's were: the preparation options of PREPARE_ARGS, in
# their own spelling.
as_prepared() {
  local flag
  for flag in ${PREPARE_ARGS:-}; do
    case $1:$flag in
      floor:--no-compile) echo --replay-no-compile ;;
      floor:--compile-sampling) echo --replay-compile-sampling ;;
      floor:--no-compile-sampling) echo --no-replay-compile-sampling ;;
      floor:--compile-scope=*) echo "--replay-compile-scope=${flag#--compile-scope=}" ;;
      floor:--decode-fusion=*) echo "--replay-decode-fusion=${flag#--decode-fusion=}" ;;
      floor:--programmatic-launch) echo --replay-programmatic-launch ;;
      floor:--no-programmatic-launch) echo --no-replay-programmatic-launch ;;
      floor:--early-weights) echo --replay-early-weights ;;
      floor:--no-early-weights) echo --no-replay-early-weights ;;
      timeline:--no-compile | timeline:--compile-sampling | timeline:--no-compile-sampling | \
        timeline:--compile-scope=* | timeline:--decode-fusion=* | timeline:--programmatic-launch | \
        timeline:--no-programmatic-launch | timeline:--early-weights | timeline:--no-early-weights)
        echo "$flag" ;;
    esac
  done
}

case $stage in
  smollm2-prepare)
    source=${1:?$usage}
    environment
    if [ -d "$source" ]; then
      rm -rf "$smol" && cp -r "$source" "$smol" || exit 1
    else
      python3 -m bench.suite.convert_gguf "$source" --out "$smol" > "$out/convert.log" 2>&1 \
        || { tail -30 "$out/convert.log"; exit 1; }
    fi
    prepare_core "$smol" "$smol_core" --context-limit 8192
    ;;
  smollm2-flare)
    flare_stage "$smol_core" "$smol" smollm2-135m "${1:?$usage}" "${smol_suite[@]}"
    ;;
  smollm2-baselines)
    baselines_stage "$smol" smollm2-135m "${1:-}" "${smol_suite[@]}"
    ;;
  smollm2-floor)
    python3 -m bench.suite --replay "$smol" $(as_prepared floor) --engine python-floor \
      --out "$out/python-floor.json" \
      --tokenizer "$smol" --geometry smollm2-135m --context-limit 8192 "${smol_suite[@]}" \
      2>&1 | tee "$out/python-floor.log"
    ;;
  smollm2-timeline)
    python3 bench/kernel_timeline.py "$smol" $(as_prepared timeline) ${1:+--decode-fusion=$1} \
      --capacities 1 4 --context-limit 8192 --geometry smollm2-135m \
      --out "$out/timeline/smollm2.json" --trace-dir "$out/timeline" 2>&1 | tail -20
    ;;
  qwen3-8b-timeline)
    python3 bench/kernel_timeline.py "$qwen" $(as_prepared timeline) ${1:+--decode-fusion=$1} \
      --capacities 1 4 --context-limit 8192 --geometry qwen3-8b \
      --out "$out/timeline/qwen3-8b.json" --trace-dir "$out/timeline" 2>&1 | tail -20
    ;;
  qwen3-8b-fusion)
    environment
    qwen_weights || exit 1
    for fusion in none residuals norms; do
      python3 bench/kernel_timeline.py "$qwen" $(as_prepared timeline) --decode-fusion=$fusion \
        --capacities 1 4 --context-limit 8192 --geometry qwen3-8b \
        --out "$out/$fusion/qwen3-8b.json" --trace-dir "$out/$fusion" 2>&1 | tail -4 \
        || exit 1
    done
    python3 -m bench.fastest_fusion "$out"/{none,residuals,norms}/qwen3-8b.json \
      --out "$qwen_fusion" | tee "$out/fastest.md"
    ;;
  qwen3-8b-weights)
    environment
    rm -f "$qwen/.complete"
    qwen_weights
    ;;
  qwen3-8b-prepare)
    environment
    qwen_weights || exit 1
    # 1,152 pages of 64 tokens (10.1 GiB): one 64K prompt, or the 32K agent trace
    # with its branch and the cache's chains; sized from free memory (23 GiB) the
    # pages make qualification's digests outlast a call.
    prepare_core "$qwen" "$qwen_core" --context-limit 66560 --kv-pages 1152
    ;;
  qwen3-8b-flare)
    flare_stage "$qwen_core" "$qwen" qwen3-8b "${1:?$usage}" "${qwen_suite[@]}"
    ;;
  qwen3-8b-baselines)
    baselines_stage "$qwen" qwen3-8b "${1:-}" "${qwen_suite[@]}"
    ;;
  qwen3-8b-floor)
    python3 -m bench.suite --replay "$qwen" $(as_prepared floor) --engine python-floor \
      --out "$out/python-floor.json" \
      --tokenizer "$qwen" --geometry qwen3-8b --context-limit 66560 "${qwen_suite[@]}" \
      2>&1 | tee "$out/python-floor.log"
    ;;
  gpu-tests)
    environment
    # test_http_clients.py has no GPU test and imports the openai and anthropic
    # clients, which the GPU machine lacks.
    PYTHONPATH=$PYTHONPATH:$PWD/tests python3 -m pytest -m gpu tests -q -p no:cacheprovider \
      --ignore=tests/test_http_clients.py > "$out/pytest-gpu.log" 2>&1
    status=$?
    tail -5 "$out/pytest-gpu.log"
    exit $status
    ;;
  attention-bench)
    python3 bench/prefill_attention_bench.py --out "$out/prefill-attention.json" 2>&1 |
      tee "$out/prefill-attention.log"
    python3 bench/rows_linear_bench.py --out "$out/rows-linear.json" 2>&1 |
      tee "$out/rows-linear.log"
    ;;
  caches-save)
    tar -C /tmp -czf - flare-inductor flare-triton | split -b 15m - "$out/compile-caches.tgz.part-"
    ls -l "$out"/compile-caches.tgz.part-*
    ;;
  caches-restore)
    folder=${1:?$usage}
    cat "$folder"/compile-caches.tgz.part-* | tar -C /tmp -xzf - || exit 1
    du -sh /tmp/flare-inductor /tmp/flare-triton
    ;;
  report)
    shopt -s nullglob
    python3 -m bench.suite.report "$out"/*.json --decode-bench "$out"/decode-bench/flare-c*.json \
      --out-dir "$out/report" 2>&1 | tee "$out/report.log"
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
