//! The streaming output parser: answer text, reasoning and tool calls from
//! output that arrives in pieces.
//!
//! Rules, each with its reason:
//! - events only append: text that may still begin a marker (or, around
//!   calls, trailing white space) is held back until it is decided, and
//!   released at the end, so a stream never takes anything back and the
//!   concatenation of its deltas is the collected result;
//! - a marker that is one added token is detected by its id
//!   ([`OutputParser::push_marker`]), never by text: the same characters
//!   written as ordinary tokens are text;
//! - reasoning starts inside when the prompt ends with an open start marker,
//!   ends at the end marker or at a tool call opening (which closes it), and
//!   is released as reasoning when truncated;
//! - a call's name is announced once, when complete, and its arguments'
//!   raw text follows as written (JSON formats); a call without arguments has
//!   `{}`; a call marker not followed by a call's syntax is text, so prose
//!   that mentions a marker loses nothing;
//! - a call truncated by the output limit ends incomplete (its arguments as
//!   far as they were written); one whose name never completed is text;
//! - white space between calls, after the last call and at the edges of
//!   reasoning is dropped; without tools or reasoning the text passes
//!   through exactly.

use super::json_call::JsonCall;
use super::scan::{earliest, partial_start, split_trailing_space};
use super::tools::ToolSet;
use super::xml_call::{XmlCall, XmlStep};
use super::{MarkerKind, OutputProtocol, ReasoningSyntax, ToolFormat, ToolSyntax};

/// What the parser makes of the output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// Call `index` (0, 1, ... in output order) names its tool; exactly once,
    /// before its arguments.
    ToolCallStart {
        /// The call's position.
        index: usize,
        /// The tool's name, as written.
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    ToolCallArguments {
        /// The call's position.
        index: usize,
        /// Text appended to the arguments.
        delta: String,
    },
    /// Call `index` ended: `complete` unless the output stopped inside it.
    ToolCallEnd {
        /// The call's position.
        index: usize,
        /// Whether the call's syntax closed.
        complete: bool,
    },
}

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    /// The tool's name.
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
    /// Whether the call's syntax closed.
    pub complete: bool,
}

/// The events folded: what a non-streamed response presents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Answer text.
    pub text: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Tool calls, in order.
    pub calls: Vec<ParsedToolCall>,
}

impl ParsedOutput {
    /// Adds one event.
    pub fn apply(&mut self, event: &OutputEvent) {
        match event {
            OutputEvent::Text(text) => self.text.push_str(text),
            OutputEvent::Reasoning(text) => self.reasoning.push_str(text),
            OutputEvent::ToolCallStart { name, .. } => self.calls.push(ParsedToolCall {
                name: name.clone(),
                arguments: String::new(),
                complete: false,
            }),
            OutputEvent::ToolCallArguments { index, delta } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.arguments.push_str(delta);
                }
            }
            OutputEvent::ToolCallEnd { index, complete } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.complete = *complete;
                }
            }
        }
    }
}

/// Where the parser is.
#[derive(Debug, Clone)]
enum Mode {
    /// Answer text.
    Text,
    /// The start of a [`ToolFormat::JsonAnswer`] answer: calls or text.
    AnswerStart,
    /// Inside reasoning.
    Reasoning,
    /// After a call's opening (`opening`, given back as text if no call
    /// follows), before its first byte.
    Opening { index: usize, opening: String },
    /// Inside a JSON call.
    Json { call: JsonCall, opening: String },
    /// Inside an XML call.
    Xml { call: XmlCall, opening: String },
    /// After a call, before its closing marker.
    Closing,
    /// After a [`ToolFormat::JsonAnswer`] call: a separator and another
    /// call, or the end.
    Between,
}

/// A text channel (answer or reasoning) that can hold back white space.
#[derive(Debug, Clone, Default)]
struct Channel {
    /// Trailing white space held back.
    held: String,
    /// Drop leading white space (at the start of a block).
    strip_leading: bool,
    /// Hold trailing white space at all.
    holds: bool,
}

impl Channel {
    /// What of `text` can go out now.
    fn push(&mut self, text: &str) -> Option<String> {
        let text = if self.strip_leading {
            let stripped = text.trim_start();
            if stripped.is_empty() {
                return None;
            }
            self.strip_leading = false;
            stripped
        } else {
            text
        };
        if !self.holds {
            return (!text.is_empty()).then(|| text.to_owned());
        }
        let (body, space) = split_trailing_space(text);
        if body.is_empty() {
            self.held.push_str(space);
            return None;
        }
        let mut out = std::mem::take(&mut self.held);
        out.push_str(body);
        self.held = space.to_owned();
        Some(out)
    }

    /// Starts a new block: held space is dropped, leading space will be.
    fn restart(&mut self) {
        self.held.clear();
        self.strip_leading = true;
    }
}

/// The parser of one request's output ([`OutputProtocol::parser`]).
#[derive(Debug, Clone)]
pub struct OutputParser {
    tools: Option<(ToolSyntax, ToolSet)>,
    reasoning: Option<ReasoningSyntax>,
    /// The call markers' texts, which stand for themselves when tools are
    /// not parsed.
    call_texts: [String; 2],
    /// The protocol's marker tokens.
    marker_tokens: Vec<(u32, MarkerKind)>,
    mode: Mode,
    /// Text not yet classified.
    pending: String,
    text: Channel,
    thinking: Channel,
    /// Calls opened so far.
    calls: usize,
    /// The open call began inside reasoning, which it closes once it is a
    /// call (and which goes on when it is not).
    call_from_reasoning: bool,
    events: Vec<OutputEvent>,
}

impl OutputParser {
    pub(super) fn new(
        protocol: &OutputProtocol,
        tools: Option<ToolSet>,
        starts_in_reasoning: bool,
    ) -> Self {
        let text_of = |marker: Option<&super::Marker>| marker.map(|m| m.text.clone());
        let syntax = protocol.tools.as_ref();
        let call_texts = [
            text_of(syntax.and_then(|s| s.call_start.as_ref())).unwrap_or_default(),
            text_of(syntax.and_then(|s| s.call_end.as_ref())).unwrap_or_default(),
        ];
        let tools = match (&protocol.tools, tools) {
            (Some(syntax), Some(set)) if !set.is_empty() => Some((syntax.clone(), set)),
            _ => None,
        };
        let reasoning = protocol.reasoning.clone();
        let in_reasoning = starts_in_reasoning && reasoning.is_some();
        let answer_start =
            matches!(&tools, Some((syntax, _)) if syntax.format == ToolFormat::JsonAnswer);
        let mode = if in_reasoning {
            Mode::Reasoning
        } else if answer_start {
            Mode::AnswerStart
        } else {
            Mode::Text
        };
        Self {
            text: Channel {
                holds: tools.is_some(),
                ..Channel::default()
            },
            thinking: Channel {
                holds: true,
                strip_leading: true,
                ..Channel::default()
            },
            tools,
            reasoning,
            call_texts,
            marker_tokens: protocol.marker_tokens(),
            mode,
            pending: String::new(),
            calls: 0,
            call_from_reasoning: false,
            events: Vec::new(),
        }
    }

    /// The kind of marker token `id` is, for [`Self::push_marker`].
    pub fn marker(&self, id: u32) -> Option<MarkerKind> {
        (self.marker_tokens.iter()).find_map(|&(token, kind)| (token == id).then_some(kind))
    }

    /// Whether tool calls are parsed.
    pub fn parses_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Feeds output text; the events it decides.
    pub fn push_text(&mut self, text: &str) -> Vec<OutputEvent> {
        self.pending.push_str(text);
        self.advance(true);
        std::mem::take(&mut self.events)
    }

    /// Feeds a marker token; the events it decides.
    pub fn push_marker(&mut self, kind: MarkerKind) -> Vec<OutputEvent> {
        // Held text cannot begin a text marker across a marker token.
        self.advance(false);
        let mode = std::mem::replace(&mut self.mode, Mode::Text);
        let tools = self.tools.is_some();
        self.mode = match (mode, kind) {
            (Mode::Text | Mode::AnswerStart, MarkerKind::ReasoningStart)
                if self.reasoning.is_some() =>
            {
                self.thinking.restart();
                Mode::Reasoning
            }
            (Mode::Reasoning, MarkerKind::ReasoningEnd) => self.close_reasoning(),
            (Mode::Text | Mode::AnswerStart, MarkerKind::CallStart) if tools => {
                self.open_call(false)
            }
            (Mode::Reasoning, MarkerKind::CallStart) if tools => self.open_call(true),
            (Mode::Closing | Mode::Between, MarkerKind::CallStart) if tools => {
                self.after_call();
                self.open_call(false)
            }
            (
                mode @ (Mode::Opening { .. } | Mode::Json { .. } | Mode::Xml { .. }),
                MarkerKind::CallStart,
            ) => {
                self.mode = self.end_open_call(mode);
                self.settle();
                let in_reasoning = matches!(self.mode, Mode::Reasoning);
                self.open_call(in_reasoning)
            }
            (Mode::Closing, MarkerKind::CallEnd) => self.after_call(),
            (
                mode @ (Mode::Opening { .. } | Mode::Json { .. } | Mode::Xml { .. }),
                MarkerKind::CallEnd,
            ) => {
                self.mode = self.end_open_call(mode);
                self.settle();
                std::mem::replace(&mut self.mode, Mode::Text)
            }
            (mode, kind) => {
                // Out of place: the marker's text is read where it fell.
                let text = self.marker_text(kind).to_owned();
                self.pending.push_str(&text);
                mode
            }
        };
        self.advance(true);
        std::mem::take(&mut self.events)
    }

    /// Ends the output: releases what was held, closes what is open.
    pub fn finish(&mut self) -> Vec<OutputEvent> {
        self.settle();
        if matches!(self.mode, Mode::Reasoning) {
            let held = std::mem::take(&mut self.thinking.held);
            self.reasoning_out(held);
        }
        self.mode = Mode::Text;
        let held = std::mem::take(&mut self.text.held);
        if self.calls == 0 && !held.is_empty() {
            self.events.push(OutputEvent::Text(held));
        }
        std::mem::take(&mut self.events)
    }

    /// Parses everything pending as if nothing followed, ending each call
    /// still open; text a call gives back is parsed again, and may open (and
    /// end) another: each round consumes an opening, so this ends.
    fn settle(&mut self) {
        loop {
            self.advance(false);
            match std::mem::replace(&mut self.mode, Mode::Text) {
                mode @ (Mode::Opening { .. } | Mode::Json { .. } | Mode::Xml { .. }) => {
                    self.mode = self.end_open_call(mode);
                }
                other => {
                    self.mode = other;
                    if self.pending.is_empty() {
                        return;
                    }
                }
            }
        }
    }

    fn marker_text(&self, kind: MarkerKind) -> &str {
        let reasoning = self.reasoning.as_ref();
        match kind {
            MarkerKind::ReasoningStart => reasoning.map_or("", |r| r.start.text.as_str()),
            MarkerKind::ReasoningEnd => reasoning.map_or("", |r| r.end.text.as_str()),
            MarkerKind::CallStart => &self.call_texts[0],
            MarkerKind::CallEnd => &self.call_texts[1],
        }
    }

    /// Text markers to look for in the current text or reasoning.
    fn text_markers(&self, in_reasoning: bool) -> Vec<(String, MarkerKind)> {
        let mut markers = Vec::with_capacity(2);
        if let Some(reasoning) = &self.reasoning {
            let marker = if in_reasoning {
                (reasoning.end.textual(), MarkerKind::ReasoningEnd)
            } else {
                (reasoning.start.textual(), MarkerKind::ReasoningStart)
            };
            if let (Some(text), kind) = marker {
                markers.push((text.to_owned(), kind));
            }
        }
        if let Some((syntax, _)) = &self.tools {
            let start = syntax.call_start.as_ref().and_then(|m| m.textual());
            if let (Some(text), false) = (start, syntax.format == ToolFormat::JsonAnswer) {
                markers.push((text.to_owned(), MarkerKind::CallStart));
            }
        }
        markers
    }

    fn advance(&mut self, hold: bool) {
        while !self.pending.is_empty() {
            let mode = std::mem::replace(&mut self.mode, Mode::Text);
            let (mode, progressed) = self.step(mode, hold);
            self.mode = mode;
            if !progressed {
                break;
            }
        }
    }

    /// One step in `mode`: the next mode, and whether to go on.
    fn step(&mut self, mode: Mode, hold: bool) -> (Mode, bool) {
        match mode {
            Mode::Text | Mode::Reasoning => {
                let in_reasoning = matches!(mode, Mode::Reasoning);
                let owned = self.text_markers(in_reasoning);
                let markers: Vec<(&str, MarkerKind)> = owned
                    .iter()
                    .map(|(text, kind)| (text.as_str(), *kind))
                    .collect();
                if let Some((at, kind, len)) = earliest(&self.pending, &markers) {
                    let before: String = self.pending.drain(..at + len).collect();
                    self.emit(in_reasoning, &before[..at]);
                    let next = match kind {
                        MarkerKind::ReasoningStart => {
                            self.thinking.restart();
                            Mode::Reasoning
                        }
                        MarkerKind::ReasoningEnd => self.close_reasoning(),
                        _ => self.open_call(in_reasoning),
                    };
                    return (next, true);
                }
                let texts: Vec<&str> = markers.iter().map(|(text, _)| *text).collect();
                let keep = if hold {
                    partial_start(&self.pending, &texts)
                } else {
                    self.pending.len()
                };
                let out: String = self.pending.drain(..keep).collect();
                self.emit(in_reasoning, &out);
                (mode, false)
            }
            Mode::AnswerStart => self.answer_start(hold),
            Mode::Opening { index, opening } => {
                let rest = self.pending.trim_start().to_owned();
                if rest.is_empty() && hold {
                    return (Mode::Opening { index, opening }, false);
                }
                // The space after the opening is part of it if no call follows.
                let mut opening = opening;
                opening.push_str(&self.pending[..self.pending.len() - rest.len()]);
                if rest.starts_with('{') {
                    let call = self.json_call(index);
                    self.pending = rest;
                    return (Mode::Json { call, opening }, true);
                }
                self.pending = rest;
                (self.not_a_call(&opening, "", false), true)
            }
            Mode::Json { mut call, opening } => {
                let consumed = call.push(&self.pending, &mut self.events);
                self.pending.drain(..consumed);
                self.confirm(&call.announced());
                if !call.closed() {
                    return (Mode::Json { call, opening }, false);
                }
                if !call.announced() {
                    return (self.not_a_call(&opening, call.raw(), true), true);
                }
                let index = self.calls - 1;
                self.events.push(OutputEvent::ToolCallEnd {
                    index,
                    complete: true,
                });
                (self.after_object(), true)
            }
            Mode::Xml { mut call, opening } => {
                let pending = std::mem::take(&mut self.pending);
                let tools = self.tools.as_ref().map(|(_, set)| set);
                let step = call.push(&pending, hold, tools, &mut self.events);
                self.confirm(&call.announced());
                match step {
                    XmlStep::Open => (Mode::Xml { call, opening }, false),
                    XmlStep::Closed(consumed) => {
                        self.pending = pending[consumed..].to_owned();
                        self.events.push(OutputEvent::ToolCallEnd {
                            index: self.calls - 1,
                            complete: true,
                        });
                        (Mode::Closing, true)
                    }
                    XmlStep::NotACall => (self.not_a_call(&opening, call.raw(), true), true),
                }
            }
            Mode::Closing => {
                let end = self.tools.as_ref().and_then(|(s, _)| s.call_end.clone());
                let rest = self.pending.trim_start().to_owned();
                if rest.is_empty() {
                    self.pending.clear();
                    return (Mode::Closing, false);
                }
                match end.as_ref().and_then(|m| m.textual().map(str::to_owned)) {
                    Some(end) if rest.starts_with(&end) => {
                        self.pending = rest[end.len()..].to_owned();
                        (self.after_call(), true)
                    }
                    Some(end) if hold && end.starts_with(&rest) => {
                        self.pending = rest;
                        (Mode::Closing, false)
                    }
                    // The call ended without its closing marker.
                    _ => {
                        self.pending = rest;
                        (self.after_call(), true)
                    }
                }
            }
            Mode::Between => {
                let separator = self.tools.as_ref().map(|(s, _)| s.separator.clone());
                let separator = separator.unwrap_or_default();
                let rest = self.pending.trim_start().to_owned();
                if rest.is_empty() {
                    self.pending.clear();
                    return (Mode::Between, false);
                }
                if !separator.is_empty() && rest.starts_with(&separator) {
                    self.pending = rest[separator.len()..].to_owned();
                    let index = self.calls;
                    return (
                        Mode::Opening {
                            index,
                            opening: separator,
                        },
                        true,
                    );
                }
                if hold && separator.starts_with(&rest) {
                    self.pending = rest;
                    return (Mode::Between, false);
                }
                self.pending = rest;
                (self.after_call(), true)
            }
        }
    }

    /// The start of a JSON-answer output: a reasoning block, a call, or text.
    fn answer_start(&mut self, hold: bool) -> (Mode, bool) {
        let rest = self.pending.trim_start().to_owned();
        let reasoning_start = (self.reasoning.as_ref())
            .and_then(|r| r.start.textual())
            .map(str::to_owned);
        let call_start = (self.tools.as_ref())
            .and_then(|(s, _)| s.call_start.as_ref())
            .and_then(|m| m.textual())
            .map(str::to_owned);
        if let Some(after) = (reasoning_start.as_deref()).and_then(|start| rest.strip_prefix(start))
        {
            self.pending = after.to_owned();
            self.thinking.restart();
            return (Mode::Reasoning, true);
        }
        if let Some(start) = &call_start {
            if let Some(after) = rest.strip_prefix(start.as_str()) {
                self.pending = after.to_owned();
                let index = self.calls;
                let opening = start.clone();
                return (Mode::Opening { index, opening }, true);
            }
        }
        if rest.starts_with('{') {
            self.pending = rest;
            let index = self.calls;
            let call = self.json_call(index);
            let opening = String::new();
            return (Mode::Json { call, opening }, true);
        }
        let undecided = rest.is_empty()
            || [reasoning_start, call_start]
                .into_iter()
                .flatten()
                .any(|marker| marker.starts_with(rest.as_str()));
        if hold && undecided {
            return (Mode::AnswerStart, false);
        }
        (Mode::Text, true)
    }

    fn json_call(&mut self, index: usize) -> JsonCall {
        self.calls = self.calls.max(index + 1);
        JsonCall::new(index)
    }

    /// A call opens (its opening marker was consumed).
    fn open_call(&mut self, from_reasoning: bool) -> Mode {
        self.call_from_reasoning = from_reasoning;
        let opening = self.marker_text(MarkerKind::CallStart).to_owned();
        let index = self.calls;
        match self.tools.as_ref().map(|(syntax, _)| syntax.format) {
            Some(ToolFormat::XmlFunctions) => {
                self.calls += 1;
                Mode::Xml {
                    call: XmlCall::new(index),
                    opening,
                }
            }
            _ => Mode::Opening { index, opening },
        }
    }

    /// Ends a call that is still open at a marker token or the output's end;
    /// the mode to go on in (reasoning, when it was a mention there).
    fn end_open_call(&mut self, mode: Mode) -> Mode {
        let index = self.calls.saturating_sub(1);
        match mode {
            Mode::Opening { opening, .. } => self.not_a_call(&opening, "", false),
            Mode::Json { call, .. } if call.announced() => {
                self.events.push(OutputEvent::ToolCallEnd {
                    index,
                    complete: call.closed(),
                });
                Mode::Text
            }
            Mode::Json { call, opening } => self.not_a_call(&opening, call.raw(), true),
            Mode::Xml { mut call, opening } => {
                // What the call holds back is final now.
                let tools = self.tools.as_ref().map(|(_, set)| set);
                let step = call.push("", false, tools, &mut self.events);
                if call.announced() {
                    self.events.push(OutputEvent::ToolCallEnd {
                        index,
                        complete: matches!(step, XmlStep::Closed(_)),
                    });
                    Mode::Text
                } else {
                    self.not_a_call(&opening, call.raw(), true)
                }
            }
            other => other,
        }
    }

    /// A call was announced: the white space held before it is dropped, and
    /// reasoning it opened inside is closed.
    fn confirm(&mut self, announced: &bool) {
        if *announced {
            self.text.held.clear();
            if std::mem::take(&mut self.call_from_reasoning) {
                self.close_reasoning();
            }
        }
    }

    /// What looked like a call is text: its opening goes out (as reasoning,
    /// when it was mentioned there), and `raw` (what followed it) is parsed
    /// again; the mode to parse it in. `took_index`: the call had taken the
    /// next call index, which it gives back.
    fn not_a_call(&mut self, opening: &str, raw: &str, took_index: bool) -> Mode {
        if took_index {
            self.calls = self.calls.saturating_sub(1);
        }
        let mut rest = raw.to_owned();
        rest.push_str(&self.pending);
        self.pending = rest;
        let in_reasoning = std::mem::take(&mut self.call_from_reasoning);
        self.emit(in_reasoning, opening);
        if in_reasoning {
            Mode::Reasoning
        } else {
            Mode::Text
        }
    }

    fn after_object(&self) -> Mode {
        match self.tools.as_ref().map(|(syntax, _)| syntax.format) {
            Some(ToolFormat::JsonAnswer) => Mode::Between,
            _ => Mode::Closing,
        }
    }

    fn after_call(&mut self) -> Mode {
        self.text.restart();
        Mode::Text
    }

    fn close_reasoning(&mut self) -> Mode {
        self.thinking.held.clear();
        self.text.restart();
        match &self.tools {
            Some((syntax, _)) if syntax.format == ToolFormat::JsonAnswer && self.calls == 0 => {
                Mode::AnswerStart
            }
            _ => Mode::Text,
        }
    }

    fn emit(&mut self, in_reasoning: bool, text: &str) {
        if in_reasoning {
            if let Some(out) = self.thinking.push(text) {
                self.reasoning_out(out);
            }
        } else if let Some(out) = self.text.push(text) {
            self.events.push(OutputEvent::Text(out));
        }
    }

    fn reasoning_out(&mut self, text: String) {
        if !text.is_empty() {
            self.events.push(OutputEvent::Reasoning(text));
        }
    }
}
