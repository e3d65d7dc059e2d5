d=DETACHED; [ -e $d/started ] || bash bench/detached.sh start $d "bash bench/issue23_chain.sh 8b"; bash bench/detached.sh wait $d 420 $OUT/a
