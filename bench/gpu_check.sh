#!/usr/bin/env bash
# One whole GPU check in one call: environment, the GPU tests, and the dense-recipe
# acceptance (bench/gpu_acceptance.py). Results go to OUT_DIR.
#
#   bench/gpu_check.sh OUT_DIR MODEL_GGUF [WHEEL_DIR]
#
# WHEEL_DIR: optional wheels to install first (the GPU machine has no registry and no
# cargo): `gguf`, and the flare_heliopause wheel built with
# `maturin build --release -m heliopause/Cargo.toml -o WHEEL_DIR`.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR MODEL_GGUF [WHEEL_DIR]}
model=${2:?usage: bench/gpu_check.sh OUT_DIR MODEL_GGUF [WHEEL_DIR]}
wheels=${3:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/flare-site "$wheels"/*.whl || exit 1
  export PYTHONPATH=/tmp/flare-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/flare-triton TORCHINDUCTOR_CACHE_DIR=/tmp/flare-inductor
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
  python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)'
  git log -1 --format='commit %H' 2>/dev/null
} > "$out/environment.txt" 2>&1
# test_http_clients.py has no GPU test and imports the openai and anthropic clients,
# which the GPU machine lacks.
python3 -m pytest -m gpu tests -q -p no:cacheprovider --ignore=tests/test_http_clients.py \
  2>&1 | tee "$out/pytest-gpu.log"
python3 bench/gpu_acceptance.py --model "$model" --out "$out" 2>&1 | tee "$out/acceptance.log"
