#!/usr/bin/env bash
# Serving check in one call: Ignition exports the runtime core and, in the same
# process over the very graphs exported (reset to the core's initial contents), the
# Python replay harness answers the 50 agent prompts (`prepare --replay-out`: one
# preparation); `flare run --no-prefix-cache` serves the core, and
# bench/serve_clients.py streams with the OpenAI client, replays the prompts at
# concurrency 1, 2 and 4 (outputs compared with the harness's: the cache would split
# prefill at message endpoints, a different chunk partition than the harness's), and
# disconnects a stream mid-way (metrics must show it cancelled and freed). Then
# SIGTERM: flare must drain and exit 0. Then `flare run` with the prefix cache: each
# prompt again, twice (the repeat must restore the whole prompt and answer
# identically), and a next turn that must restore the first prompt. Results go to
# OUT_DIR.
#
#   bench/serve_check.sh OUT_DIR MODEL FLARE_BIN [-- PREPARE_ARGS...]
#
# SERVE_PARTS picks the serving parts: "corpus prefix" (the default), "corpus" or
# "prefix".
#
# For models whose preparation and serving outlast one call, the work splits in two:
# with SERVE_CORE (a directory) and SERVE_PYTHON_JSON (a file) set, the core and the
# harness's answers are made there unless the core exists (when only the answers are
# missing, a separate preparation's harness makes them), and SERVE_STAGE=prepare stops
# after that; a later call with the same two (the machine still up) serves. Without
# them both are made afresh in OUT_DIR and a temporary folder.
#
# SERVE_PROMPTS, when set, names another prompts file (a tiny model's short context
# takes the first prompts of bench/prompts/agent50.jsonl, say).
#
# Needs flare_heliopause and the openai client importable.
set -uo pipefail
usage="usage: bench/serve_check.sh OUT_DIR MODEL FLARE_BIN [-- PREPARE_ARGS...]"
out=${1:?$usage}
model=${2:?$usage}
flare=${3:?$usage}
shift 3
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. bench/flare_run.sh
prompts=${SERVE_PROMPTS:-bench/prompts/agent50.jsonl}
sampling=(--temperature 0.7 --top-k 40 --top-p 0.9 --min-p 0 --seed 1000 --max-new-tokens 64)
parts=${SERVE_PARTS:-corpus prefix}
python=${SERVE_PYTHON_JSON:-$out/python.json}
core=${SERVE_CORE:-$(mktemp -d)/core}
# Only the corpus compares with the harness's answers.
answers=()
[[ " $parts " == *" corpus "* ]] \
  && answers=(--replay-out "$python" --prompts "$prompts" "${sampling[@]}")
if [ -z "${SERVE_CORE:-}" ] || [ ! -f "$core/manifest.pb" ]; then
  rm -rf "$core"
  # The export's log holds the harness's answers, one per line, then the report.
  python3 -m ignition.cli prepare "$model" --out "$core" "${answers[@]}" "$@" \
    > "$out/export.log" 2>&1 || { tail -20 "$out/export.log"; exit 1; }
elif [ ${#answers[@]} -gt 0 ] && [ ! -f "$python" ]; then
  python3 -m ignition.cli replay "$model" --prompts "$prompts" "${sampling[@]}" \
    --out "$python" "$@" > "$out/python.log" 2>&1 || { tail -20 "$out/python.log"; exit 1; }
fi
[ "${SERVE_STAGE:-}" = prepare ] && exit 0
# serve NAME [flare options]: starts flare, sets $pid and $url.
serve() {
  local name=$1
  shift
  flare_run "$flare" "$core" "$out/$name.log" "$@"
}

# stop NAME: SIGTERM, and flare must drain and exit 0.
stop() {
  kill -TERM $pid
  wait $pid
  local code=$?
  echo "flare run exited with $code after SIGTERM" | tee -a "$out/$1.client.log"
  tail -5 "$out/$1.log"
  [ $code -eq 0 ]
}

status=0
if [[ " $parts " == *" corpus "* ]]; then
  serve flare-run --no-prefix-cache || exit 1
  python3 bench/serve_clients.py --url "$url" --prompts "$prompts" --python "$python" \
    --out "$out/serve.json" --seed 1000 --max-tokens 64 2>&1 | tee "$out/flare-run.client.log" \
    || status=1
  stop flare-run || status=1
fi
if [[ " $parts " == *" prefix "* ]]; then
  serve flare-run-prefix || exit 1
  python3 bench/serve_clients.py --url "$url" --prompts "$prompts" --prefix-check \
    --out "$out/serve-prefix.json" --seed 1000 --max-tokens 64 \
    --sampling '{"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0}' 2>&1 \
    | tee "$out/flare-run-prefix.client.log" || status=1
  stop flare-run-prefix || status=1
fi
exit $status
