"""Frontends and scripted models for client tests of the agent protocol: a core's
frontend as the manifest writer records it (tokenizer, template, named special
tokens, and the output protocol derived from the template), written where the
``fake_server`` example's ``--frontend`` reads it, and reply scripts for its
``--script``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_server import FakeServer, build_fake_server
from transformers import PreTrainedTokenizerFast

from ignition.export import flare_core_pb2 as pb
from ignition.export.manifest import named_special_tokens, set_output_protocol
from ignition.export.output_protocol import derive_output_protocol

CHAT = Path(__file__).resolve().parents[1] / "helios/tests/fixtures/chat"

# name: (tokenizer file, template file, the special tokens its cases use)
FRONTENDS = {
    "smollm2": ("smollm2.tokenizer.json", "smollm2.jinja", "smollm2.json"),
    "qwen3": ("qwen.tokenizer.json", "qwen3.jinja", "qwen3.json"),
}


def fixture_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The fixture tokenizer of ``name`` with its chat template and special tokens."""
    file, template, cases = FRONTENDS[name]
    special = json.loads((CHAT / cases).read_text(encoding="utf-8"))["special_tokens"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(CHAT / file), **special)
    tokenizer.chat_template = (CHAT / template).read_text(encoding="utf-8")
    return tokenizer


def frontend(name: str) -> pb.Frontend:
    """The frontend a core of this tokenizer and template would carry."""
    tokenizer = fixture_tokenizer(name)
    # Both templates are ChatML: a turn ends at <|im_end|>.
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    message = pb.Frontend(
        tokenizer_json=tokenizer.backend_tokenizer.to_str(),
        chat_template=str(tokenizer.chat_template),
        eos_token_ids=[int(eos)],
        special_tokens=list(tokenizer.all_special_tokens),
        named_special_tokens=named_special_tokens(tokenizer),
        sampling=pb.SamplingDefaults(temperature=1.0, top_p=1.0, repetition_penalty=1.0),
    )
    set_output_protocol(message, derive_output_protocol(tokenizer, str(tokenizer.chat_template)))
    return message


def write_frontend(name: str, path: Path) -> Path:
    path.write_bytes(frontend(name).SerializeToString())
    return path


def write_script(entries: list[dict[str, Any]], path: Path) -> Path:
    """``entries``: ``{"when": text in the prompt, "reply": what the model says}``;
    the entry whose ``when`` occurs latest in a prompt answers it."""
    path.write_text(json.dumps(entries), encoding="utf-8")
    return path


def scripted_server(
    name: str, script: list[dict[str, Any]], folder: Path, *options: str
) -> FakeServer:
    """The fake server over ``name``'s frontend with the model saying ``script``
    (its files written into ``folder``), with further ``options``."""
    frontend = write_frontend(name, folder / f"{name}.frontend.pb")
    replies = write_script(script, folder / "script.json")
    arguments = ["--frontend", str(frontend), "--script", str(replies), *options]
    return FakeServer(build_fake_server(), *arguments)


def run_bench(script: str, server: FakeServer, out: Path, *options: str) -> dict[str, Any]:
    """Runs ``bench/SCRIPT`` against ``server`` as the GPU check runs it against
    ``flare run`` (model ``tiny``, report in ``out``); the report."""
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "bench" / script), "--url", server.url]
    command += ["--model", "tiny", "--out", str(out), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())
