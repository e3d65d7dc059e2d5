#!/usr/bin/env bash
# Issue 21's check on the GPU machine, in two parts (each fits one call; the core
# must have been exported after token masks were added, so its sampling graphs take
# them). Results go to OUT.
#
#   bench/issue21_check.sh serve   OUT FLARE CORE
#       `flare replay --check` (bitwise, the qualification's masked decodes included),
#       native decode timing at capacities 1 and 4, then `flare run CORE` through the
#       openai and anthropic SDKs: every json_schema answer and every required or
#       named tool call validates (bench/constrained_session.py), and inter-token
#       latency unconstrained and under a schema at c=1 and c=4; SIGTERM drains flare.
#   bench/issue21_check.sh ab      OUT FLARE CORE CHECKPOINT
#       what the mask input costs unconstrained requests: CHECKPOINT exported again
#       as CORE was (bench/suite_gpu.sh's SmolLM2 options) but --no-token-masks, its
#       `flare replay --check`, then bench/mask_input_ab.py over both cores in
#       alternating rounds (native decode step, served ITL at c=1 and c=4).
#   bench/issue21_check.sh sampler OUT [GRAMMAR_BENCH TOKENIZER...]
#       the GPU sampling tests (compiled sampler with masks against eager, at the
#       served vocabularies), what the mask input costs the captured sampler
#       (bench/mask_cost.py at 49,152 and 151,936 tokens), and, given the release
#       grammar_bench example, the grammar engine's build, compile and per-step mask
#       times over each TOKENIZER on this machine's CPU.
#
# Needs the openai and anthropic SDKs and the flare_heliopause wheel importable
# (WHEELS, as bench/suite_gpu.sh installs them).
set -uo pipefail
usage="usage: bench/issue21_check.sh serve OUT FLARE CORE | ab OUT FLARE CORE CHECKPOINT | sampler OUT [GRAMMAR_BENCH TOKENIZER...]"
part=${1:?$usage}
out=${2:?$usage}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
status=0
case $part in
  serve)
    flare=${1:?$usage}
    core=${2:?$usage}
    model=$(basename "$core")
    . bench/replay_check.sh
    replay_check "$flare" "$core" "$out" || status=1
    . bench/flare_run.sh
    flare_run "$flare" "$core" "$out/flare.log" || exit 1
    python3 bench/constrained_session.py --url "$url" --model "$model" \
      --out "$out/constrained.json" 2>&1 | tee "$out/constrained.log" || status=1
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" \
      "$url/metrics" > "$out/metrics.txt" 2>&1
    kill -TERM $pid
    wait $pid
    code=$?
    echo "flare run exited with $code after SIGTERM" | tee "$out/exit.txt"
    [ $code -eq 0 ] || status=1
    ;;
  ab)
    flare=${1:?$usage}
    core=${2:?$usage}
    checkpoint=${3:?$usage}
    plain=$core-plain
    rm -rf "$plain"
    python3 -m ignition.cli prepare "$checkpoint" --out "$plain" --max-concurrency 4 \
      --context-limit 8192 --no-token-masks > "$out/prepare-plain.log" 2>&1 \
      || { tail -30 "$out/prepare-plain.log"; exit 1; }
    "$flare" replay "$plain" --check --json "$out/replay-check-plain.json" \
      > "$out/replay-check-plain.log" 2>&1 || status=1
    tail -3 "$out/replay-check-plain.log"
    python3 bench/mask_input_ab.py --flare "$flare" --masked "$core" --plain "$plain" \
      --out "$out/mask-input-ab.json" 2>&1 | tee "$out/mask-input-ab.log" || status=1
    ;;
  sampler)
    python3 -m pytest tests/test_sampling.py -m gpu -q -p no:cacheprovider -rs \
      > "$out/pytest-sampling.log" 2>&1 || status=1
    tail -3 "$out/pytest-sampling.log"
    for vocab in 49152 151936; do
      python3 bench/mask_cost.py --vocab $vocab --out "$out/mask-cost-$vocab.json" \
        2>&1 | tail -1 || status=1
    done
    if [ $# -gt 0 ]; then
      bench=$1
      shift
      for tokenizer in "$@"; do
        name=$(basename "$tokenizer" .json)
        "$bench" "$tokenizer" --out "$out/grammar-$name.json" > "$out/grammar-$name.log" 2>&1 \
          || status=1
        tail -1 "$out/grammar-$name.log"
      done
    fi
    ;;
  *)
    echo "$usage"
    exit 2
    ;;
esac
echo "status $status" | tee -a "$out/exit.txt"
exit $status
