# The session's GPU chain, run detached from the tree's copy (bench/detached.sh).
# 1. SmolLM2 with this tree (tools, agent, decode; the floor).
# 2. The sampler's thresholds: GPU tests and bench, then the bench from the tree before
#    the change (.carry/before), then SmolLM2's tools and decode from that tree.
# 3. Prepared concurrency options 16 and 8 for SmolLM2.
bash bench/issue23_chain.sh smol
BEFORE_FILES=.carry/before bash bench/issue23_chain.sh sampler sampler-before smol-before
CONCURRENCY_OPTIONS='16 8' bash bench/issue23_chain.sh concurrency
