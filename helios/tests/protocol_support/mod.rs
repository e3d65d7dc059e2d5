//! Shared by the output-parser tests: pieces of output (text, or marker
//! tokens), fed to a parser, the events checked well formed and folded.
#![allow(dead_code)] // each test crate uses a different part

use helios::frontend::protocol::{MarkerKind, OutputEvent, OutputProtocol, ParsedOutput, ToolSet};

/// A piece of output: text, or a marker token.
#[derive(Debug, Clone)]
pub enum Piece {
    Text(String),
    Marker(MarkerKind),
}

/// A text piece.
pub fn text(text: &str) -> Piece {
    Piece::Text(text.to_owned())
}

/// Feeds `pieces` to a parser of `protocol`, checks the events are well
/// formed, and returns them with their fold.
pub fn feed(
    protocol: &OutputProtocol,
    tools: Option<&ToolSet>,
    in_reasoning: bool,
    pieces: &[Piece],
) -> (Vec<OutputEvent>, ParsedOutput) {
    let mut parser = protocol.parser(tools.cloned(), in_reasoning);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(match piece {
            Piece::Text(text) => parser.push_text(text),
            Piece::Marker(kind) => parser.push_marker(*kind),
        });
    }
    events.extend(parser.finish());
    well_formed(&events);
    let mut parsed = ParsedOutput::default();
    for event in &events {
        parsed.apply(event);
    }
    (events, parsed)
}

/// Calls are numbered in order and named once before their arguments;
/// every announced call ends exactly once; no event is empty.
pub fn well_formed(events: &[OutputEvent]) {
    let mut started = 0;
    let mut ended = Vec::new();
    for event in events {
        match event {
            OutputEvent::Text(text) | OutputEvent::Reasoning(text) => {
                assert!(!text.is_empty(), "an empty delta in {events:?}")
            }
            OutputEvent::ToolCallStart { index, name } => {
                assert_eq!(*index, started, "calls out of order in {events:?}");
                assert!(!name.is_empty());
                started += 1;
            }
            OutputEvent::ToolCallArguments { index, delta } => {
                assert!(*index < started && !ended.contains(index), "{events:?}");
                assert!(!delta.is_empty(), "an empty delta in {events:?}");
            }
            OutputEvent::ToolCallEnd { index, .. } => {
                assert!(*index < started && !ended.contains(index), "{events:?}");
                ended.push(*index);
            }
        }
    }
    assert_eq!(
        ended.len(),
        started,
        "every announced call ends once: {events:?}"
    );
}
