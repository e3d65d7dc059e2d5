//! Output-parser edge cases found in review, each a test that failed before
//! its fix: non-ASCII stray text inside an XML call, calls the end of the
//! output re-opens while giving text back, a call-start token right after a
//! call whose end token never came, a call marker merely mentioned inside
//! reasoning, and empty-string arguments.

mod protocol_support;

use helios::frontend::protocol::{
    Marker, MarkerKind, OutputProtocol, ReasoningSyntax, ToolFormat, ToolSet, ToolSyntax,
};
use protocol_support::{feed, text, Piece};
use serde_json::json;

fn tools() -> ToolSet {
    ToolSet::from_definitions(&[
        json!({"type": "function", "function": {"name": "f"}}),
        json!({"type": "function", "function": {"name": "g"}}),
    ])
    .unwrap()
}

fn protocol(format: ToolFormat, start: Marker, end: Option<Marker>) -> OutputProtocol {
    OutputProtocol {
        tools: Some(ToolSyntax {
            format,
            call_start: Some(start),
            call_end: end,
            separator: String::new(),
        }),
        reasoning: None,
    }
}

fn token(text: &str, id: u32) -> Marker {
    Marker {
        text: text.to_owned(),
        token_id: Some(id),
    }
}

fn tagged(format: ToolFormat) -> OutputProtocol {
    protocol(
        format,
        Marker::text("<tool_call>"),
        Some(Marker::text("</tool_call>")),
    )
}

fn by_tokens() -> OutputProtocol {
    protocol(
        ToolFormat::JsonInTags,
        token("<tool_call>", 10),
        Some(token("</tool_call>", 11)),
    )
}

#[test]
fn non_ascii_stray_text_between_xml_parameters_is_skipped() {
    let output = "<tool_call>\n<function=f>\né stray\n</function>\n</tool_call>";
    let (_, parsed) = feed(
        &tagged(ToolFormat::XmlFunctions),
        Some(&tools()),
        false,
        &[text(output)],
    );
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].arguments, "{}");
}

#[test]
fn text_given_back_at_the_end_is_parsed_to_its_end() {
    let input = "<tool_call>{<tool_call>{";
    let (events, parsed) = feed(
        &tagged(ToolFormat::JsonInTags),
        Some(&tools()),
        false,
        &[text(input)],
    );
    assert_eq!(parsed.text, input, "{events:?}");
    // A call the given-back text opens and the output cuts is still ended.
    let input = "<tool_call>{\"a\": <tool_call>{\"name\": \"f\"";
    let (_, parsed) = feed(
        &tagged(ToolFormat::JsonInTags),
        Some(&tools()),
        false,
        &[text(input)],
    );
    assert_eq!(parsed.calls.len(), 1);
    assert!(!parsed.calls[0].complete);
}

#[test]
fn a_call_start_token_after_a_call_without_its_end_token_opens_a_call() {
    let (events, parsed) = feed(
        &by_tokens(),
        Some(&tools()),
        false,
        &[
            Piece::Marker(MarkerKind::CallStart),
            text("\n{\"name\": \"f\", \"arguments\": {}}\n"),
            Piece::Marker(MarkerKind::CallStart),
            text("\n{\"name\": \"g\", \"arguments\": {}}\n"),
            Piece::Marker(MarkerKind::CallEnd),
        ],
    );
    let names: Vec<&str> = parsed.calls.iter().map(|call| call.name.as_str()).collect();
    assert_eq!(names, ["f", "g"], "{events:?}");
    assert_eq!(parsed.text, "");
}

#[test]
fn a_call_marker_mentioned_in_reasoning_keeps_it_reasoning() {
    let protocol = OutputProtocol {
        reasoning: Some(ReasoningSyntax {
            start: token("<think>", 1),
            end: token("</think>", 2),
        }),
        ..by_tokens()
    };
    let (events, parsed) = feed(
        &protocol,
        Some(&tools()),
        true,
        &[
            text("I will use "),
            Piece::Marker(MarkerKind::CallStart),
            text(" tags for the call."),
            Piece::Marker(MarkerKind::ReasoningEnd),
            text("Answer"),
        ],
    );
    assert_eq!(
        parsed.reasoning, "I will use <tool_call> tags for the call.",
        "{events:?}"
    );
    assert_eq!(parsed.text, "Answer");
    assert!(parsed.calls.is_empty());
}

#[test]
fn empty_string_arguments_are_an_empty_object() {
    let output = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"\"}\n</tool_call>";
    let (_, parsed) = feed(
        &tagged(ToolFormat::JsonInTags),
        Some(&tools()),
        false,
        &[text(output)],
    );
    assert_eq!(parsed.calls[0].arguments, "{}");
}
