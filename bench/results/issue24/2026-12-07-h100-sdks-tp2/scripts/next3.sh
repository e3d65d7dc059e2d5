pid=$(pgrep -f "issue23_chain.sh concurrency" | head -1)
if [ -n "$pid" ]; then sid=$(ps -o sid= -p $pid | tr -d ' '); pkill -9 -s $sid; fi
pkill -9 -f "flare run"; sleep 1
mkdir -p $OUT/c && tar -czf $OUT/c/detached.tar.gz -C DETACHED out log
mkdir -p $OUT/s && export DETACHED_OUT=$OUT/s && . bench/chain_env.sh
mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
export FLARE=$PWD/BIN/flare
WORK=WORK timeout 200 bash bench/issue24_check.sh serve $OUT/s/issue24/serve > $OUT/s/serve.log 2>&1; echo "issue24-serve rc=$?" | tee -a $OUT/s/steps.txt
tail -15 $OUT/s/serve.log | cut -c1-400
