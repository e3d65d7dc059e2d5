d=DETACHED
[ -e $d/started ] || bash bench/detached.sh start $d "bash bench/issue24_chain.sh helios-gpu; MODEL=tiny-hybrid WORK24=WORK bash bench/issue24_chain.sh export serve agent tp-logits; bash bench/issue24_chain.sh export serve; CONCURRENCY_OPTIONS='32 16 8' bash bench/issue23_chain.sh concurrency"
bash bench/detached.sh wait $d ${1:-560} $OUT/a
rm -f $OUT/a/detached.tar.gz
tar -czf $OUT/r.tar.gz -C $d --exclude='*/core' --exclude='*/ranks' out log
