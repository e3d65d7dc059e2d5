#!/usr/bin/env bash
# Issue 19's check on the GPU machine: `flare run` serves CORE; through the official
# openai SDK, the first content delta must follow the stream's first event within
# 5 ms at about 100 and 4,000 prompt tokens (bench/first_delta.py); then the load of
# bench/http_load.py (2,000 requests at concurrency 1,000, 30% cancelled, 10%
# malformed) must end every request with exactly one terminal event or a typed error,
# no 5xx, under 64 server threads and /health within 50 ms at the peak's 99th
# percentile; then the gauges must return to idle and SIGTERM must drain flare to exit
# 0. Results go to OUT.
#
#   bench/issue19_check.sh OUT FLARE CORE
#
# The model id is the core directory's name (flare run's default). Needs the openai
# SDK importable (WHEELS, as bench/suite_gpu.sh installs them).
set -uo pipefail
usage="usage: bench/issue19_check.sh OUT FLARE CORE"
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
python3 bench/first_delta.py --url "$url" --model "$model" --out "$out/first-delta.json" \
  2>&1 | tee "$out/first-delta.log" || status=1
python3 -m bench.http_load --url "$url" --pid $pid --model "$model" --out "$out/load.json" \
  > "$out/load.log" 2>&1 || status=1
tail -n 20 "$out/load.log"
# Idle again: nothing running or queued, only prefix-cache pages held, all reclaimable.
python3 - "$url" > "$out/idle.txt" 2>&1 << 'PY' || status=1
import sys, time, urllib.request
url = sys.argv[1]
for _ in range(300):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    m = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and l[0] != "#"}
    held = m.get("flare_prefix_pages_held", 0)
    if (m["flare_running_requests"], m["flare_queue_depth"], m["flare_pages_reserved"]) == (0, 0, 0) \
            and m["flare_pages_used"] == held and m.get("flare_prefix_pages_reclaimable", 0) == held:
        print("idle:", {k: v for k, v in m.items() if not k.endswith(("_bucket", "_sum", "_count"))})
        sys.exit(0)
    time.sleep(0.1)
print("not idle:", m)
sys.exit(1)
PY
cat "$out/idle.txt"
grep '^Threads' /proc/$pid/status | tee "$out/threads-after.txt"
kill -TERM $pid
wait $pid
code=$?
echo "flare run exited with $code after SIGTERM" | tee "$out/exit.txt"
[ $code -eq 0 ] || status=1
echo "status $status" | tee -a "$out/exit.txt"
exit $status
