#!/usr/bin/env bash
set -uo pipefail
. CARRY/common.sh
o=/tmp/oR; mkdir -p $o /dev/shm/w
rm -rf /dev/shm/w/*-core
timeout 260 bash bench/issue22_check.sh reexport $o/reexport $PWD/CARRY/before $PWD/CARRY/after > $o/check-reexport.log 2>&1
echo "reexport rc=$? at ${SECONDS}s" | tee -a $o/check-reexport.log
tail -12 $o/check-reexport.log
timeout 60 python3 -m pytest -m gpu tests/test_row_reduce.py -v -p no:cacheprovider -rs > $o/pytest-row-reduce.log 2>&1
echo "pytest rc=$? at ${SECONDS}s" | tee -a $o/pytest-row-reduce.log
tail -4 $o/pytest-row-reduce.log
timeout $((380 - SECONDS)) python3 bench/rows_linear_bench.py --many-rows --out $o/rows-many.json > $o/rows-many.log 2>&1
echo "bench rc=$? at ${SECONDS}s" | tee -a $o/rows-many.log
tail -30 $o/rows-many.log
pack $o reexport
