d=DETACHED
[ -e $d/started ] || bash bench/detached.sh start $d "bash .carry/chainJ.sh"
bash bench/detached.sh wait $d ${1:-560} $OUT/a
