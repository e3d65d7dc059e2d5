"""How the model writes tool calls and reasoning, read off its chat template.

Helios parses a model's output with one of a few reusable parsers (``ToolParser`` and
``ReasoningParser`` in ``proto/flare_core.proto``), each configured by the marker
strings around a call or a reasoning block. Which parser and which markers are
derived here from what the checkpoint's chat template renders, never from the
model's or family's name: the template is rendered over probe conversations that
differ in one thing (a tool call or plain content, tools or none, reasoning or none)
and the renderings are diffed, as llama.cpp's chat auto-parser does.

Tools. The *call block* is what an assistant turn holding one call to the probe tool
renders where a plain reply renders its content: the call rendering minus its longest
common prefix and suffix with two plain renderings (two replies that share neither
first nor last character, so a marker that happens to start or end like one of them
still stays in the block; a generation-prompt header or an empty ``<think>`` block
the template puts before every reply stays out of it). The rules:

- The template renders the tools (a conversation renders differently with them and
  without) and the block holds the call, recognized as
  ``<function=NAME><parameter=KEY>`` (``XML_FUNCTIONS``: the markers are the text
  before ``<function=`` and after the last ``</function>``), or as a JSON object with
  ``"name"`` and ``"arguments"`` or ``"parameters"``: ``JSON_IN_TAGS`` when text
  precedes and follows the object, ``JSON_ANSWER`` when nothing follows it (with the
  text before it, when there is some, as its start marker); the separator of
  ``JSON_ANSWER`` is what stands between two calls of one turn when the template
  renders two (stripped; it must not be empty), else ``;``. With two calls rendered,
  a tagged format must repeat its markers around each.
- The template renders neither the tools nor the call (the probe tool's name is not
  in the block, or rendering a call fails): ``JSON_INSTRUCTED`` with ``<tool_call>``
  and ``</tool_call>``; the server declares the tools itself.
- The template renders the call in tags but not the tools: ``JSON_INSTRUCTED`` with
  the template's own markers.
- Anything else raises ``OutputProtocolError``: a call format none of the above
  matches (the message shows the rendered block), tools rendered without a readable
  call (how the model writes calls is unknown), or a call in a format the server
  cannot declare (XML or a bare JSON answer) from a template that never shows tools.

Reasoning. An assistant turn with ``reasoning_content`` is rendered before a later
user turn, then as the last turn (templates such as Qwen3's keep reasoning only after
the last user query); where the probe reasoning shows, the tags right before and
after it (``<...>`` or ``[...]``, no whitespace inside) are the markers
(``THINK_TAGS``). Else a generation prompt rendered with ``enable_thinking=False``
that gains exactly two such tags (an empty ``<think></think>`` block) gives them.
Else ``NONE``.

Markers. A marker's ``token_id`` is set when the marker's text encodes, without
special tokens, to exactly one token and that token is the added token spelling it
(``get_added_vocab()``); Helios then detects it by id only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ignition.export import flare_core_pb2 as pb
from ignition.export.graph_walk import ExportError

PROBE_TOOL = "probe_tool_name"
PROBE_KEY = "probe_key"
PROBE_VALUES = ("probe_value", "probe_value_two")
PROBE_REASONING = "probe reasoning"
PROBE_ANSWER = "probe answer"
# Plain replies whose first and last characters differ from each other's.
PLAIN_CONTENTS = ("probe content", "Probe Content.")
INSTRUCTED_START = "<tool_call>"
INSTRUCTED_END = "</tool_call>"
DEFAULT_SEPARATOR = ";"

PROBE_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": PROBE_TOOL,
        "description": "A probe tool.",
        "parameters": {
            "type": "object",
            "properties": {PROBE_KEY: {"type": "string", "description": "A probe argument."}},
            "required": [PROBE_KEY],
        },
    },
}

_USER = {"role": "user", "content": "U"}
_LATER_USER = {"role": "user", "content": "U2"}
_TAG = r"(?:<[^<>\s]+>|\[[^\[\]\s]+\])"
_NAME = re.compile(r'"name"\s*:\s*"' + re.escape(PROBE_TOOL) + '"')
_ARGUMENT_KEYS = ("arguments", "parameters")


class OutputProtocolError(ExportError):
    """A chat template whose tool-call rendering Ignition cannot turn into a parser;
    the message says what was not recognized and shows the rendered text."""


@dataclass(frozen=True)
class Marker:
    """A delimiter the model writes, and the added token that spells it, if one does."""

    text: str
    token_id: int | None

    def message(self) -> pb.Marker:
        marker = pb.Marker(text=self.text)
        if self.token_id is not None:
            marker.token_id = self.token_id
        return marker


@dataclass(frozen=True)
class OutputProtocol:
    """The parsers (``pb.ToolParser`` / ``pb.ReasoningParser`` values) and their markers."""

    tool_parser: int
    call_start: Marker | None
    call_end: Marker | None
    separator: str
    reasoning_parser: int
    reasoning_start: Marker | None
    reasoning_end: Marker | None

    def tool_markers(self) -> pb.ToolMarkers | None:
        """The manifest's ``ToolMarkers``; None when tool calls are not parsed."""
        if self.tool_parser == pb.TOOL_PARSER_NONE:
            return None
        markers = pb.ToolMarkers(separator=self.separator)
        if self.call_start is not None:
            markers.call_start.CopyFrom(self.call_start.message())
        if self.call_end is not None:
            markers.call_end.CopyFrom(self.call_end.message())
        return markers

    def reasoning_markers(self) -> pb.ReasoningMarkers | None:
        """The manifest's ``ReasoningMarkers``; None when reasoning is not parsed."""
        if self.reasoning_parser == pb.REASONING_PARSER_NONE:
            return None
        markers = pb.ReasoningMarkers()
        if self.reasoning_start is not None:
            markers.start.CopyFrom(self.reasoning_start.message())
        if self.reasoning_end is not None:
            markers.end.CopyFrom(self.reasoning_end.message())
        return markers


NO_PROTOCOL = OutputProtocol(
    tool_parser=pb.TOOL_PARSER_NONE,
    call_start=None,
    call_end=None,
    separator="",
    reasoning_parser=pb.REASONING_PARSER_NONE,
    reasoning_start=None,
    reasoning_end=None,
)


def derive_output_protocol(
    tokenizer: PreTrainedTokenizerBase, chat_template: str | None = None
) -> OutputProtocol:
    """The output protocol ``chat_template`` (default: the tokenizer's) implies.

    A tokenizer without a template has none: NONE for tools and reasoning."""
    template = tokenizer.chat_template if chat_template is None else chat_template
    if isinstance(template, Mapping):
        raise OutputProtocolError(
            f"the tokenizer has named chat templates ({', '.join(template)}); "
            "the core carries one template: pass it as chat_template"
        )
    if not template:
        return NO_PROTOCOL
    renderer = _Renderer(tokenizer, str(template))
    parser, start, end, separator = _tool_protocol(renderer)
    reasoning, reasoning_start, reasoning_end = _reasoning_protocol(renderer)
    return OutputProtocol(
        tool_parser=parser,
        call_start=_marker(tokenizer, start),
        call_end=_marker(tokenizer, end),
        separator=separator,
        reasoning_parser=reasoning,
        reasoning_start=_marker(tokenizer, reasoning_start),
        reasoning_end=_marker(tokenizer, reasoning_end),
    )


def marker_token(tokenizer: PreTrainedTokenizerBase, text: str) -> int | None:
    """The added token that alone encodes ``text``, if there is one."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.get_added_vocab().get(text) == ids[0]:
        return int(ids[0])
    return None


def _marker(tokenizer: PreTrainedTokenizerBase, text: str | None) -> Marker | None:
    return None if text is None else Marker(text, marker_token(tokenizer, text))


class _Renderer:
    """``apply_chat_template(..., tokenize=False)`` with one template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, template: str) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=self.template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except Exception as error:  # any failure of the template is reported as one
            raise OutputProtocolError(
                f"the chat template failed to render a probe conversation "
                f"({type(error).__name__}: {error})"
            ) from error
        if not isinstance(text, str):
            raise OutputProtocolError(f"the chat template rendered {type(text).__name__}")
        return text

    def attempt(self, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
        """The rendering, or None when the template refuses the conversation."""
        try:
            return self.render(messages, **kwargs)
        except OutputProtocolError:
            return None


def _probe_call(index: int) -> dict[str, Any]:
    return {
        "id": f"call_probe_{index}",
        "type": "function",
        "function": {"name": PROBE_TOOL, "arguments": {PROBE_KEY: PROBE_VALUES[index]}},
    }


def differing_block(text: str, bases: Sequence[str]) -> str:
    """``text`` without its longest common prefix and suffix with every base (the
    shortest of each), the suffix never reaching into the prefix."""
    start = min(_common_prefix(text, base) for base in bases)
    stop = min(_common_prefix(text[start:][::-1], base[start:][::-1]) for base in bases)
    return text[start : len(text) - stop]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _call_block(renderer: _Renderer, calls: int, plains: Sequence[str]) -> str | None:
    """The call block of an assistant turn with ``calls`` probe calls, or None when no
    rendering shows the probe tool's name there (or every rendering fails). Empty
    content first, then none (templates differ on which a call-only turn has)."""
    tool_calls = [_probe_call(i) for i in range(calls)]
    for content in ("", None):
        turn = {"role": "assistant", "content": content, "tool_calls": tool_calls}
        text = renderer.attempt([_USER, turn], tools=[PROBE_SCHEMA])
        if text is not None:
            block = differing_block(text, plains)
            if PROBE_TOOL in block:
                return block
    return None


@dataclass(frozen=True)
class _Calls:
    """A recognized call format: parser, markers' text, and where each call lies."""

    parser: int
    start: str | None
    end: str | None
    spans: list[tuple[int, int]]


def _json_spans(block: str) -> list[tuple[int, int]]:
    """Where each JSON object naming the probe tool, with its arguments, lies."""
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    floor = 0
    for match in _NAME.finditer(block):
        if match.start() < floor:
            continue
        braces = [i for i in range(match.start() - 1, floor - 1, -1) if block[i] == "{"]
        for brace in braces:
            try:
                value, end = decoder.raw_decode(block, brace)
            except json.JSONDecodeError:
                continue
            if (
                end >= match.end()
                and isinstance(value, dict)
                and value.get("name") == PROBE_TOOL
                and any(key in value for key in _ARGUMENT_KEYS)
            ):
                spans.append((brace, end))
                floor = end
                break
    return spans


def _xml_spans(block: str) -> list[tuple[int, int]]:
    spans = []
    for match in re.finditer(re.escape(f"<function={PROBE_TOOL}>"), block):
        end = block.find("</function>", match.end())
        if end < 0:
            return []
        spans.append((match.start(), end + len("</function>")))
    return spans


def _unrecognized(block: str, why: str) -> OutputProtocolError:
    return OutputProtocolError(
        f"the chat template renders a tool call in a format Ignition does not recognize "
        f"({why}); known formats: <function=NAME><parameter=KEY>VALUE</parameter></function> "
        f'between markers, a JSON object {{"name": .., "arguments" or "parameters": ..}} '
        f"between markers or as the whole answer; the probe call rendered as {block!r}"
    )


def classify_call(block: str) -> _Calls:
    """The format of one rendered call (its call block)."""
    if f"<function={PROBE_TOOL}>" in block and f"<parameter={PROBE_KEY}>" in block:
        spans = _xml_spans(block)
        if not spans:
            raise _unrecognized(block, "<function=NAME> is never closed by </function>")
        start, end = block[: spans[0][0]].strip(), block[spans[-1][1] :].strip()
        if not start or not end:
            raise _unrecognized(block, "<function=NAME> blocks without a start and end marker")
        return _Calls(pb.TOOL_PARSER_XML_FUNCTIONS, start, end, spans)
    spans = _json_spans(block)
    if not spans:
        raise _unrecognized(block, "neither XML functions nor a JSON object naming the tool")
    start, end = block[: spans[0][0]].strip(), block[spans[-1][1] :].strip()
    if start and end:
        return _Calls(pb.TOOL_PARSER_JSON_IN_TAGS, start, end, spans)
    if not end:
        return _Calls(pb.TOOL_PARSER_JSON_ANSWER, start or None, None, spans)
    raise _unrecognized(block, f"a JSON object followed by {end!r} but preceded by nothing")


def _separator(calls: _Calls, pair: str | None) -> str:
    """The separator between calls, checked against a two-call block when the
    template rendered one: tagged formats must wrap each call in their markers."""
    if pair is None:
        return DEFAULT_SEPARATOR if calls.parser == pb.TOOL_PARSER_JSON_ANSWER else ""
    if calls.parser == pb.TOOL_PARSER_XML_FUNCTIONS:
        spans = _xml_spans(pair)
    else:
        spans = _json_spans(pair)
    if len(spans) != 2:
        raise _unrecognized(pair, f"two calls of one turn render as {len(spans)}")
    between = pair[spans[0][1] : spans[1][0]].strip()
    if calls.parser == pb.TOOL_PARSER_JSON_ANSWER:
        if not between:
            # Helios skips whitespace between calls and then looks for the separator.
            raise _unrecognized(pair, "two JSON answers separated by whitespace alone")
        return between
    start, end = calls.start or "", calls.end or ""
    wrapped = (
        between.startswith(end)
        and between.endswith(start)
        and len(between) >= len(start) + len(end)
        and not between[len(end) : len(between) - len(start)].strip()
    )
    if not wrapped:
        raise _unrecognized(pair, f"two calls are not each between {start!r} and {end!r}")
    return ""


def _tool_protocol(renderer: _Renderer) -> tuple[int, str | None, str | None, str]:
    """The tool parser, the markers' text and the separator (rules: module docstring)."""
    plains = [
        renderer.render([_USER, {"role": "assistant", "content": c}], tools=[PROBE_SCHEMA])
        for c in PLAIN_CONTENTS
    ]
    without = renderer.render([_USER, {"role": "assistant", "content": PLAIN_CONTENTS[0]}])
    renders_tools = plains[0] != without
    block = _call_block(renderer, 1, plains)
    if block is None:
        if renders_tools:
            raise OutputProtocolError(
                "the chat template renders the tools but not an assistant's tool call "
                f"(the probe call's name {PROBE_TOOL!r} never shows where its reply would): "
                "how the model writes calls cannot be read off it"
            )
        return pb.TOOL_PARSER_JSON_INSTRUCTED, INSTRUCTED_START, INSTRUCTED_END, ""
    calls = classify_call(block)
    if not renders_tools and calls.parser != pb.TOOL_PARSER_JSON_IN_TAGS:
        raise OutputProtocolError(
            f"the chat template renders tool calls as {pb.ToolParser.Name(calls.parser)} but "
            "never renders the tools, and the server can only declare tools for calls in JSON "
            f"between markers; the probe call rendered as {block!r}"
        )
    separator = _separator(calls, _call_block(renderer, 2, plains))
    if renders_tools:
        return calls.parser, calls.start, calls.end, separator
    return pb.TOOL_PARSER_JSON_INSTRUCTED, calls.start, calls.end, ""


def _reasoning_protocol(renderer: _Renderer) -> tuple[int, str | None, str | None]:
    """The reasoning parser and the markers' text (rules: module docstring)."""
    reply = {"role": "assistant", "content": PROBE_ANSWER, "reasoning_content": PROBE_REASONING}
    for messages in ([_USER, reply, _LATER_USER], [_USER, reply]):
        text = renderer.attempt(messages)
        if text is None or PROBE_REASONING not in text:
            continue
        before, _, after = text.partition(PROBE_REASONING)
        start = re.search(f"{_TAG}$", before.rstrip())
        end = re.match(_TAG, after.lstrip())
        if start and end:
            return pb.REASONING_PARSER_THINK_TAGS, start.group(), end.group()
    prompt = renderer.attempt([_USER], add_generation_prompt=True)
    off = renderer.attempt([_USER], add_generation_prompt=True, enable_thinking=False)
    if prompt is not None and off is not None and off.startswith(prompt):
        tags = off[len(prompt) :].split()
        if len(tags) == 2 and all(re.fullmatch(_TAG, tag) for tag in tags):
            return pb.REASONING_PARSER_THINK_TAGS, tags[0], tags[1]
    return pb.REASONING_PARSER_NONE, None, None
