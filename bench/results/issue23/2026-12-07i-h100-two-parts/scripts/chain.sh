# This session's GPU chain (bench/detached.sh runs it from the tree's copy), lean for a
# short budget. The tree has FLASH_CHUNK_TOKENS switched on (2048) in
# ignition/components/triton_attention.py; .carry/before holds 327b2c4's file (off).
# 1. the two parts' GPU tests and bench/prefill_two_parts_bench.py (no weights needed);
# 2. 8b with the two parts: export, qualification, cold TTFT 512/4096;
# 3. prefill (the 4K chunk's timelines), then 8b-before (the one kernel), if time is left.
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT
mkdir -p "$out/lean"
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
timeout 240 python3 -m pytest -m gpu tests/test_prefill_flash.py -q -p no:cacheprovider -rsP \
  > "$out/lean/pytest-gpu.log" 2>&1
step lean-pytest $?
timeout 240 python3 -m bench.prefill_two_parts_bench --out "$out/lean/two-parts.json" \
  > "$out/lean/two-parts.log" 2>&1
step lean-bench $?
bash bench/issue23_chain.sh 8b prefill
BEFORE_FILES=.carry/before bash bench/issue23_chain.sh 8b-before
