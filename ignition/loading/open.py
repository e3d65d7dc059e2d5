"""Open a checkpoint by what the path is: a Transformers directory, a GGUF file, or a
random-weights geometry directory (``ignition.loading.random_weights``)."""

from __future__ import annotations

from pathlib import Path

from ignition.loading.source import CheckpointError, CheckpointSource


def open_checkpoint(path: Path) -> CheckpointSource:
    """The checkpoint source for ``path``; a clear error for anything else."""
    if path.is_dir() and (path / "random-weights.json").is_file():
        from ignition.loading.random_weights import RandomWeightsCheckpoint

        return RandomWeightsCheckpoint(path)
    if path.is_dir():
        from ignition.loading.safetensors_source import SafetensorsCheckpoint

        return SafetensorsCheckpoint(path)
    if path.is_file() and path.suffix == ".gguf":
        from ignition.loading.gguf import GgufCheckpoint

        return GgufCheckpoint(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    raise CheckpointError(
        f"{path}: expected a Transformers checkpoint directory (config.json + safetensors) "
        "or a .gguf file"
    )
