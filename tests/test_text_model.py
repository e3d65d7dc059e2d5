"""A multimodal checkpoint's text model, served as Transformers' multimodal model
answers text (``ignition.loading.text_model``): Qwen3.8 Flash is published as
``Qwen4ExpForConditionalGeneration``, its text model under ``model.language_model.``
beside a vision tower that text serving never loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import CPU_OPTIONS, write_tiny_multimodal_hybrid
from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForConditionalGeneration

from ignition.loading.open import open_checkpoint
from ignition.loading.source import CheckpointError, TensorInfo
from ignition.loading.text_model import LEFT_OUT, TextModelCheckpoint
from ignition.preparation.prepared import prepare
from ignition.replay.teacher_forcing import compare_logits, teacher_forced_logits
from recipes import qwen4_exp
from recipes.registry import served_checkpoint


@pytest.mark.parametrize("tie", [False, True])
def test_a_multimodal_checkpoint_serves_its_text_model_as_transformers_does(
    tmp_path: Path, tie: bool
) -> None:
    path = tmp_path / "multimodal"
    write_tiny_multimodal_hybrid(path, tie=tie)
    prepared = prepare(path, CPU_OPTIONS)
    assert prepared.recipe == qwen4_exp.NAME
    reference = Qwen4ExpForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    ids = torch.randint(3, 512, (100,), generator=torch.Generator().manual_seed(3))
    ids[40] = 1  # an EOS inside the prompt resets the PLE n-gram segment
    tokens = ids.tolist()
    with torch.no_grad():
        want = reference.eval()(torch.tensor([tokens])).logits[0].float()
    # Two prefill chunks (the QSA layer sparse from position 12), then decode steps.
    got = teacher_forced_logits(prepared, tokens, 80, chunk=48)
    comparison = compare_logits(got, want[79:])
    # Float32 on both sides: only reduction order differs (as the text model's own
    # teacher-forced test bounds it).
    assert comparison.relative_l2 < 1e-5, comparison
    assert comparison.top10_overlap > 0.99, comparison


def test_the_text_model_reads_in_canonical_names_and_leaves_the_tower_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "multimodal"
    model = write_tiny_multimodal_hybrid(path)
    stored = open_checkpoint(path)
    source, recipe = served_checkpoint(stored)
    assert recipe is qwen4_exp.RECIPE
    assert isinstance(source, TextModelCheckpoint)
    names = set(source.tensors())
    assert names == {
        "model." + n.removeprefix("model.language_model.")
        for n in stored.tensors()
        if n.startswith("model.language_model.")
    } | {"lm_head.weight"}
    tower = {n: LEFT_OUT for n in stored.tensors() if n.startswith("model.visual.")}
    assert source.left_out == tower
    assert source.left_out, "the tower's tensors are named"
    embeddings = model.model.language_model.embed_tokens.weight
    assert torch.equal(source.load("model.embed_tokens.weight"), embeddings.detach())
    config = source.config()
    assert config.model_type == "qwen4_exp_text"
    assert config.hidden_size == model.config.text_config.hidden_size
    with pytest.raises(CheckpointError, match=r"no tensor named model\.visual"):
        source.load(next(iter(source.left_out)))


class _TowerOnly:
    """A multimodal checkpoint whose tensors hold no text model."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.path = Path("tower-only")

    def config(self) -> object:
        return self._inner.config()  # type: ignore[attr-defined]

    def tensors(self) -> dict[str, TensorInfo]:
        return {"model.visual.patch_embed.proj.weight": TensorInfo("x", (1,), torch.float32)}


class _WithHeads(_TowerOnly):
    """A multimodal checkpoint with its text model and a head Flare does not serve."""

    def tensors(self) -> dict[str, TensorInfo]:
        info = TensorInfo("x", (1,), torch.float32)
        return {"model.language_model.norm.weight": info, "mtp.fc.weight": info}


def test_tensors_neither_text_nor_tower_keep_their_names(tmp_path: Path) -> None:
    # So the recipe's mapping refuses them as it would in a text checkpoint.
    path = tmp_path / "multimodal"
    write_tiny_multimodal_hybrid(path)
    text = TextModelCheckpoint(_WithHeads(open_checkpoint(path)))  # type: ignore[arg-type]
    assert set(text.tensors()) == {"model.norm.weight", "mtp.fc.weight"}
    assert text.left_out == {}


def test_a_multimodal_checkpoint_without_its_text_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "multimodal"
    write_tiny_multimodal_hybrid(path)
    with pytest.raises(CheckpointError, match=r"without model\.language_model"):
        served_checkpoint(_TowerOnly(open_checkpoint(path)))  # type: ignore[arg-type]
