# The sampler's thresholds after the change, the GPU tests, then before it (.carry/before).
mkdir -p $OUT/env $OUT/after $OUT/before
export DETACHED_OUT=$OUT/env && . bench/chain_env.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
timeout 170 python3 bench/sampler_bench.py --out $OUT/after/sampler.json > $OUT/after.log 2>&1; step after $?
timeout 70 python3 -m pytest -m gpu tests/test_sampling_thresholds.py -q -p no:cacheprovider -rs > $OUT/pytest-gpu.log 2>&1; step gpu-tests $?
tail -2 $OUT/pytest-gpu.log
b=BEFORE_TREE && mkdir -p $b && tar --exclude=./.carry -cf - . | tar -xf - -C $b && cp -r .carry/before/. $b/
(cd $b && PYTHONPATH=$SITE:$b:$b/tests timeout 120 python3 bench/sampler_bench.py --out $OUT/before/sampler.json > $OUT/before.log 2>&1); step before $?
