# The fourth call, as run (the third, next3.sh, looked for the core beside its own
# output folder and found none): the serve part again, with the cryptography,
# cffi and pycparser wheels added to .carry/wheels, over the core the chain's export
# part had written on the same warm machine.
export DETACHED_OUT=$OUT && . bench/chain_env.sh && mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare && export FLARE=$PWD/BIN/flare; ls DETACHED/out/issue24/export | head; WORK=WORK timeout 200 bash bench/issue24_check.sh serve DETACHED/out/issue24/serve-sdks > $OUT/serve.log 2>&1; echo "issue24-serve rc=$?" | tee -a $OUT/steps.txt; tar -czf $OUT/serve-sdks.tar.gz -C DETACHED/out/issue24 serve-sdks; tail -12 $OUT/serve.log | cut -c1-400
