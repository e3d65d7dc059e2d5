# sourced by the device wrappers: install carried wheels, set env, sanitize helper
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .carry/wheels/*.whl > /tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
chmod +x .carry/flare 2>/dev/null
sanitize() {  # DIR
  grep -rIl . "$1" 2>/dev/null | while read -r f; do
    sed -i -e "s#$PWD#REPO#g" -e 's#/opt/torch/.venv#TORCH_ENV#g' -e 's#/dev/shm/w#WORK#g' \
      -e 's#/tmp/site#SITE#g' -e "s#$OUT#OUT#g" -e 's#/tmp/o[A-Za-z]*#RESULTS#g' "$f"
  done
}
pack() {  # DIR NAME
  sanitize "$1"
  tar -C "$(dirname "$1")" -czf "$OUT/$2.tgz" "$(basename "$1")"
}
