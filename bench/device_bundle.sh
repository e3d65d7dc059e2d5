#!/usr/bin/env bash
# Builds, on a machine with cargo and a package registry, what the GPU machine (no
# registry, no cargo, Python 3.12) needs beyond its torch, triton and transformers:
# the stripped release `flare` binary, the stripped flare_heliopause wheel, and the
# wheels of fla-core 0.6.0 (the hybrid's GDN kernels), einops, gguf, the openai and
# anthropic clients with their httpx2 stack (bench/serve_clients.py, the suite) and the
# OpenAI Agents SDK with what it imports (mcp and its server stack, cryptography among it;
# bench/sdk_agreement.py). The binary goes compressed (DIR/flare.xz, 3 MB against 10):
# about 25 MB in all.
# Carry DIR with a device call, then on the GPU machine
#   python3 -m pip install --no-index --no-deps --target SITE DIR/wheels/*.whl
#   export PYTHONPATH=SITE:$PWD:$PWD/tests
# and unpack DIR/flare.xz (python3's lzma; bench/issue23_chain.sh does it for
# .carry) and pass it as FLARE.
#
#   bench/device_bundle.sh DIR
set -euo pipefail
dir=${1:?usage: bench/device_bundle.sh DIR}
cd "$(dirname "$0")/.."
mkdir -p "$dir/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$dir/wheels" \
  fla-core==0.6.0 einops gguf openai==3.57.0 anthropic==2.14.0 anyio distro httpx2 httpcore2 jiter sniffio \
  pydantic pydantic-core annotated-types typing-inspection typing-extensions h11 idna \
  certifi truststore docstring-parser opentelemetry-api importlib-metadata zipp \
  openai-agents==0.24.0 griffelib mcp mcp-types jsonschema jsonschema-specifications referencing \
  rpds-py pyjwt python-multipart sse-starlette starlette uvicorn websockets cryptography cffi pycparser
cargo build --release -p flare
cp target/release/flare "$dir/flare"
strip "$dir/flare"
python3 -c "import lzma,shutil,sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb', preset=9))" "$dir/flare" "$dir/flare.xz"
rm "$dir/flare"
maturin build --release --strip -m heliopause/Cargo.toml -o "$dir/wheels"
du -sh "$dir"
