//! The output protocol: how the model writes reasoning and tool calls, and
//! the streaming parser that turns its output into typed events.
//!
//! Ignition derives the protocol at export from what the chat template
//! renders (never from a model's name) and records it in the core as two
//! independent enums with their marker strings ([`proto::ToolParser`],
//! [`proto::ReasoningParser`]); [`OutputProtocol::from_core`] reads and
//! checks them. Each request gets an [`OutputParser`] for the tools it
//! declares; the parser is fed the output as text pieces and as markers that
//! are single added tokens (detected by id, never by text), and yields
//! append-only [`OutputEvent`]s: the same events, in the same order, however
//! the output is split.

mod instruction;
mod json_call;
mod parser;
mod scan;
mod tools;
mod xml_call;

pub use instruction::{instructed_input, instructed_input_showing, ToolInstruction};
pub use parser::{OutputEvent, OutputParser, ParsedOutput, ParsedToolCall};
pub use tools::{schema_type, CustomInput, ToolSet, ToolSetError, CUSTOM_INPUT_KEY};

use crate::core::proto;

/// A delimiter the model writes: its text and, when it is one added token,
/// that token's id (then only the id detects it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The delimiter's text.
    pub text: String,
    /// The added token that spells it, if any.
    pub token_id: Option<u32>,
}

impl Marker {
    /// A marker detected by its text.
    pub fn text(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            token_id: None,
        }
    }

    /// Its text when the parser must look for it in text (it is no token).
    fn textual(&self) -> Option<&str> {
        match self.token_id {
            None if !self.text.is_empty() => Some(&self.text),
            _ => None,
        }
    }
}

/// Which delimiter a marker token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// Reasoning opens.
    ReasoningStart,
    /// Reasoning closes.
    ReasoningEnd,
    /// A tool call opens.
    CallStart,
    /// A tool call closes.
    CallEnd,
}

/// How tool calls are written; one reusable parser each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `{"name": .., "arguments": ..}` between the call markers.
    JsonInTags,
    /// `<function=NAME><parameter=KEY>VALUE</parameter></function>` between
    /// the call markers, values coerced by the tool's schema.
    XmlFunctions,
    /// The answer is the calls: JSON objects with `name` and `parameters`
    /// (or `arguments`), separated by the separator.
    JsonAnswer,
    /// [`Self::JsonInTags`], with the tools declared by the server's own
    /// system instruction because the template renders none.
    JsonInstructed,
}

/// The tool-call syntax of a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSyntax {
    /// The format.
    pub format: ToolFormat,
    /// What opens a call (optional for [`ToolFormat::JsonAnswer`]).
    pub call_start: Option<Marker>,
    /// What closes a call (none for [`ToolFormat::JsonAnswer`]).
    pub call_end: Option<Marker>,
    /// What separates calls in [`ToolFormat::JsonAnswer`].
    pub separator: String,
}

/// The reasoning syntax of a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningSyntax {
    /// What opens reasoning (`<think>`).
    pub start: Marker,
    /// What closes it (`</think>`).
    pub end: Marker,
}

/// A core's output protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputProtocol {
    /// Tool calls, when the output has them.
    pub tools: Option<ToolSyntax>,
    /// Reasoning, when the output has it.
    pub reasoning: Option<ReasoningSyntax>,
}

/// Why a core's output protocol cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the core's output protocol is invalid: {reason}; re-export the core")]
pub struct ProtocolError {
    /// What is wrong.
    pub reason: &'static str,
}

fn marker(message: Option<&proto::Marker>) -> Option<Marker> {
    let message = message?;
    (!message.text.is_empty()).then(|| Marker {
        text: message.text.clone(),
        token_id: message.token_id,
    })
}

impl OutputProtocol {
    /// The protocol a core's frontend declares. Unspecified enums are
    /// refused by core validation before this; a parser whose required
    /// markers are missing is refused here.
    pub fn from_core(frontend: &proto::Frontend) -> Result<Self, ProtocolError> {
        let invalid = |reason: &'static str| ProtocolError { reason };
        let tool_markers = frontend.tool_markers.as_ref();
        let call_start = marker(tool_markers.and_then(|m| m.call_start.as_ref()));
        let call_end = marker(tool_markers.and_then(|m| m.call_end.as_ref()));
        let format = match proto::ToolParser::try_from(frontend.tool_parser) {
            Ok(proto::ToolParser::JsonInTags) => Some(ToolFormat::JsonInTags),
            Ok(proto::ToolParser::XmlFunctions) => Some(ToolFormat::XmlFunctions),
            Ok(proto::ToolParser::JsonAnswer) => Some(ToolFormat::JsonAnswer),
            Ok(proto::ToolParser::JsonInstructed) => Some(ToolFormat::JsonInstructed),
            Ok(proto::ToolParser::None) => None,
            Ok(proto::ToolParser::Unspecified) | Err(_) => {
                return Err(invalid("frontend.tool_parser is unspecified or unknown"))
            }
        };
        let tools = match format {
            None => None,
            Some(ToolFormat::JsonAnswer) => {
                let separator = tool_markers.map(|m| m.separator.clone());
                let separator = separator.filter(|s| !s.is_empty());
                Some(ToolSyntax {
                    format: ToolFormat::JsonAnswer,
                    call_start,
                    call_end: None,
                    separator: separator.ok_or_else(|| {
                        invalid("a JSON_ANSWER tool parser needs tool_markers.separator")
                    })?,
                })
            }
            Some(format) => {
                if call_start.is_none() || call_end.is_none() {
                    return Err(invalid(
                        "this tool parser needs tool_markers.call_start and call_end",
                    ));
                }
                Some(ToolSyntax {
                    format,
                    call_start,
                    call_end,
                    separator: String::new(),
                })
            }
        };
        let reasoning =
            match proto::ReasoningParser::try_from(frontend.reasoning_parser) {
                Ok(proto::ReasoningParser::ThinkTags) => {
                    let markers = frontend.reasoning_markers.as_ref();
                    let start = marker(markers.and_then(|m| m.start.as_ref()));
                    let end = marker(markers.and_then(|m| m.end.as_ref()));
                    match (start, end) {
                        (Some(start), Some(end)) => Some(ReasoningSyntax { start, end }),
                        _ => return Err(invalid(
                            "a THINK_TAGS reasoning parser needs reasoning_markers.start and end",
                        )),
                    }
                }
                Ok(proto::ReasoningParser::None) => None,
                Ok(proto::ReasoningParser::Unspecified) | Err(_) => {
                    return Err(invalid(
                        "frontend.reasoning_parser is unspecified or unknown",
                    ))
                }
            };
        Ok(Self { tools, reasoning })
    }

    /// The kind of marker `id` is, if it is a marker token.
    pub fn marker_token(&self, id: u32) -> Option<MarkerKind> {
        (self.marker_tokens().into_iter()).find_map(|(token, kind)| (token == id).then_some(kind))
    }

    /// Every marker that is a token, with its kind.
    pub fn marker_tokens(&self) -> Vec<(u32, MarkerKind)> {
        let reasoning = self.reasoning.as_ref();
        let tools = self.tools.as_ref();
        [
            (reasoning.map(|r| &r.start), MarkerKind::ReasoningStart),
            (reasoning.map(|r| &r.end), MarkerKind::ReasoningEnd),
            (
                tools.and_then(|t| t.call_start.as_ref()),
                MarkerKind::CallStart,
            ),
            (tools.and_then(|t| t.call_end.as_ref()), MarkerKind::CallEnd),
        ]
        .into_iter()
        .filter_map(|(marker, kind)| Some((marker?.token_id?, kind)))
        .collect()
    }

    /// Whether output continuing `prompt` starts inside reasoning: the
    /// rendered prompt ends with an open reasoning marker (white space
    /// aside), as templates that force thinking on write it.
    pub fn starts_in_reasoning(&self, prompt: &str) -> bool {
        self.reasoning
            .as_ref()
            .is_some_and(|r| prompt.trim_end().ends_with(r.start.text.as_str()))
    }

    /// A parser for one request's output: tool calls are parsed when
    /// `tools` is given (the request declares tools and may call them).
    pub fn parser(&self, tools: Option<ToolSet>, starts_in_reasoning: bool) -> OutputParser {
        OutputParser::new(self, tools, starts_in_reasoning)
    }
}
