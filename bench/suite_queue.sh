#!/usr/bin/env bash
# Runs suite stages one after another, each into its own folder OUT/NAME.
#
#   bench/suite_queue.sh OUT STAGE[:ARG] ...
#
# STAGE[:ARG] is `bench/suite_gpu.sh STAGE OUT/STAGE ARG` (ARG: the stage's GGUF,
# FLARE, DIR, ENGINE or FUSION; a stage that runs again goes to OUT/STAGE-2, -3...). `await:PATH` waits until PATH exists (at most AWAIT_S seconds,
# default 1200), for inputs that arrive while the queue runs. Every stage leaves
# OUT/NAME/stage.txt (exit status, start and end, seconds) once it has ended; a
# failed stage does not stop the queue, since later stages may not need it.
# OUT/queue.txt lists the stages as they end, and OUT/queue.done marks the end.
set -uo pipefail
usage="usage: bench/suite_queue.sh OUT STAGE[:ARG] ..."
out=${1:?$usage}
shift
[ $# -gt 0 ] || { echo "$usage" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
suite=$(cd "$(dirname "$0")" && pwd)/suite_gpu.sh
rm -f "$out/queue.done"
for item in "$@"; do
  stage=${item%%:*}
  arg=
  [ "$stage" = "$item" ] || arg=${item#*:}
  start=$(date +%s)
  if [ "$stage" = await ]; then
    name=await-$(basename "$arg")
    mkdir -p "$out/$name"
    status=1
    while [ $(($(date +%s) - start)) -lt "${AWAIT_S:-1200}" ]; do
      if [ -e "$arg" ]; then status=0; break; fi
      sleep 5
    done
  else
    name=$stage
    again=1
    while [ -e "$out/$name" ]; do again=$((again + 1)); name=$stage-$again; done
    mkdir -p "$out/$name"
    # shellcheck disable=SC2086 # an empty ARG passes nothing
    bash "$suite" "$stage" "$out/$name" $arg > "$out/$name/stage.log" 2>&1
    status=$?
  fi
  end=$(date +%s)
  printf 'stage %s\nstatus %s\nstart %s\nend %s\nseconds %s\n' "$item" "$status" \
    "$(date -u -d "@$start" +%FT%TZ)" "$(date -u -d "@$end" +%FT%TZ)" $((end - start)) \
    > "$out/$name/stage.txt"
  echo "$name status $status $((end - start)) s" >> "$out/queue.txt"
done
touch "$out/queue.done"
