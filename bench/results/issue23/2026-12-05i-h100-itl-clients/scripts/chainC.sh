#!/usr/bin/env bash
# Issue 23 (2026-12-05i): SmolLM2's served inter-token latency timed by the suite's
# client with one forked process a stream, then with threads of one process (as before),
# the same core and server options, in one run; the server's own inter-token gaps beside.
set -uo pipefail
out=$DETACHED_OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target SITE .carry/wheels/*.whl > "$out/install.log" 2>&1 || { echo install failed; exit 1; }
export PYTHONPATH=SITE:$PWD PATH=SITE/bin:$PATH WORK=WORK
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=TRITON_CACHE TORCHINDUCTOR_CACHE_DIR=INDUCTOR_CACHE
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv > "$out/machine.txt" 2>&1
t0=$SECONDS
step() { echo "$1 rc=$2 at $((SECONDS - t0))s" | tee -a "$out/steps.txt"; }
flare=$PWD/.carry/flare
mkdir -p $WORK && rm -rf $WORK/smollm2 && cp -r .carry/smolrw $WORK/smollm2
python3 -m ignition.cli prepare $WORK/smollm2 --out $WORK/smollm2-core --max-concurrency 4 \
  --context-limit 8192 > "$out/smol-prepare.log" 2>&1; step smol-prepare $?
for round in 1 2; do
  for workers in processes threads; do
    extra=(); [ $workers = threads ] && extra=(--client-threads)
    python3 -m bench.suite --url http://127.0.0.1:18080/v1 --launch "$flare run $WORK/smollm2-core --port 18080" \
      --engine flare-$workers-$round --out "$out/flare-$workers-$round.json" --tokenizer $WORK/smollm2 \
      --geometry smollm2-135m --workloads decode tools "${extra[@]}" > "$out/flare-$workers-$round.log" 2>&1
    step "flare-$workers-$round" $?
  done
done
python3 -m bench.suite.report "$out"/flare-*.json --out-dir "$out/report" > "$out/report.log" 2>&1; step report $?
echo chain done
