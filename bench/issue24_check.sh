#!/usr/bin/env bash
# Issue 24's checks that one GPU allows. Results go to OUT.
#
# MODEL=tiny-hybrid runs every part on the tiny hybrid (qwen4_exp) in place of the
# tiny Qwen3.
#
#   bench/issue24_check.sh tp-logits OUT
#       a tiny Qwen3 checkpoint's teacher-forced logits from two tensor-parallel
#       ranks (both on this GPU, over Gloo: ignition.parallel.logits_check) against
#       one rank's, in bfloat16 with the GPU kernels (float32 is checked on the CPU,
#       in tests/test_tensor_parallel.py: the GPU's attention kernels take 16-bit
#       floats); then the same with --collectives window: the two rank processes
#       trade exported device memory (needs the carried flare_heliopause wheel) and
#       run the export-safe collectives, whose logits must equal Gloo's bit for bit.
#   bench/issue24_check.sh export OUT
#       the tiny Qwen3 exported at two ranks on this GPU (ignition.parallel.export_ranks:
#       each rank's window at its own base with a collectives region, the peer's
#       region mapped at its address, compile and capture over the window
#       collectives, each rank's core, then the group's merged core in OUT/core, read
#       back; when FLARE names a flare binary, `$FLARE inspect` on it and `$FLARE
#       replay --check --rank-devices RANK_DEVICES`: both ranks in one process, their
#       qualification sequences replayed in lockstep, bitwise per rank). RANK_DEVICES
#       (default 0,0: both ranks on this GPU) places the ranks in every part. The Python
#       harness answers the first 8 agent prompts over the exported graphs
#       (OUT/python.json). Needs the carried flare_heliopause wheel.
#   bench/issue24_check.sh serve OUT
#       `FLARE run` serving export's group core (OUT/../export) with both ranks on
#       this GPU, checked with the OpenAI client against the harness's answers and
#       with the prefix cache (see the part below).
#   bench/issue24_check.sh agent OUT
#       the suite's agent trace against export's group core (TP2) and a TP1 core of the
#       same checkpoint, both served by `FLARE run` (see the part below).
#   bench/issue24_check.sh collectives OUT
#       the export-safe two-rank collectives (ignition.parallel.window_collectives),
#       tests/test_window_collectives.py's GPU tests, every result bitwise: both ranks
#       in this process on two streams at once, eager and replayed from CUDA graphs;
#       then two rank processes on this GPU, each mapping the other's storage at its
#       address (ignition.parallel.shared_collectives: exported memory, descriptors
#       passed over the process group). Needs the carried flare_heliopause wheel.
set -uo pipefail
usage="usage: bench/issue24_check.sh tp-logits|export|serve|agent|collectives OUT"
part=${1:?$usage}
out=${2:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton
work=${WORK:-/tmp/flare-issue24}
# Each rank's device (RANK_DEVICES, default 0,0: both ranks on this GPU), for the export,
# the replay and serving alike.
devices=${RANK_DEVICES:-0,0}
# The harness's requests at export, and what serve_clients.py sends.
sampling=(--temperature 0.7 --top-k 40 --top-p 0.9 --min-p 0 --seed 1000 --max-new-tokens 32)
mkdir -p "$work"
status=0
# The checkpoint (MODEL): tiny-qwen3 (default: the dense recipe) or tiny-hybrid (the
# qwen4_exp recipe: GDN, QSA, experts, hyperconnections and PLE).
model=${MODEL:-tiny-qwen3}
ckpt=$work/$model
write_checkpoint() {
  case $model in
    tiny-qwen3) python3 -c "import sys; from pathlib import Path; from checkpoints import \
write_tiny; write_tiny(Path(sys.argv[1]), 'qwen3')" "$ckpt" > /dev/null ;;
    tiny-hybrid) python3 -c "import sys; from pathlib import Path; from checkpoints import \
write_tiny_hybrid; write_tiny_hybrid(Path(sys.argv[1]))" "$ckpt" > /dev/null ;;
    *) echo "MODEL is tiny-qwen3 or tiny-hybrid, not $model"; return 1 ;;
  esac
}

case $part in
  tp-logits)
    write_checkpoint || exit 1
    python3 -m ignition.parallel.logits_check "$ckpt" --world 2 --device cuda \
      --dtype bfloat16 --out "$out/tp-logits-bfloat16.json" > "$out/tp-logits-bfloat16.log" 2>&1 \
      || status=1
    tail -16 "$out/tp-logits-bfloat16.log"
    timeout 600 python3 -m ignition.parallel.logits_check "$ckpt" --world 2 \
      --device cuda --dtype bfloat16 --collectives window \
      --out "$out/tp-logits-window-bfloat16.json" > "$out/tp-logits-window-bfloat16.log" 2>&1 \
      || status=1
    tail -20 "$out/tp-logits-window-bfloat16.log"
    ;;
  export)
    write_checkpoint || exit 1
    rm -rf "$out/core"
    head -8 bench/prompts/agent50.jsonl > "$out/prompts.jsonl"
    timeout 900 python3 -m ignition.parallel.export_ranks "$ckpt" --out "$out/core" \
      --max-concurrency 4 --context-limit 2048 --rank-devices "$devices" \
      --replay-out "$out/python.json" \
      --prompts "$out/prompts.jsonl" "${sampling[@]}" > "$out/export.log" 2>&1 || status=1
    tail -20 "$out/export.log"
    python3 -c "import sys; from pathlib import Path; from ignition.export.core_dir import \
read_core_dir; core = read_core_dir(Path(sys.argv[1]))[0]; \
print('world', core.rank_layout.world_size, 'graphs', len(core.graphs), 'images', len(core.images))" \
      "$out/core" 2>&1 | tee "$out/core-summary.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    # Helios's own validation of the group's core (rank layout, collectives regions,
    # images), when a flare binary is given.
    if [ -n "${FLARE:-}" ]; then
      "$FLARE" inspect "$out/core" > "$out/inspect.txt" 2>&1 || status=1
      tail -12 "$out/inspect.txt"
      # Both ranks loaded in one process on this GPU and their qualification
      # sequences replayed in lockstep, every digest of every rank compared.
      timeout 300 "$FLARE" replay "$out/core" --check --rank-devices $devices \
        --json "$out/replay-check.json" > "$out/replay-check.txt" 2>&1 || status=1
      grep -E "^(rank|result)" "$out/replay-check.txt"
      tail -3 "$out/replay-check.txt"
    fi
    ;;
  serve)
    # The group's core that `export` wrote (OUT/../export/core), served by `flare run
    # --rank-devices 0,0`: both ranks in one process on this GPU, one execution
    # thread each. bench/serve_clients.py streams with the OpenAI client, sends the
    # prompts at concurrency 1, 2 and 4 and compares every answer with the Python
    # harness's over the same graphs (export's python.json), token for token, and
    # disconnects a stream mid-way, and the first prompt goes through every stock client
    # and route (chat, Responses, anthropic Messages, the Agents SDK), streamed and not,
    # each answering as chat (--sdks); SIGTERM must drain and exit 0. Then with the
    # prefix cache: each prompt twice (the repeat restores the whole prompt and answers
    # identically) and a next turn that restores the first.
    exported=$(dirname "$out")/export
    [ -f "$exported/core/manifest.pb" ] || { echo "no core in $exported: run export first"; exit 1; }
    : "${FLARE:?serve needs FLARE, a flare binary}"
    . bench/flare_run.sh
    for part in corpus prefix; do
      if [ $part = corpus ]; then
        flare_run "$FLARE" "$exported/core" "$out/flare-run.log" --rank-devices $devices \
          --no-prefix-cache || exit 1
        timeout 300 python3 bench/serve_clients.py --url "$url" --prompts "$exported/prompts.jsonl" \
          --python "$exported/python.json" --out "$out/serve.json" --seed 1000 --max-tokens 32 \
          --sdks > "$out/flare-run.client.log" 2>&1 || status=1
      else
        flare_run "$FLARE" "$exported/core" "$out/flare-run-prefix.log" --rank-devices $devices \
          || exit 1
        timeout 300 python3 bench/serve_clients.py --url "$url" --prompts "$exported/prompts.jsonl" \
          --prefix-check --out "$out/serve-prefix.json" --seed 1000 --max-tokens 32 \
          --sampling '{"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0}' \
          > "$out/flare-run-prefix.client.log" 2>&1 || status=1
      fi
      name=flare-run
      [ $part = prefix ] && name=flare-run-prefix
      tail -6 "$out/$name.client.log"
      kill -TERM $pid
      wait $pid
      code=$?
      echo "flare run ($part) exited with $code after SIGTERM"
      [ $code -eq 0 ] || status=1
    done
    ;;
  agent)
    # The agent trace (bench.suite's agent workload: a growing tool conversation, a
    # fork sharing its history, and repeats that a prefix cache restores exactly) against
    # the group's core that `export` wrote (TP2, both ranks on this GPU) and against the
    # same checkpoint prepared for one rank (TP1, made here), each through `FLARE run`
    # with the prefix cache; `python -m bench.suite.report` puts both engines' turns side
    # by side (OUT/report/summary.md): prompt, cached and prefilled tokens per turn, and
    # the repeats' checks.
    exported=$(dirname "$out")/export
    [ -f "$exported/core/manifest.pb" ] || { echo "no core in $exported: run export first"; exit 1; }
    : "${FLARE:?agent needs FLARE, a flare binary}"
    rm -rf "$work/tp1-core"
    python3 -m ignition.cli prepare "$ckpt" --out "$work/tp1-core" --max-concurrency 4 \
      --context-limit 2048 --prefill-chunk-size 1024 > "$out/tp1-prepare.log" 2>&1 \
      || { tail -20 "$out/tp1-prepare.log"; exit 1; }
    port=18424
    for engine in flare-tp1 flare-tp2; do
      core=$work/tp1-core options=""
      [ $engine = flare-tp2 ] && core=$exported/core options="--rank-devices $devices"
      timeout 600 python3 -m bench.suite --url "http://127.0.0.1:$port/v1" \
        --launch "$FLARE run $core --port $port $options" --engine $engine \
        --out "$out/$engine.json" --workloads agent --agent-tokens 1500 \
        --tokenizer "$ckpt" --geometry "$ckpt/config.json" \
        --context-limit 2048 > "$out/$engine.log" 2>&1 || status=1
      tail -3 "$out/$engine.log"
    done
    python3 -m bench.suite.report "$out/flare-tp1.json" "$out/flare-tp2.json" --flare flare-tp2 \
      --out-dir "$out/report" > "$out/report.log" 2>&1 || status=1
    grep -A40 "Agent trace" "$out/report/summary.md" | head -80
    ;;
  collectives)
    # Two rank processes share the one GPU only in the Default compute mode.
    nvidia-smi --query-gpu=name,compute_mode --format=csv > "$out/machine.txt" 2>&1
    timeout 300 python3 -m pytest -m gpu tests/test_window_collectives.py -q -p no:cacheprovider \
      -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
exit $status
