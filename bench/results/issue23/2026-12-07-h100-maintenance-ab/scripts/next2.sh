d=DETACHED
for i in $(seq 1 210); do grep -q '^issue24-serve' $d/out/steps.txt 2>/dev/null && break; [ -e $d/rc ] && break; sleep 2; done
cat $d/out/steps.txt
pid=$(pgrep -f "bash .carry/chain.sh" | head -1)
if [ -n "$pid" ]; then sid=$(ps -o sid= -p $pid | tr -d ' '); pkill -9 -s $sid; fi
pkill -9 -f "flare run"; sleep 2
echo "chain stopped after issue24 for the before flare stage" > $d/out/stopped.txt
src=$d/src
( export DETACHED_OUT=$d/out; cd $src && . bench/chain_env.sh
  cd WORK/before-src && export PYTHONPATH=$SITE:$PWD:$PWD/tests WORK=WORK/before \
    SUITE_ARGS="--workloads tools decode --decode-rounds 10 --tool-conversations 32"
  timeout 300 bash bench/suite_gpu.sh smollm2-flare $d/out/smol-before $src/BIN/flare > $d/out/smol-before-flare.log 2>&1
  echo "smol-before-flare rc=$?" | tee -a $d/out/steps.txt )
mkdir -p $OUT/a && tar -czf $OUT/a/detached.tar.gz -C $d out log
tail -5 $d/out/smol-before-flare.log
bash bench/detached.sh start DETACHED "CONCURRENCY_OPTIONS='32 16 8' bash bench/issue23_chain.sh concurrency"
