#!/usr/bin/env bash
set -uo pipefail
. CARRY/common.sh
o=/tmp/oL; mkdir -p $o /dev/shm/w
rm -rf /dev/shm/w/*-core
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)'; } > $o/machine.txt 2>&1
WORK=/dev/shm/w timeout 380 bash bench/issue22_check.sh timeline $o --compile-scope layer --prompt-tokens 128 --prefill-chunk-size 128 > $o/check-timeline.log 2>&1
echo "timeline rc=$? at ${SECONDS}s" | tee -a $o/check-timeline.log
tail -6 $o/check-timeline.log
GEOMETRY=qwen4-exp-h200 WORK=/dev/shm/w timeout $((575 - SECONDS)) bash bench/issue22_check.sh transformers $o > $o/check-transformers.log 2>&1
echo "transformers rc=$? at ${SECONDS}s" | tee -a $o/check-transformers.log
tail -8 $o/check-transformers.log
pack $o timeline
