"""The compile options of every command that prepares a model (``ignition prepare``,
the benchmark suite's replay floor, the kernel timeline), spelled alike. No torch
import: the suite parses its options before it knows whether it needs torch."""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args

# What one compiled region holds: a whole forward, or each decoder layer.
CompileScope = Literal["forward", "layer"]
COMPILE_SCOPES: tuple[str, ...] = get_args(CompileScope)


def add_compile_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--{prefix}no-compile``, ``--{prefix}compile-scope`` and
    ``--[no-]{prefix}compile-sampling``."""
    parser.add_argument(
        f"--{prefix}no-compile", action="store_true", help="skip torch.compile of the forwards"
    )
    parser.add_argument(
        f"--{prefix}compile-scope",
        choices=COMPILE_SCOPES,
        default="forward",
        help="what one compiled region holds: a whole forward (default; fusions across "
        "layers, compile time grows with depth) or each decoder layer (one compilation "
        "per shape serves every layer: for deep models)",
    )
    parser.add_argument(
        f"--{prefix}compile-sampling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the sampler and commit (default: as the forwards; it is small, and "
        "run eagerly it adds a few hundred kernels to every step)",
    )


def compile_options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """``PrepareOptions`` fields from the options ``add_compile_options`` added."""
    name = prefix.replace("-", "_")
    return {
        "compile": not getattr(args, f"{name}no_compile"),
        "compile_scope": getattr(args, f"{name}compile_scope"),
        "compile_sampling": getattr(args, f"{name}compile_sampling"),
    }
