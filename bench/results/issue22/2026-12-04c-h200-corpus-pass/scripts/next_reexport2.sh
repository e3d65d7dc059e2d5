#!/usr/bin/env bash
# reexport without the control export (again): before and now, then core_diff
set -uo pipefail
. CARRY/common.sh
o=/tmp/oR2; mkdir -p $o/reexport
a=$PWD/CARRY/after b=$PWD/CARRY/before w=/tmp/flare-issue22/reexport
d=/tmp/flare-issue22/smollm2-135m-safetensors
python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $d --safetensors > /dev/null || exit 1
for t in before now; do
  tree=$b; [ $t = now ] && tree=$a
  s=$SECONDS
  (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout $((560 - SECONDS)) python3 -m ignition.cli prepare $d \
    --out $w/$t --max-concurrency 4 --context-limit 8192) > $o/reexport/export-$t.log 2>&1
  echo "export $t rc=$? in $((SECONDS - s))s" | tee -a $o/times.txt
done
(cd $a && PYTHONPATH=$a:$PYTHONPATH python3 bench/core_diff.py $w/before $w/now --out $o/reexport/before-now.json) > $o/reexport/diff.log 2>&1
echo "diff rc=$? at ${SECONDS}s" | tee -a $o/times.txt
tail -20 $o/reexport/diff.log
pack $o reexport2
