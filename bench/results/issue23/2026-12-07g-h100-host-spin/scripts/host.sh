# The serving path on this host's CPU (no GPU): the fake server with the model thread
# spinning up to 50 ms before it parks (FLARE_IDLE_SPIN_US, an uncommitted patch:
# idle-spin.patch) against the same binary parking at once, the client pausing 20 ms
# before each request.
out=$1
mkdir -p "$out" BIN
export DETACHED_OUT=$out && . bench/chain_env.sh || exit 1
export PYTHONPATH=$PYTHONPATH:$PWD:$PWD/tests
python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .carry/fake_server.xz BIN/fake_server && chmod +x BIN/fake_server
core=$PWD/helios/tests/fixtures/tiny-core
printf '#!/bin/sh\nexec %s/BIN/fake_server --core %s "$@"\n' "$PWD" "$core" > BIN/fake_park
printf '#!/bin/sh\nFLARE_IDLE_SPIN_US=50000 exec %s/BIN/fake_server --core %s "$@"\n' "$PWD" "$core" > BIN/fake_spin
chmod +x BIN/fake_park BIN/fake_spin
nproc > "$out/nproc.txt"
timeout 240 python3 bench/http_overhead.py --binary BIN/fake_spin --baseline BIN/fake_park --tool-chats \
  --requests 100 --rounds 3 --pause-ms 20 --out "$out/spin-pause20.json" > "$out/spin-pause20.log" 2>&1
echo "host spin rc=$?" >> "$out/steps.txt"
