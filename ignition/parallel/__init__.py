"""Tensor parallelism in preparation: a rank's shard of a model and its collectives.

``shard.TensorParallel`` names this process's rank of a group and carries the
collectives its model calls (``collectives``); a recipe builds the rank's shard of its
model from it (column-parallel projections, KV heads, a vocabulary shard whose logits
are gathered, replicated norms and embeddings, row-parallel projections whose partial
sums are all-reduced). ``launch`` runs one Python process per rank with a Gloo
coordinator; ``logits_check`` compares a group's teacher-forced logits with one
rank's.
"""
