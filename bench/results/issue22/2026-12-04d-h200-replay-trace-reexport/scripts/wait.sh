#!/usr/bin/env bash
# wait on both chains for at most SECONDS in total, bring back what each has
set -uo pipefail
total=${1:-560}
start=$SECONDS
if [ ! -e CHAIN_B/rc ]; then bash bench/detached.sh wait CHAIN_B $((total - 10)) $OUT/b; else bash bench/detached.sh wait CHAIN_B 1 $OUT/b; fi
echo "---- A"
bash bench/detached.sh wait CHAIN_A $((total - (SECONDS - start))) $OUT/a
echo "---- B"; tail -4 CHAIN_B/log
nvidia-smi --query-gpu=memory.used --format=csv; df -h /dev/shm /tmp | tail -2; free -g | head -2
