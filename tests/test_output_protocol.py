"""The output protocol derived from chat templates by rendering and diffing (CPU):
the fixture templates of ``helios/tests/fixtures/chat/`` give their formats, small
inline templates cover the rules' other branches, and the manifest carries markers
with ``token_id`` unset when no added token spells them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from ignition.export import flare_core_pb2 as pb
from ignition.export.graph_walk import ExportError
from ignition.export.manifest import set_output_protocol
from ignition.export.output_protocol import (
    NO_PROTOCOL,
    Marker,
    OutputProtocol,
    OutputProtocolError,
    derive_output_protocol,
    differing_block,
    marker_token,
)
from ignition.loading.synthetic_tokenizers import word_level_tokenizer

CHAT = Path(__file__).resolve().parents[1] / "helios/tests/fixtures/chat"
# Each tokenizer with the special tokens its cases were generated with.
TOKENIZERS = {
    "smollm2": ("smollm2.tokenizer.json", "smollm2.json"),
    "qwen": ("qwen.tokenizer.json", "qwen3.json"),
    "byte_fallback": ("byte_fallback.tokenizer.json", "bos.json"),
}


def tokenizer(name: str, template: str | None) -> PreTrainedTokenizerFast:
    """A fixture tokenizer with ``template`` (a fixture file name ending in
    ``.jinja``, or the template's text) as its chat template."""
    file, cases = TOKENIZERS[name]
    special = json.loads((CHAT / cases).read_text(encoding="utf-8"))["special_tokens"]
    tok = PreTrainedTokenizerFast(tokenizer_file=str(CHAT / file), **special)
    if template is not None and template.endswith(".jinja"):
        template = (CHAT / template).read_text(encoding="utf-8")
    tok.chat_template = template
    return tok


def added(tok: PreTrainedTokenizerFast, text: str) -> int:
    return tok.get_added_vocab()[text]


def chatml(calls: str, *, tools: bool = True) -> str:
    """A ChatML template rendering an assistant turn's ``m.tool_calls`` with ``calls``
    after its content, and declaring the tools in a system turn if ``tools``."""
    header = "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    return (
        (header if tools else "")
        + "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
        + calls
        + "<|im_end|>\n{% endfor %}"
        + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def each(call: str, between: str = "") -> str:
    """Renders every tool call ``c`` with ``call``, ``between`` between two."""
    return (
        "{% for c in m.tool_calls or [] %}{% if not loop.first %}"
        + between
        + "{% endif %}"
        + call
        + "{% endfor %}"
    )


JSON_CALL = "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"


def test_the_call_block_is_where_the_call_differs_from_both_plain_replies() -> None:
    # "probe_call" shares "probe" with the first plain reply, nothing with the second.
    plains = ["<a>probe content</a>", "<a>Probe Content.</a>"]
    assert differing_block("<a>probe_call: {}</a>", plains) == "probe_call: {}"
    assert differing_block("<a>probe_call: {}</a>", plains[:1]) == "_call: {}"
    assert differing_block("<a></a>", plains) == ""  # the suffix stops at the prefix


def test_smollm2_ignores_tools_so_the_server_instructs_the_json_format() -> None:
    protocol = derive_output_protocol(tokenizer("smollm2", "smollm2.jinja"))
    assert protocol == OutputProtocol(
        tool_parser=pb.TOOL_PARSER_JSON_INSTRUCTED,
        call_start=Marker("<tool_call>", None),  # several tokens in SmolLM2's vocabulary
        call_end=Marker("</tool_call>", None),
        separator="",
        reasoning_parser=pb.REASONING_PARSER_NONE,
        reasoning_start=None,
        reasoning_end=None,
    )


def test_qwen3_writes_json_in_tags_and_think_tags_as_added_tokens() -> None:
    tok = tokenizer("qwen", "qwen3.jinja")
    protocol = derive_output_protocol(tok)
    assert protocol == OutputProtocol(
        tool_parser=pb.TOOL_PARSER_JSON_IN_TAGS,
        call_start=Marker("<tool_call>", added(tok, "<tool_call>")),
        call_end=Marker("</tool_call>", added(tok, "</tool_call>")),
        separator="",
        reasoning_parser=pb.REASONING_PARSER_THINK_TAGS,
        reasoning_start=Marker("<think>", added(tok, "<think>")),
        reasoning_end=Marker("</think>", added(tok, "</think>")),
    )
    assert protocol.call_start is not None and protocol.call_start.token_id == 641


def test_qwen3_shows_reasoning_only_after_the_last_user_query() -> None:
    # Why the reasoning probe also renders the assistant turn last.
    tok = tokenizer("qwen", "qwen3.jinja")
    reply = {"role": "assistant", "content": "A", "reasoning_content": "probe reasoning"}
    user = {"role": "user", "content": "U"}
    earlier = tok.apply_chat_template([user, reply, user], tokenize=False)
    last = tok.apply_chat_template([user, reply], tokenize=False)
    assert "probe reasoning" not in earlier
    assert "<think>\nprobe reasoning\n</think>" in last


def test_qwen3_coder_style_writes_xml_functions() -> None:
    tok = tokenizer("qwen", "qwen3_coder_style.jinja")
    protocol = derive_output_protocol(tok)
    assert protocol == OutputProtocol(
        tool_parser=pb.TOOL_PARSER_XML_FUNCTIONS,
        call_start=Marker("<tool_call>", added(tok, "<tool_call>")),
        call_end=Marker("</tool_call>", added(tok, "</tool_call>")),
        separator="",
        reasoning_parser=pb.REASONING_PARSER_NONE,
        reasoning_start=None,
        reasoning_end=None,
    )


def test_llama3_json_style_answers_with_the_call() -> None:
    # The template refuses two calls in one turn: the separator is the default.
    protocol = derive_output_protocol(tokenizer("byte_fallback", "llama3_json_style.jinja"))
    assert protocol == OutputProtocol(
        tool_parser=pb.TOOL_PARSER_JSON_ANSWER,
        call_start=None,
        call_end=None,
        separator=";",
        reasoning_parser=pb.REASONING_PARSER_NONE,
        reasoning_start=None,
        reasoning_end=None,
    )


def test_a_json_answer_takes_its_start_and_separator_from_the_template() -> None:
    start = "{% if m.tool_calls %}<|python_tag|>{% endif %}"
    template = chatml(start + each(JSON_CALL, between=" | "))
    protocol = derive_output_protocol(tokenizer("qwen", template))
    assert protocol.tool_parser == pb.TOOL_PARSER_JSON_ANSWER
    assert protocol.call_start == Marker("<|python_tag|>", None)
    assert protocol.call_end is None
    assert protocol.separator == "|"


def test_json_answers_separated_by_whitespace_alone_are_refused() -> None:
    with pytest.raises(OutputProtocolError, match="whitespace alone"):
        derive_output_protocol(tokenizer("qwen", chatml(each(JSON_CALL, between="\n"))))


def test_an_unknown_call_format_is_refused_with_its_rendering() -> None:
    template = chatml(each("[[CALL name={{ c.function.name }} args={{ c.function.arguments }}]]"))
    with pytest.raises(OutputProtocolError, match="does not recognize") as refused:
        derive_output_protocol(tokenizer("qwen", template))
    assert "[[CALL name=probe_tool_name" in str(refused.value)
    assert isinstance(refused.value, ExportError)  # the CLI reports it as an export error


def test_calls_sharing_one_pair_of_markers_are_refused() -> None:
    # One JSON list for all the calls of a turn: a single call looks tagged by
    # "[TOOL_CALLS][" and "]", two calls show the markers do not wrap each call.
    template = chatml(
        "{% if m.tool_calls %}[TOOL_CALLS]"
        "{{ m.tool_calls | map(attribute='function') | list | tojson }}{% endif %}"
    )
    with pytest.raises(OutputProtocolError, match="not each between"):
        derive_output_protocol(tokenizer("qwen", template))


def test_tools_rendered_without_calls_are_refused() -> None:
    with pytest.raises(OutputProtocolError, match="renders the tools but not"):
        derive_output_protocol(tokenizer("qwen", chatml("")))


def test_calls_in_tags_without_tools_are_instructed_with_the_templates_markers() -> None:
    tok = tokenizer("qwen", chatml(each("<tool_call>" + JSON_CALL + "</tool_call>"), tools=False))
    protocol = derive_output_protocol(tok)
    assert protocol.tool_parser == pb.TOOL_PARSER_JSON_INSTRUCTED
    assert protocol.call_start == Marker("<tool_call>", added(tok, "<tool_call>"))
    assert protocol.call_end == Marker("</tool_call>", added(tok, "</tool_call>"))


def test_a_bare_json_answer_without_tools_is_refused() -> None:
    with pytest.raises(OutputProtocolError, match="never renders the tools"):
        derive_output_protocol(tokenizer("qwen", chatml(each(JSON_CALL), tools=False)))


def test_reasoning_shown_only_in_the_last_turn_is_found() -> None:
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if loop.last and m.reasoning_content %}[THINK]{{ m.reasoning_content }}[/THINK]"
        "{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    protocol = derive_output_protocol(tokenizer("qwen", template))
    assert protocol.reasoning_parser == pb.REASONING_PARSER_THINK_TAGS
    assert protocol.reasoning_start == Marker("[THINK]", None)
    assert protocol.reasoning_end == Marker("[/THINK]", None)


def test_reasoning_markers_come_from_the_empty_block_of_enable_thinking_false() -> None:
    # reasoning_content is never rendered; only the generation prompt shows the tags.
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}{% endif %}"
    )
    tok = tokenizer("qwen", template)
    protocol = derive_output_protocol(tok)
    assert protocol.tool_parser == pb.TOOL_PARSER_JSON_INSTRUCTED
    assert protocol.reasoning_parser == pb.REASONING_PARSER_THINK_TAGS
    assert protocol.reasoning_start == Marker("<think>", added(tok, "<think>"))
    assert protocol.reasoning_end == Marker("</think>", added(tok, "</think>"))


def test_no_chat_template_means_no_parsers() -> None:
    assert derive_output_protocol(tokenizer("qwen", None)) == NO_PROTOCOL
    assert derive_output_protocol(tokenizer("qwen", "qwen3.jinja"), "") == NO_PROTOCOL
    assert NO_PROTOCOL.tool_parser == pb.TOOL_PARSER_NONE
    assert NO_PROTOCOL.reasoning_parser == pb.REASONING_PARSER_NONE
    assert NO_PROTOCOL.tool_markers() is None and NO_PROTOCOL.reasoning_markers() is None


def test_a_marker_token_is_the_added_token_that_spells_it() -> None:
    qwen = tokenizer("qwen", None)
    assert marker_token(qwen, "<think>") == added(qwen, "<think>")
    assert marker_token(qwen, "U") is None  # one token, not an added one
    assert len(qwen.encode("<think>x", add_special_tokens=False)) > 1
    assert marker_token(qwen, "<think>x") is None
    words = word_level_tokenizer(16)
    # One added token, but <unk>, which does not spell it.
    assert words.encode("<tool_call>", add_special_tokens=False) == [added(words, "<unk>")]
    assert marker_token(words, "<tool_call>") is None


def written(protocol: OutputProtocol) -> pb.Frontend:
    frontend = pb.Frontend()
    set_output_protocol(frontend, protocol)
    read = pb.Frontend()
    read.ParseFromString(frontend.SerializeToString())
    return read


def test_the_frontend_carries_markers_with_their_token_ids() -> None:
    tok = tokenizer("qwen", "qwen3.jinja")
    frontend = written(derive_output_protocol(tok))
    assert frontend.tool_parser == pb.TOOL_PARSER_JSON_IN_TAGS
    assert frontend.reasoning_parser == pb.REASONING_PARSER_THINK_TAGS
    start, end = frontend.tool_markers.call_start, frontend.tool_markers.call_end
    assert (start.text, start.token_id) == ("<tool_call>", added(tok, "<tool_call>"))
    assert (end.text, end.token_id) == ("</tool_call>", added(tok, "</tool_call>"))
    think = frontend.reasoning_markers
    assert (think.start.text, think.start.token_id) == ("<think>", added(tok, "<think>"))
    assert (think.end.text, think.end.token_id) == ("</think>", added(tok, "</think>"))


def test_the_frontend_leaves_absent_token_ids_and_markers_unset() -> None:
    smollm2 = written(derive_output_protocol(tokenizer("smollm2", "smollm2.jinja")))
    assert smollm2.tool_parser == pb.TOOL_PARSER_JSON_INSTRUCTED
    assert smollm2.tool_markers.call_start.text == "<tool_call>"
    assert smollm2.tool_markers.call_end.text == "</tool_call>"
    assert not smollm2.tool_markers.call_start.HasField("token_id")
    assert not smollm2.tool_markers.call_end.HasField("token_id")
    assert smollm2.reasoning_parser == pb.REASONING_PARSER_NONE
    assert not smollm2.HasField("reasoning_markers")
    llama = written(derive_output_protocol(tokenizer("byte_fallback", "llama3_json_style.jinja")))
    assert llama.tool_parser == pb.TOOL_PARSER_JSON_ANSWER
    assert llama.HasField("tool_markers")
    assert not llama.tool_markers.HasField("call_start")
    assert not llama.tool_markers.HasField("call_end")
    assert llama.tool_markers.separator == ";"
    none = written(NO_PROTOCOL)
    assert none.tool_parser == pb.TOOL_PARSER_NONE
    assert none.reasoning_parser == pb.REASONING_PARSER_NONE
    assert not none.HasField("tool_markers") and not none.HasField("reasoning_markers")
