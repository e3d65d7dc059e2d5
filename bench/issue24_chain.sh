#!/usr/bin/env bash
# Issue 24's single-GPU checks on the GPU machine, run detached (bench/detached.sh),
# each PART of `bench/issue24_check.sh` in the order given (default: helios-gpu
# collectives export serve agent tp-logits), each step logged to steps.txt, results under
# DETACHED_OUT/issue24/PART. One PART of its own, helios-gpu: Helios's loader GPU tests
# (`cargo test --release -p flare-helios --test gpu_replay --no-run`'s binary, stripped
# and carried as .carry/gpu_replay.xz: no cargo there) with --ignored, among them a
# two-rank core on this GPU checked in lockstep:
#
#   bash bench/detached.sh start DIR "bash bench/issue24_chain.sh [PART...]"
#
# With MODEL=tiny-hybrid (bench/issue24_check.sh's), results under
# DETACHED_OUT/issue24-tiny-hybrid/PART.
#
# The flare binary for `export`'s `flare inspect`: $FLARE, else .carry/flare.xz unpacked
# to BIN/flare. The carried wheels: bench/chain_env.sh's. Each part is bounded (600 s).
set -uo pipefail
. bench/chain_env.sh || exit 1
out=$DETACHED_OUT/issue24${MODEL:+-$MODEL}
mkdir -p "$out"
if [ -z "${FLARE:-}" ] && [ -e .carry/flare.xz ]; then
  mkdir -p BIN && python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/flare.xz BIN/flare && chmod +x BIN/flare
  export FLARE=$PWD/BIN/flare
fi
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(helios-gpu collectives export serve agent tp-logits)
for part in "${parts[@]}"; do
  if [ "$part" = helios-gpu ]; then
    mkdir -p "$out/helios-gpu" BIN
    python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      .carry/gpu_replay.xz BIN/gpu_replay && chmod +x BIN/gpu_replay \
      && timeout 300 BIN/gpu_replay --ignored --test-threads=1 > "$out/helios-gpu/gpu-replay.log" 2>&1
    step issue24-helios-gpu $?
    continue
  fi
  WORK=${WORK24:-/tmp/w24} timeout 600 bash bench/issue24_check.sh "$part" "$out/$part" \
    > "$out/$part.log" 2>&1
  step "issue24-$part" $?
done
echo chain done
