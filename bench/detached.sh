#!/usr/bin/env bash
# A check longer than one call on the GPU machine (a call is bounded at ten minutes; the
# machine stays up while calls follow each other): `start` copies the tree (without .git,
# target/ or .venv/) to DIR/src, so later calls may change their own copy, and runs
# COMMAND there with bash in a new process session, which outlives the call that started
# it. Its output goes to DIR/log, its exit status to DIR/rc, and DETACHED_OUT names
# DIR/out, the folder for its results. `wait` waits at most SECONDS for it to end, then
# packs DIR/out and the log into OUT/detached.tar.gz, so that every call brings back
# what is there so far.
#
#   bench/detached.sh start DIR COMMAND
#   bench/detached.sh wait DIR SECONDS OUT
#
# wait's exit status: COMMAND's when it has ended, 3 while it still runs, 4 when DIR
# holds no started command.
set -uo pipefail
usage="usage: bench/detached.sh start DIR COMMAND | wait DIR SECONDS OUT"
verb=${1:?$usage}
dir=${2:?$usage}
case $verb in
  start)
    command=${3:?$usage}
    [ -e "$dir/started" ] && { echo "detached.sh: $dir already holds a started command" >&2; exit 2; }
    mkdir -p "$dir/src" "$dir/out"
    dir=$(cd "$dir" && pwd)
    cd "$(dirname "$0")/.."
    # -h: carried folders may arrive as links; a link copied as a link can dangle there.
    tar -h --exclude=./.git --exclude=./target --exclude=./.venv -cf - . | tar -xf - -C "$dir/src" || exit 2
    echo "$command" > "$dir/started"
    # setsid: a new session, so the call's end does not end it.
    # A subshell, so that an `exit` in COMMAND still leaves the status written.
    DETACHED_OUT=$dir/out setsid bash -c "cd '$dir/src' && ( $command ) > '$dir/log' 2>&1; \
echo \$? > '$dir/rc'" < /dev/null > /dev/null 2>&1 &
    echo "started in $dir: $command"
    ;;
  wait)
    seconds=${3:?$usage}
    out=${4:?$usage}
    [ -e "$dir/started" ] || { echo "detached.sh: nothing started in $dir" >&2; exit 4; }
    deadline=$((SECONDS + seconds))
    while [ ! -e "$dir/rc" ] && [ $SECONDS -lt $deadline ]; do
      sleep 2
    done
    mkdir -p "$out"
    tar -czf "$out/detached.tar.gz" -C "$dir" out log 2> /dev/null
    tail -25 "$dir/log"
    if [ -e "$dir/rc" ]; then
      echo "detached.sh: ended with status $(cat "$dir/rc")"
      exit "$(cat "$dir/rc")"
    fi
    echo "detached.sh: still running after ${seconds} s"
    exit 3
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
