#!/usr/bin/env bash
# The start every detached chain on the GPU machine shares (bench/detached.sh runs the
# chain with DETACHED_OUT set to its results folder). Sourced, from the tree's root:
#
#   . bench/chain_env.sh
#
# - installs the wheels of $CHAIN_WHEELS (default .carry/wheels; none there: nothing) into
#   SITE (default /tmp/site), every time (a later call may carry a rebuilt wheel), and
#   returns 1 with what it saw in DETACHED_OUT/install.log if a wheel's
#   NAME-VERSION.dist-info is not there afterwards;
# - exports PYTHONPATH (SITE), PATH (SITE/bin first), WORK (default /tmp/w23) and the
#   compile caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR), unbuffered Python;
# - writes the GPU (nvidia-smi) to DETACHED_OUT/machine.txt;
# - defines `step NAME RC`, which appends "NAME rc=RC at Ns" (seconds since sourcing)
#   to DETACHED_OUT/steps.txt and prints it.
# A failed install returns 1 from the sourcing, with the log in DETACHED_OUT/install.log.
: "${DETACHED_OUT:?bench/chain_env.sh is sourced by a chain that bench/detached.sh runs}"
# Not a positional argument: a file sourced without one sees its caller's, and a chain
# called with its parts once looked for wheels in a folder named after the first part.
chain_wheels=${CHAIN_WHEELS:-.carry/wheels}
export SITE=${SITE:-/tmp/site}
shopt -s nullglob
chain_wheel_files=("$chain_wheels"/*.whl)
shopt -u nullglob
if [ ${#chain_wheel_files[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${chain_wheel_files[@]}" > "$DETACHED_OUT/install.log" 2>&1 \
    || { echo "chain_env: installing $chain_wheels failed (install.log)" >&2; return 1; }
  # Every carried wheel must have landed: once, a chain went on without one (its
  # install printed nothing) and each step that needed it failed minutes later.
  chain_missing=()
  for chain_wheel in "${chain_wheel_files[@]}"; do
    chain_dist=$(basename "$chain_wheel" | cut -d- -f1-2)
    [ -d "$SITE/$chain_dist.dist-info" ] || chain_missing+=("$chain_dist")
  done
  if [ ${#chain_missing[@]} -gt 0 ]; then
    { echo "missing from $SITE: ${chain_missing[*]}"; python3 -VV; python3 -m pip --version
      ls -la "$SITE" "$chain_wheels"; env | grep -i '^pip\|^python'; } >> "$DETACHED_OUT/install.log" 2>&1
    echo "chain_env: ${chain_missing[*]} not installed into $SITE (install.log)" >&2
    return 1
  fi
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
export WORK=${WORK:-/tmp/w23} PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
mkdir -p "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv \
  > "$DETACHED_OUT/machine.txt" 2>&1
chain_started=$SECONDS
step() {
  echo "$1 rc=$2 at $((SECONDS - chain_started))s" | tee -a "$DETACHED_OUT/steps.txt"
}
