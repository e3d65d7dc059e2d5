#!/usr/bin/env bash
# Issue 24's single-GPU checks on the GPU machine, run detached (bench/detached.sh),
# each PART of `bench/issue24_check.sh` in the order given (default: export tp-logits
# collectives), each step logged to steps.txt, results under DETACHED_OUT/issue24/PART:
#
#   bash bench/detached.sh start DIR "bash bench/issue24_chain.sh [PART...]"
#
# The flare binary for `export`'s `flare inspect`: $FLARE, else .carry/flare.xz unpacked
# to BIN/flare. The carried wheels: bench/chain_env.sh's. Each part is bounded (600 s).
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT/issue24
mkdir -p "$out"
if [ -z "${FLARE:-}" ] && [ -e .carry/flare.xz ]; then
  mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
  export FLARE=$PWD/BIN/flare
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(export tp-logits collectives)
for part in "${parts[@]}"; do
  WORK=${WORK24:-/tmp/w24} timeout 600 bash bench/issue24_check.sh "$part" "$out/$part" \
    > "$out/$part.log" 2>&1
  step "issue24-$part" $?
done
echo chain done
