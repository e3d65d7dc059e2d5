"""The conversation Helios renders for a chat template that shows no tools, for the
engines the suite drives in Python.

When a core's tool parser is ``JSON_INSTRUCTED`` (the template renders neither the
tools nor the calls, ``ignition/export/output_protocol.py``), Helios rewrites a chat
request before rendering it (``instructed_input`` in
``helios/src/frontend/protocol/instruction.rs``): earlier calls are written in the call
format the parser reads, tool results become user turns in ``<tool_response>`` tags,
and the tools are declared in the system message. The Python replay floor must prefill
the same tokens as the server, so it rewrites the messages the same way here;
``helios/tests/fixtures/chat/instructed.json`` holds both to the same output
(``helios/tests/frontend_instructed.rs`` and ``tests/test_suite_instructed.py``).

Not mirrored, because the suite never sends them: what the server does to a request
before this rewrite (``developer`` messages as ``system``, content-part lists joined
into text, ``tool_choice`` ``none`` or a named tool narrowing the tools shown) and
``tool_choice=required``'s added demand for a call.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from ignition.export import flare_core_pb2 as pb
from ignition.export.output_protocol import derive_output_protocol

Message = dict[str, Any]
# The integers serde_json keeps as integers; past them it reads a float.
_I64_MIN, _U64_MAX = -(2**63), 2**64 - 1


def python_json(value: Any) -> str:
    """``json.dumps`` as Transformers' ``tojson`` writes it (Helios's ``python_json``)."""
    return json.dumps(value, ensure_ascii=False)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _serde_int(text: str) -> int | float:
    value = int(text)
    return value if _I64_MIN <= value <= _U64_MAX else float(text)


def serde_loads(text: str) -> Any:
    """``text`` parsed as ``serde_json::from_str`` parses it: no ``NaN`` or
    ``Infinity``, integers past 64 bits as floats, a float past the range refused;
    ``ValueError`` where serde_json fails."""
    value = json.loads(text, parse_constant=_refuse_constant, parse_int=_serde_int)

    def finite(item: Any) -> None:
        if isinstance(item, float) and item in (float("inf"), float("-inf")):
            raise ValueError("a number out of range")
        for child in (
            item.values() if isinstance(item, dict) else (item if isinstance(item, list) else ())
        ):
            finite(child)

    finite(value)
    return value


def instructed_messages(
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None,
    call_start: str,
    call_end: str,
) -> list[Message]:
    """``messages`` with every call and result written out in the instructed syntax,
    and ``tools`` (when there are any) declared in the system message."""
    out = [_written_out(message, call_start, call_end) for message in messages]
    if not tools:
        return out
    declarations = "\n".join(python_json(tool) for tool in tools)
    instruction = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{declarations}\n</tools>\n\n"
        "For each function call, return a JSON object with the function name and its "
        f"arguments within {call_start}{call_end} tags:\n"
        f'{call_start}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{call_end}'
    )
    return _appended_to_system(out, instruction)


def _written_out(message: Any, call_start: str, call_end: str) -> Any:
    if not isinstance(message, dict):
        return message  # passed through, as Helios passes a non-object
    message = dict(message)
    role = message.get("role")
    if role == "assistant":
        calls = message.pop("tool_calls", None)
        if not isinstance(calls, list):
            return message
        content = message.pop("content", None)
        text = content if isinstance(content, str) else ""
        for call in calls:
            function = call.get("function", call) if isinstance(call, dict) else call
            if not isinstance(function, dict):
                function = {}  # Helios reads neither name nor arguments from it
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = serde_loads(arguments)
                except (ValueError, RecursionError):
                    pass  # kept as the string it is
            if text:
                text += "\n"
            written = python_json({"name": function.get("name"), "arguments": arguments})
            text += f"{call_start}\n{written}\n{call_end}"
        message["content"] = text
        return message
    if role == "tool":
        content = message.get("content", "")
        if not isinstance(content, str):  # serde_json's compact text, null included
            content = json.dumps(content, separators=(",", ":"), ensure_ascii=False)
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    return message


def _appended_to_system(messages: list[Any], text: str) -> list[Any]:
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system":
        existing = messages[0].get("content")
        content = f"{existing}\n\n{text}" if isinstance(existing, str) and existing else text
        return [{**messages[0], "content": content}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class ChatRenderer:
    """A tokenizer's chat prompts as Helios renders them: through the instructed
    rewrite when the template's tool parser is ``JSON_INSTRUCTED``. The parser is
    derived at the first chat, so an engine that renders none (``long``, ``decode``)
    never needs the template's tool format to be derivable."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    @functools.cached_property
    def markers(self) -> tuple[str, str] | None:
        """The call markers when the server declares the tools itself, else None."""
        if not self.tokenizer.chat_template:
            return None
        protocol = derive_output_protocol(self.tokenizer)
        if protocol.tool_parser != pb.TOOL_PARSER_JSON_INSTRUCTED:
            return None
        assert protocol.call_start is not None and protocol.call_end is not None
        return protocol.call_start.text, protocol.call_end.text

    def text(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> str:
        """The prompt with the generation header, as the server renders it."""
        if self.markers is not None:
            messages, tools = instructed_messages(messages, tools, *self.markers), None
        rendered = self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )
        return str(rendered)

    def ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> list[int]:
        """The prompt's tokens as Helios encodes them."""
        return list(self.tokenizer.encode(self.text(messages, tools), add_special_tokens=False))
