#!/usr/bin/env bash
# eager re-export from one path (the trees take turns at /tmp/T): before, now, again
set -uo pipefail
. CARRY/common.sh
o=/tmp/oR4; mkdir -p $o; d=/tmp/flare-issue22/smollm2-135m-safetensors; T=/tmp/T; c=/tmp/cores
rm -rf $c; mkdir -p $c
[ -f $d/model.safetensors.index.json ] || python3 -m ignition.loading.random_weights --geometry smollm2-135m --out $d --safetensors > /dev/null
one() {  # TREE NAME [options]
  local tree=$1 name=$2; shift 2
  rm -rf $T; cp -r $tree $T
  (cd $T && PYTHONPATH=$T:$PYTHONPATH timeout 150 python3 -m ignition.cli prepare $d --out $c/$name \
    --max-concurrency 4 --context-limit 8192 "$@") > $o/export-$name.log 2>&1
  echo "export $name rc=$? at ${SECONDS}s" | tee -a $o/times.txt
}
one CARRY/before before-eager --no-compile
one CARRY/after now-eager --no-compile
one CARRY/after again-eager --no-compile
python3 bench/core_diff.py $c/before-eager $c/now-eager --out $o/before-now-eager.json 2>/dev/null; echo "before-now rc=$?" | tee -a $o/times.txt
python3 bench/core_diff.py $c/now-eager $c/again-eager --out $o/now-again-eager.json 2>/dev/null; echo "now-again rc=$?" | tee -a $o/times.txt
python3 -c "
import json,sys
for f in sys.argv[1:]:
    d=json.load(open(f)); print(f.split('/')[-1], 'identical', d['identical'], 'buffers', d['buffers_identical'], 'images only', len(d['images_only_in_a']), len(d['images_only_in_b']), 'fields', d['manifest_fields_differing'][:4])
    for g in d['graph_differences'][:2]: print(json.dumps(g)[:1800])
" $o/before-now-eager.json $o/now-again-eager.json
pack $o reexport4
