//! One JSON tool call (`{"name": .., "arguments": ..}`), scanned as it
//! arrives: the name is announced once complete, and the arguments' raw text
//! is streamed as written (never re-serialized).

use super::parser::OutputEvent;

/// Where the scanner is between the top-level object's members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Key,
    Colon,
    Value,
    /// Inside a number, literal or other bare value.
    Bare,
    CommaOrEnd,
}

/// How the arguments were written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Arguments {
    /// Not (yet) seen.
    Absent,
    /// An object or array from `start`: streamed raw up to `end`.
    Raw {
        start: usize,
        end: usize,
        done: bool,
    },
    /// A JSON string holding the arguments' text, or a bare value, given
    /// whole once complete.
    Whole(String),
}

/// The scanner of one call object.
#[derive(Debug, Clone)]
pub(super) struct JsonCall {
    index: usize,
    /// The object's text, from its `{`.
    raw: String,
    depth: u32,
    in_string: bool,
    escaped: bool,
    expect: Expect,
    /// Start of the top-level string or value being read.
    start: usize,
    /// End of the bare value being read (after its last non-space byte).
    bare_end: usize,
    key: Option<String>,
    name: Option<String>,
    arguments: Arguments,
    /// Bytes of the arguments' text already given out.
    sent: usize,
    announced: bool,
    closed: bool,
}

/// Keys whose value is the call's arguments.
const ARGUMENT_KEYS: [&str; 2] = ["arguments", "parameters"];

impl JsonCall {
    /// A scanner for call `index`; its first byte must be `{`.
    pub(super) fn new(index: usize) -> Self {
        Self {
            index,
            raw: String::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            expect: Expect::Key,
            start: 0,
            bare_end: 0,
            key: None,
            name: None,
            arguments: Arguments::Absent,
            sent: 0,
            announced: false,
            closed: false,
        }
    }

    /// The object's text so far.
    pub(super) fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether the call's name was announced (a start event went out).
    pub(super) fn announced(&self) -> bool {
        self.announced
    }

    /// Whether the object closed.
    pub(super) fn closed(&self) -> bool {
        self.closed
    }

    /// Scans `text`; returns how many of its bytes belong to the object (all
    /// of them unless it closed inside `text`).
    pub(super) fn push(&mut self, text: &str, events: &mut Vec<OutputEvent>) -> usize {
        let mut consumed = text.len();
        for (offset, c) in text.char_indices() {
            let at = self.raw.len();
            self.raw.push(c);
            self.scan(c, at);
            if self.closed {
                consumed = offset + c.len_utf8();
                break;
            }
        }
        self.emit(events);
        if self.closed && self.announced && self.arguments == Arguments::Absent {
            events.push(OutputEvent::ToolCallArguments {
                index: self.index,
                delta: "{}".to_owned(),
            });
        }
        consumed
    }

    fn scan(&mut self, c: char, at: usize) {
        if let Arguments::Raw { end, done, .. } = &mut self.arguments {
            if !*done {
                *end = at + c.len_utf8();
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 1 {
                    self.top_level_string_end(at + 1);
                }
            }
            return;
        }
        if self.expect == Expect::Bare && self.depth == 1 {
            match c {
                ',' | '}' => {
                    self.value_end(self.bare_end);
                }
                c if c.is_whitespace() => return,
                _ => {
                    self.bare_end = at + c.len_utf8();
                    return;
                }
            }
        }
        match c {
            '"' => {
                self.in_string = true;
                if self.depth == 1 && matches!(self.expect, Expect::Key | Expect::Value) {
                    self.start = at;
                }
            }
            '{' | '[' => {
                if self.depth == 1 && self.expect == Expect::Value {
                    self.start = at;
                    self.container_value();
                }
                self.depth += 1;
            }
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    self.value_end(at + 1);
                } else if self.depth == 0 {
                    self.closed = true;
                }
            }
            ':' if self.depth == 1 && self.expect == Expect::Colon => self.expect = Expect::Value,
            ',' if self.depth == 1 => self.expect = Expect::Key,
            c if c.is_whitespace() => {}
            _ if self.depth == 1 && self.expect == Expect::Value => {
                self.start = at;
                self.bare_end = at + c.len_utf8();
                self.expect = Expect::Bare;
            }
            _ => {}
        }
    }

    fn top_level_string_end(&mut self, end: usize) {
        match self.expect {
            Expect::Key => {
                self.key = serde_json::from_str(&self.raw[self.start..end]).ok();
                self.expect = Expect::Colon;
            }
            Expect::Value => self.value_end(end),
            _ => {}
        }
    }

    /// An object or array value begins at `self.start`.
    fn container_value(&mut self) {
        if self.is_arguments_key() {
            self.arguments = Arguments::Raw {
                start: self.start,
                end: self.start + 1,
                done: false,
            };
        }
    }

    fn is_arguments_key(&self) -> bool {
        let key = self.key.as_deref();
        self.arguments == Arguments::Absent && key.is_some_and(|key| ARGUMENT_KEYS.contains(&key))
    }

    /// The top-level value from `self.start` ended at `end`.
    fn value_end(&mut self, end: usize) {
        let value = &self.raw[self.start..end];
        match self.key.as_deref() {
            Some("name") if self.name.is_none() => {
                self.name = serde_json::from_str::<String>(value).ok();
            }
            Some(_) if self.is_arguments_key() => {
                let text = match serde_json::from_str::<serde_json::Value>(value) {
                    // No arguments written as an empty string: none at all.
                    Ok(serde_json::Value::String(text)) if text.trim().is_empty() => {
                        "{}".to_owned()
                    }
                    Ok(serde_json::Value::String(text)) => text,
                    Ok(serde_json::Value::Null) => "{}".to_owned(),
                    _ => value.to_owned(),
                };
                self.arguments = Arguments::Whole(text);
            }
            _ => {}
        }
        if let Arguments::Raw { done, .. } = &mut self.arguments {
            *done = true;
        }
        self.expect = Expect::CommaOrEnd;
    }

    /// Announces the name once known and gives out the arguments written
    /// since the last call.
    fn emit(&mut self, events: &mut Vec<OutputEvent>) {
        let Some(name) = &self.name else { return };
        if !self.announced {
            self.announced = true;
            events.push(OutputEvent::ToolCallStart {
                index: self.index,
                name: name.clone(),
            });
        }
        let (text, upto) = match &self.arguments {
            Arguments::Absent => return,
            Arguments::Raw { start, end, .. } => (&self.raw[*start..*end], end - start),
            Arguments::Whole(text) => (text.as_str(), text.len()),
        };
        if upto > self.sent {
            events.push(OutputEvent::ToolCallArguments {
                index: self.index,
                delta: text[self.sent..].to_owned(),
            });
            self.sent = upto;
        }
    }
}
