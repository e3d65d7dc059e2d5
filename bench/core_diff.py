"""Whether two runtime cores are the same, byte for byte, and where they differ: the
manifest (field by field when its bytes differ), every initial buffer tensor, and the
set and contents of the kernel images. A re-export check runs it over cores of one
checkpoint exported by two trees (bench/reexport_check.sh).

    python bench/core_diff.py CORE_A CORE_B --out F.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ignition.export import flare_core_pb2 as pb
from ignition.export.core_dir import BUFFERS, IMAGES, MANIFEST


def manifest_fields(a: pb.Core, b: pb.Core) -> list[str]:
    """The top-level manifest fields whose contents differ (for graphs, their index)."""
    differ = []
    for field in pb.Core.DESCRIPTOR.fields:
        left, right = getattr(a, field.name), getattr(b, field.name)
        if field.name == "graphs":
            if len(left) != len(right):
                differ.append(f"graphs: {len(left)} against {len(right)}")
            differ += [
                f"graphs[{i}]" for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y
            ]
        elif left != right:
            differ.append(field.name)
    return differ


def buffer_tensors(a: Path, b: Path) -> list[str]:
    """The initial tensors present in only one core or with other bytes."""
    with safe_open(a, "pt") as left, safe_open(b, "pt") as right:
        names = set(left.keys()) | set(right.keys())
        differ = []
        for name in sorted(names):
            if name not in left.keys() or name not in right.keys():
                differ.append(f"{name}: in one core only")
                continue
            x, y = left.get_tensor(name), right.get_tensor(name)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                differ.append(name)
        return differ


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def images(core: Path) -> dict[str, str]:
    """The core's kernel images: name -> sha256 of the bytes."""
    folder = core / IMAGES
    return {p.name: digest(p) for p in folder.iterdir()} if folder.is_dir() else {}


def compare(a: Path, b: Path) -> dict[str, Any]:
    core_a, core_b = pb.Core(), pb.Core()
    core_a.ParseFromString((a / MANIFEST).read_bytes())
    core_b.ParseFromString((b / MANIFEST).read_bytes())
    same_manifest = (a / MANIFEST).read_bytes() == (b / MANIFEST).read_bytes()
    images_a = images(a)
    images_b = images(b)
    result = {
        "manifest_identical": same_manifest,
        "manifest_fields_differing": [] if same_manifest else manifest_fields(core_a, core_b),
        "buffers_identical": digest(a / BUFFERS) == digest(b / BUFFERS),
        "buffer_tensors_differing": buffer_tensors(a / BUFFERS, b / BUFFERS),
        "images": [len(images_a), len(images_b)],
        "images_only_in_a": sorted(set(images_a) - set(images_b)),
        "images_only_in_b": sorted(set(images_b) - set(images_a)),
    }
    result["identical"] = (
        same_manifest
        and result["buffers_identical"]
        and not result["images_only_in_a"]
        and not result["images_only_in_b"]
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = compare(args.a, args.b)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result)[:2000], file=sys.stderr)
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
