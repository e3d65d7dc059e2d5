# Sourced by the GPU checks: `flare_run FLARE CORE LOG [flare run options]` starts
# `FLARE run CORE --port 0` in the background with its output in LOG and waits (at
# most FLARE_START_S seconds, a minute unless set: a large core takes longer to load)
# for its "serving on" line; it sets $pid and $url, or prints the log and returns 1
# when flare exits or never binds.
flare_run() {
  local flare=$1 core=$2 log=$3
  shift 3
  "$flare" run "$core" --port 0 "$@" > "$log" 2>&1 &
  pid=$!
  url=""
  for _ in $(seq $((${FLARE_START_S:-60} * 10))); do
    url=$(grep -o 'serving on http://[^ ]*' "$log" | head -1 | cut -d' ' -f3)
    [ -n "$url" ] && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "flare run did not start"
    cat "$log"
    kill $pid 2> /dev/null
    return 1
  fi
}
