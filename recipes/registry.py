"""The recipes Ignition prepares with, and which one serves a checkpoint.

A config's ``architectures`` decide; else (GGUF's configs carry none) its
``model_type``. A checkpoint no recipe serves is refused, naming what is.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from ignition.loading.source import CheckpointError
from recipes import llama, qwen4_exp
from recipes.interface import Recipe

RECIPES: tuple[Recipe, ...] = (llama.RECIPE, qwen4_exp.RECIPE)


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name`` (a core's manifest names its recipe)."""
    for recipe in RECIPES:
        if recipe.name == name:
            return recipe
    raise CheckpointError(f"no recipe is named {name!r}")


def recipe_for(config: PretrainedConfig) -> Recipe:
    """The recipe serving ``config``: by its architectures, else by its model_type."""
    architectures = list(getattr(config, "architectures", None) or [])
    for recipe in RECIPES:
        if any(architecture in recipe.architectures for architecture in architectures):
            return recipe
    for recipe in RECIPES:
        if config.model_type in recipe.model_types:
            return recipe
    served = ", ".join(a for recipe in RECIPES for a in recipe.architectures)
    raise CheckpointError(
        f"model_type {config.model_type!r} (architectures {architectures}) is not served by "
        f"any recipe (they serve {served})"
    )
