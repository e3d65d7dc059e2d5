#!/usr/bin/env bash
# Downloads, on a machine with a package registry, the wheels `transformers serve`
# (the continuous-batching baseline) needs beyond what the GPU machine has (torch,
# transformers and their own dependencies), for its Python (3.12, x86-64 Linux), into
# DIR: `WHEELS=DIR bench/suite_gpu.sh ...` installs them there (no registry needed).
#
#   bench/baseline_wheels.sh DIR
set -euo pipefail
dir=${1:?usage: bench/baseline_wheels.sh DIR}
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$dir" \
  openai anyio distro httpx2 httpcore2 jiter sniffio pydantic pydantic-core annotated-types \
  typing-inspection typing-extensions h11 idna certifi truststore \
  fastapi starlette annotated-doc uvicorn click rich markdown-it-py mdurl pygments \
  accelerate psutil opentelemetry-api importlib-metadata zipp
ls -l "$dir"
