# The session's GPU chain, run detached from the tree's copy (bench/detached.sh).
# 1. The new launches' GPU tests. If they fail, the previous versions of the changed
#    files (.carry/before) are laid over this copy for the rest of the chain.
bash bench/issue23_chain.sh maintenance
if grep -q '^maintenance-gpu rc=0' "$DETACHED_OUT/steps.txt"; then
  # 2. SmolLM2: the tree (tools, agent, decode; the floor), then the tree before the
  #    change (tools, decode): the A/B in one run on one card.
  BEFORE_FILES=.carry/before bash bench/issue23_chain.sh smol smol-before
else
  cp -r .carry/before/. . && echo "maintenance failed: the chain goes on with .carry/before's files" > "$DETACHED_OUT/fallback.txt"
  bash bench/issue23_chain.sh smol
fi
# 3. Issue 24: the TP2 core on one GPU, served and driven by the SDKs.
bash bench/issue24_chain.sh export serve
# 4. Prepared concurrency options for SmolLM2.
CONCURRENCY_OPTIONS='32 16 8' bash bench/issue23_chain.sh concurrency
