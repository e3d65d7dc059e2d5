# Sourced by the GPU checks: `replay_check FLARE CORE OUT [CAPACITY...]` runs
# `FLARE replay CORE --check` (Helios's rebuilt graphs replayed bitwise against the
# Python replay recorded at export) into OUT/replay-check.{json,log}, then the native
# decode step at each CAPACITY (default 1 and 4) into OUT/bench-decode-cN.{json,log},
# printing each summary; it returns 1 when any of them failed.
replay_check() {
  local flare=$1 core=$2 out=$3 failed=0 capacity
  shift 3
  local capacities=("$@")
  [ ${#capacities[@]} -gt 0 ] || capacities=(1 4)
  "$flare" replay "$core" --check --json "$out/replay-check.json" > "$out/replay-check.log" 2>&1 \
    || failed=1
  tail -3 "$out/replay-check.log"
  for capacity in "${capacities[@]}"; do
    "$flare" replay "$core" --bench-decode "$capacity" --json "$out/bench-decode-c$capacity.json" \
      > "$out/bench-decode-c$capacity.log" 2>&1 || failed=1
    grep -A3 "decode bench" "$out/bench-decode-c$capacity.log"
  done
  return $failed
}
