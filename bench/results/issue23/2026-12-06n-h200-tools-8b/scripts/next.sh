d=DETACHED
if [ ! -e $d/started ]; then
  mkdir -p $OUT/c24 && ( export DETACHED_OUT=$OUT/c24; . bench/chain_env.sh && WORK=WORK timeout 280 bash bench/issue24_check.sh collectives $OUT/c24 > $OUT/c24/check.log 2>&1; echo "rc=$?" >> $OUT/c24/check.log )
  tail -5 $OUT/c24/check.log
  bash bench/detached.sh start $d "bash bench/issue23_chain.sh smol serving prefill"
fi
bash bench/detached.sh wait $d ${1:-560} $OUT/a
