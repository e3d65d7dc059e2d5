#!/usr/bin/env bash
# Issue 23 (2026-12-05k): SmolLM2 served with the scheduler fix (14f1962) and the
# delivered inter-token histogram (3e432c6): decode ITL, tool-use TTFT, the agent trace,
# flare and the floor in one run; then the serving path's CPU share on this machine
# (bench/http_overhead.py over the fake_server example).
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
mkdir -p BIN && for f in flare fake_server; do python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/$f.xz BIN/$f && chmod +x BIN/$f; done
flare=BIN/flare
bash bench/suite_gpu.sh smollm2-prepare "$out/smol" .carry/smolrw > "$out/smol-prepare.log" 2>&1; step smol-prepare $?
export SUITE_ARGS="--workloads tools agent decode"
bash bench/suite_gpu.sh smollm2-flare "$out/smol" "$flare" > "$out/smol-flare.log" 2>&1; step smol-flare $?
bash bench/suite_gpu.sh smollm2-floor "$out/smol" > "$out/smol-floor.log" 2>&1; step smol-floor $?
bash bench/suite_gpu.sh report "$out/smol" > "$out/smol-report.log" 2>&1; step smol-report $?
python3 bench/http_overhead.py --binary BIN/fake_server --tokens 512 --requests 200 \
  --out "$out/http-overhead.json" > "$out/http-overhead.txt" 2>&1; step http-overhead $?
echo chain done
