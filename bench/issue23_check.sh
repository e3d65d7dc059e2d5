#!/usr/bin/env bash
# Issue 23's checks on the GPU machine, in parts that each fit one call. Results go
# to OUT.
#
#   bench/issue23_check.sh serving OUT
#       the in-process serving GPU tests (tests/test_serving.py: answers against the
#       Python harness, prefix hits, shutdown with snapshots in flight, and message
#       checkpoints captured after the one chunk holding them on a positional-KV
#       core, sampled by the resume graph) and the maintenance graphs' GPU tests
#       (tests/test_prefix_operations.py, the interior-endpoint capture included).
#
# Needs the flare_heliopause wheel importable (WHEELS, as bench/suite_gpu.sh installs
# them).
set -uo pipefail
usage="usage: bench/issue23_check.sh serving OUT"
part=${1:?$usage}
out=${2:?$usage}
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
status=0

case $part in
  serving)
    python3 -m pytest -m gpu tests/test_serving.py tests/test_prefix_operations.py -q \
      -p no:cacheprovider -rs 2>&1 | tee "$out/pytest-gpu.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
exit $status
