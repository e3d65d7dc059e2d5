"""The compile options of every command that prepares a model (``ignition prepare``,
the benchmark suite's replay floor, the kernel timeline), spelled alike. No torch
import: the suite parses its options before it knows whether it needs torch."""

from __future__ import annotations

import argparse
from typing import Any, Literal, get_args

# What one compiled region holds: a whole forward, or each decoder layer.
CompileScope = Literal["forward", "layer"]
COMPILE_SCOPES: tuple[str, ...] = get_args(CompileScope)
# What a decode layer fuses into its projections' kernels: nothing (the canonical
# forward, compiled), the residual additions (epilogues of o and down), or those and
# the RMSNorms (the statistic from the o and down epilogues' partial squares, the
# gain folded into qkv's and gate/up's weights), or those with a decode step's layers
# in one persistent kernel (an experiment: ``ignition.components.persistent_layer``);
# "auto" lets the recipe choose by the model's geometry and rank layout
# (``recipes.llama.resolve_fusion``).
DecodeFusion = Literal["auto", "none", "residuals", "norms", "persistent"]
DECODE_FUSIONS: tuple[str, ...] = get_args(DecodeFusion)
# Preparation's default: each geometry's fastest measured
# (bench/results/issue23/2026-12-05b-h200-head/, 2026-12-05e-h200-waves/).
DEFAULT_DECODE_FUSION: DecodeFusion = "auto"


def add_compile_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """``--{prefix}no-compile``, ``--{prefix}compile-scope``,
    ``--[no-]{prefix}compile-sampling``, ``--{prefix}decode-fusion``,
    ``--[no-]{prefix}programmatic-launch`` and ``--[no-]{prefix}early-weights``."""
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
        help="compile the sampler and commit, and each step's reads and writes of request "
        "state around its forward (default: as the forwards; they are small, and run "
        "eagerly they add a few hundred kernels to every step)",
    )
    parser.add_argument(
        f"--{prefix}decode-fusion",
        choices=DECODE_FUSIONS,
        default=DEFAULT_DECODE_FUSION,
        help="what decode layers fuse into their projections' kernels: none (the canonical "
        "layer, compiled), the residual additions, or those and the RMSNorms (each norm's "
        "gain folded into the weight that reads it, its statistic from the projection "
        "that wrote the rows); auto (default): norms wherever they fuse (one rank, a "
        "hidden size in 16-column groups; on the H200 SmolLM2-135M's step 12%% shorter, "
        "the 8B's 1.0-2.2%%), else residuals; persistent (experimental): the norms "
        "fusion's arithmetic with a decode step's layers in one persistent kernel, their "
        "phases separated by grid barriers (on the H200 SmolLM2's 30 layers took 1.29x "
        "the kernel chain's time: "
        "a barrier costs more than a kernel boundary)",
    )
    parser.add_argument(
        f"--{prefix}programmatic-launch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="launch the batch-invariant row projections (every decode projection), "
        "prefill's rotary/KV write, decode attention and the sampler's threshold passes "
        "programmatically where the GPU can (SM90 and later): each may launch while the "
        "kernel before it ends and waits for it before reading; the same bits (default: "
        "on; measured faster when it covered the projections alone)",
    )
    parser.add_argument(
        f"--{prefix}early-weights",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with programmatic launch, each row projection of at most 16 rows (the decode "
        "projections but the K split of narrow ones) loads the weight tiles of its last K "
        "steps (up to four) before it waits for the kernel before (no kernel of a step "
        "writes a weight), so those bytes stream while that kernel ends; the same bits "
        "(default: off: on the H200 it measured slower)",
    )


def compile_options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """``PrepareOptions`` fields from the options ``add_compile_options`` added."""
    name = prefix.replace("-", "_")
    return {
        "compile": not getattr(args, f"{name}no_compile"),
        "compile_scope": getattr(args, f"{name}compile_scope"),
        "compile_sampling": getattr(args, f"{name}compile_sampling"),
        "decode_fusion": getattr(args, f"{name}decode_fusion"),
        "programmatic_launch": getattr(args, f"{name}programmatic_launch"),
        "early_weights": getattr(args, f"{name}early_weights"),
    }
