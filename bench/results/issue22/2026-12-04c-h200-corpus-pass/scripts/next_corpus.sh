#!/usr/bin/env bash
set -uo pipefail
. CARRY/common.sh
o=/tmp/oC; mkdir -p $o /dev/shm/w
export FLARE_START_S=300
GEOMETRY=qwen4-exp-h200 WORK=/dev/shm/w timeout 575 bash bench/issue22_check.sh corpus $o $PWD/CARRY/flare --no-compile > $o/check.log 2>&1
echo "corpus rc=$? at ${SECONDS}s" | tee -a $o/check.log
tail -40 $o/check.log
grep -h "write_s\|load\|seconds" $o/export.log 2>/dev/null | tail -5
pack $o corpus
