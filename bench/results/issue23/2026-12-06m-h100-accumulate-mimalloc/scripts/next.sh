ls -la . | grep carry; find .carry -maxdepth 2 -type l | head -3; df -h /dev/shm | tail -1; ls /dev/shm | head -5
d=DETACHED; [ -e $d/started ] || SMOL_SUITE_ARGS="--workloads tools agent" bash bench/detached.sh start $d "bash bench/issue23_chain.sh 8b smol"; ls $d/src/.carry/wheels | wc -l; bash bench/detached.sh wait $d ${1:-560} $OUT/a
