"""The recipes Ignition prepares with, and which one serves a checkpoint.

A config's ``architectures`` decide; else (GGUF's configs carry none) its
``model_type``. A multimodal checkpoint whose text model a recipe serves
(``Recipe.multimodal_architectures``) is read as that text model's checkpoint
(``ignition.loading.text_model``). A checkpoint no recipe serves is refused, naming
what is.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from ignition.loading.source import CheckpointError, CheckpointSource
from ignition.loading.text_model import TextModelCheckpoint
from recipes import llama, qwen4_exp
from recipes.interface import Recipe

RECIPES: tuple[Recipe, ...] = (llama.RECIPE, qwen4_exp.RECIPE)


def recipe_named(name: str) -> Recipe:
    """The recipe called ``name`` (a core's manifest names its recipe)."""
    for recipe in RECIPES:
        if recipe.name == name:
            return recipe
    raise CheckpointError(f"no recipe is named {name!r}")


def _architectures(config: PretrainedConfig) -> list[str]:
    return list(getattr(config, "architectures", None) or [])


def recipe_for(config: PretrainedConfig) -> Recipe:
    """The recipe serving ``config``: by its architectures, else by its model_type."""
    architectures = _architectures(config)
    for recipe in RECIPES:
        if any(architecture in recipe.architectures for architecture in architectures):
            return recipe
    for recipe in RECIPES:
        if config.model_type in recipe.model_types:
            return recipe
    served = ", ".join(
        a for recipe in RECIPES for a in recipe.architectures + recipe.multimodal_architectures
    )
    raise CheckpointError(
        f"model_type {config.model_type!r} (architectures {architectures}) is not served by "
        f"any recipe (they serve {served})"
    )


def served_checkpoint(source: CheckpointSource) -> tuple[CheckpointSource, Recipe]:
    """The recipe serving ``source``, and the checkpoint it reads: ``source`` itself, or
    for a multimodal checkpoint whose text model a recipe serves, that text model."""
    architectures = _architectures(source.config())
    for recipe in RECIPES:
        if any(a in recipe.multimodal_architectures for a in architectures):
            text = TextModelCheckpoint(source)
            if recipe_for(text.config()) is not recipe:
                raise CheckpointError(
                    f"{source.path}: the text model of {architectures} is not the "
                    f"{recipe.name} recipe's"
                )
            return text, recipe
    return source, recipe_for(source.config())
