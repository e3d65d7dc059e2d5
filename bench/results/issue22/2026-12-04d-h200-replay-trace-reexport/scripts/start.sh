#!/usr/bin/env bash
# start two detached chains: A = h200 (compiled, replay --check, decode) then trace; B = reexport then GPU tile tests
set -uo pipefail
. CARRY/common.sh
mkdir -p WORK
rm -rf WORK/*-core CHAIN_A CHAIN_B
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/machine.txt 2>&1
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)' >> $OUT/machine.txt 2>&1
bash bench/detached.sh start CHAIN_A 'export PYTHONPATH=SITE FLARE_START_S=300 GEOMETRY=qwen4-exp-h200 WORK=WORK; F=CARRY/flare; chmod +x $F; bash bench/issue22_check.sh h200 $DETACHED_OUT/h200 $F; echo "h200 rc=$? at ${SECONDS}s"; rm -rf WORK/*-core; TRACE_BUDGET_S=660 bash bench/issue22_check.sh trace $DETACHED_OUT/trace $F --no-compile; echo "trace rc=$? at ${SECONDS}s"'
bash bench/detached.sh start CHAIN_B 'export PYTHONPATH=SITE; WORK=WORK bash bench/issue22_check.sh reexport $DETACHED_OUT/reexport CARRY/before CARRY/after; echo "reexport rc=$? at ${SECONDS}s"; PYTHONPATH=SITE:$PWD:$PWD/tests timeout 400 python3 -m pytest -m gpu tests/test_linear.py tests/test_row_reduce.py -v -p no:cacheprovider -rs > $DETACHED_OUT/pytest-gpu.log 2>&1; echo "pytest rc=$? at ${SECONDS}s"; tail -5 $DETACHED_OUT/pytest-gpu.log'
sleep 5
bash CARRY/next_wait.sh ${1:-540}
