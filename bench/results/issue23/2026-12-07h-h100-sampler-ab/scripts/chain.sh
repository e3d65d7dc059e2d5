# The session's GPU chain, run detached from the tree's copy (bench/detached.sh).
# 0. The serving path on this host's CPU: the model thread spinning before it parks, A/B.
# 1. The sampler's thresholds at HEAD (GPU tests, bench), SmolLM2 with this tree.
# 2. The same from the tree before the thresholds' change (.carry/before: 6274284's file).
# 3. SmolLM2's decode step by kernel and by gap at this tree.
bash .carry/host.sh "$DETACHED_OUT/host"
bash bench/issue23_chain.sh sampler smol
BEFORE_FILES=.carry/before bash bench/issue23_chain.sh sampler-before smol-before
bash bench/issue23_chain.sh timeline
