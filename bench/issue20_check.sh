#!/usr/bin/env bash
# Issue 20's check on the GPU machine: `flare run` serves CORE (exported after the
# output protocol was added, so it carries the protocol Ignition derived from the
# template); through the official SDKs a Responses API stream with a function tool
# and an Anthropic tool conversation must complete (bench/agent_session.py), and a
# multi-turn tool conversation reports its prefix-cache reuse, cached tokens per
# turn, with tool_choice auto every turn and alternating with none
# (bench/tool_prefix_reuse.py); SIGTERM must drain flare to exit 0. Results go to OUT.
#
#   bench/issue20_check.sh OUT FLARE CORE
#
# The model id is the core directory's name (flare run's default). Needs the openai
# and anthropic SDKs importable (WHEELS, as bench/suite_gpu.sh installs them).
set -uo pipefail
usage="usage: bench/issue20_check.sh OUT FLARE CORE"
out=${1:?$usage}
flare=${2:?$usage}
core=${3:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
model=$(basename "$core")
. bench/flare_run.sh
flare_run "$flare" "$core" "$out/flare.log" || exit 1
status=0
"$flare" inspect "$core" > "$out/inspect.txt" 2>&1 || status=1
grep -i -E "tool|reasoning" "$out/inspect.txt"
python3 bench/agent_session.py --url "$url" --model "$model" --out "$out/agent-session.json" \
  2>&1 | tee "$out/agent-session.log" || status=1
python3 bench/tool_prefix_reuse.py --url "$url" --model "$model" --out "$out/prefix-reuse.json" \
  2>&1 | tee "$out/prefix-reuse.log" || status=1
kill -TERM $pid
wait $pid
code=$?
echo "flare run exited with $code after SIGTERM" | tee "$out/exit.txt"
[ $code -eq 0 ] || status=1
echo "status $status" | tee -a "$out/exit.txt"
exit $status
