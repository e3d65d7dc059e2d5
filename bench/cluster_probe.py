"""Which launch attributes do captured cuBLAS kernels depend on? (H200 diagnostic)

Captures bf16 linear layers of several shapes into one CUDA graph and prints, for
every kernel node: its name and launch shape, the cluster dimension and scheduling
policy the node attribute holds (as the union's bytes, and as the binding's member
accessors read them), and the cluster attributes of its function
(``REQUIRED_CLUSTER_*``, ``CLUSTER_SIZE_MUST_BE_SET``, scheduling preference,
non-portable size). A kernel that executes cluster instructions but whose node
reports no cluster shows where the export loses the cluster shape.

    python3 bench/cluster_probe.py [--hidden 64] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ignition.export.graph_walk import (
    ATTRIBUTE_CLUSTER_DIMENSION,
    ATTRIBUTE_CLUSTER_SCHEDULING_POLICY,
    _attribute_words,
    _call,
    _driver,
    _function_handle,
    _function_name,
    _graph_nodes,
    _node_attribute,
    _node_type_name,
)

FUNCTION_ATTRIBUTES = (
    "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH",
    "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT",
    "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH",
    "CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET",
    "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED",
    "CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE",
    "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES",
)


def _function_attributes(cu: Any, func: int) -> dict[str, int | str]:
    values: dict[str, int | str] = {}
    for name in FUNCTION_ATTRIBUTES:
        attribute = getattr(cu.CUfunction_attribute, name, None)
        if attribute is None:
            values[name] = "unknown to the binding"
            continue
        err, value = cu.cuFuncGetAttribute(attribute, cu.CUfunction(func))
        values[name] = int(value) if err == cu.CUresult.CUDA_SUCCESS else f"error {err}"
    return values


def probe(hidden: int) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    device = torch.device("cuda")
    shapes = [(m, hidden, n) for m in (1, 2, 4, 128, 512) for n in (hidden, 2 * hidden, 512)]
    weights = {(k, n): torch.randn(n, k, device=device, dtype=torch.bfloat16) for _, k, n in shapes}
    inputs = {(m, k): torch.randn(m, k, device=device, dtype=torch.bfloat16) for m, k, _ in shapes}
    outputs = []

    def step() -> None:
        outputs.clear()
        for m, k, n in shapes:
            outputs.append(torch.nn.functional.linear(inputs[(m, k)], weights[(k, n)]))

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        step()
    cu = _driver("probe")
    raw = graph.raw_cuda_graph()
    rows = []
    for index, node in enumerate(_graph_nodes(cu, cu.CUgraph(raw), "probe")):
        if not _node_type_name(cu, node, "probe", index).endswith("KERNEL"):
            continue
        where = f"node {index}"
        (params,) = _call(cu, cu.cuGraphKernelNodeGetParams(node), "GetParams", where)
        func = _function_handle(cu, params, where)
        cluster = _node_attribute(cu, node, ATTRIBUTE_CLUSTER_DIMENSION, where).clusterDim
        policy = _node_attribute(cu, node, ATTRIBUTE_CLUSTER_SCHEDULING_POLICY, where)
        rows.append(
            {
                "index": index,
                "function": _function_name(cu, func, where),
                "grid": [int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ)],
                "block": [int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ)],
                "node_cluster_bytes": list(
                    _attribute_words(cu, node, ATTRIBUTE_CLUSTER_DIMENSION, 3, where)
                ),
                "node_cluster_binding": [int(cluster.x), int(cluster.y), int(cluster.z)],
                "node_policy_bytes": _attribute_words(
                    cu, node, ATTRIBUTE_CLUSTER_SCHEDULING_POLICY, 1, where
                )[0],
                "node_policy_binding": int(policy.clusterSchedulingPolicyPreference),
                "function_attributes": _function_attributes(cu, func),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = probe(args.hidden)
    for row in rows:
        print(json.dumps(row))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
