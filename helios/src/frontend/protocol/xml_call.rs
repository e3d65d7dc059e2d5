//! One XML-style tool call
//! (`<function=NAME><parameter=KEY>VALUE</parameter>...</function>`),
//! scanned as it arrives. The arguments become a JSON object, each value
//! coerced by the tool's schema, given out a parameter at a time.

use serde_json::Value;

use super::parser::OutputEvent;
use super::scan::partial_start;
use super::tools::ToolSet;

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before `<function=`.
    Function,
    /// Inside `<function=NAME>`'s name.
    Name,
    /// Between parameters.
    Body,
    /// Inside `<parameter=KEY>`'s key.
    Key,
    /// Inside a value.
    Value,
}

/// What a push found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum XmlStep {
    /// All of the text belongs to the call so far.
    Open,
    /// `</function>` closed the call; the text's bytes from here on follow it.
    Closed(usize),
    /// The text after the call's opening is not a function: no call.
    NotACall,
}

/// The scanner of one call.
#[derive(Debug, Clone)]
pub(super) struct XmlCall {
    index: usize,
    phase: Phase,
    /// Text not yet consumed.
    pending: String,
    /// All text pushed, for the text fallback.
    raw: String,
    name: Option<String>,
    key: String,
    parameters: usize,
}

impl XmlCall {
    /// A scanner for call `index`.
    pub(super) fn new(index: usize) -> Self {
        Self {
            index,
            phase: Phase::Function,
            pending: String::new(),
            raw: String::new(),
            name: None,
            key: String::new(),
            parameters: 0,
        }
    }

    /// Everything pushed so far.
    pub(super) fn raw(&self) -> &str {
        &self.raw
    }

    /// Whether the call's name was announced.
    pub(super) fn announced(&self) -> bool {
        self.name.is_some()
    }

    /// Scans `text`; `hold` keeps back text that may still begin a tag
    /// (off at the end of the output, when nothing more can come).
    pub(super) fn push(
        &mut self,
        text: &str,
        hold: bool,
        tools: Option<&ToolSet>,
        events: &mut Vec<OutputEvent>,
    ) -> XmlStep {
        let before = self.raw.len();
        self.raw.push_str(text);
        self.pending.push_str(text);
        loop {
            match self.phase {
                Phase::Function => {
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(FUNCTION) {
                        self.pending = after.to_owned();
                        self.phase = Phase::Name;
                    } else if hold && FUNCTION.starts_with(rest) {
                        return XmlStep::Open;
                    } else {
                        return XmlStep::NotACall;
                    }
                }
                Phase::Name => {
                    let Some(end) = self.pending.find('>') else {
                        return XmlStep::Open;
                    };
                    let name = self.pending[..end].trim().to_owned();
                    self.pending.drain(..=end);
                    events.push(OutputEvent::ToolCallStart {
                        index: self.index,
                        name: name.clone(),
                    });
                    self.name = Some(name);
                    self.phase = Phase::Body;
                }
                Phase::Body => {
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(PARAMETER) {
                        self.pending = after.to_owned();
                        self.phase = Phase::Key;
                    } else if let Some(after) = rest.strip_prefix(FUNCTION_END) {
                        let after_len = after.len();
                        let close = if self.parameters == 0 { "{}" } else { "}" };
                        self.arguments(close.to_owned(), events);
                        self.pending.clear();
                        // The bytes after `</function>` belong to what follows.
                        let end = self.raw.len() - after_len;
                        self.raw.truncate(end);
                        return XmlStep::Closed(end - before);
                    } else if rest.is_empty()
                        || (hold
                            && [PARAMETER, FUNCTION_END]
                                .iter()
                                .any(|t| t.starts_with(rest)))
                    {
                        return XmlStep::Open;
                    } else {
                        // Stray text between parameters: skip to the next tag.
                        let first = rest.chars().next().map_or(0, char::len_utf8);
                        let skip = rest[first..].find('<').map_or(rest.len(), |at| at + first);
                        let dropped = self.pending.len() - rest.len() + skip;
                        self.pending.drain(..dropped);
                    }
                }
                Phase::Key => {
                    let Some(end) = self.pending.find('>') else {
                        return XmlStep::Open;
                    };
                    self.key = self.pending[..end].trim().to_owned();
                    self.pending.drain(..=end);
                    self.phase = Phase::Value;
                }
                Phase::Value => {
                    // A value ends at its closing tag only (where a grammar
                    // that constrains the call ends it too).
                    match self.pending.find(PARAMETER_END) {
                        Some(at) => {
                            let value = self.pending[..at].to_owned();
                            self.pending.drain(..at + PARAMETER_END.len());
                            self.parameter(&value, tools, events);
                            self.phase = Phase::Body;
                        }
                        None if hold => return XmlStep::Open,
                        None => {
                            let value = std::mem::take(&mut self.pending);
                            let keep = partial_start(&value, &[PARAMETER_END]);
                            self.parameter(&value[..keep], tools, events);
                            self.phase = Phase::Body;
                            return XmlStep::Open;
                        }
                    }
                }
            }
        }
    }

    fn parameter(&mut self, value: &str, tools: Option<&ToolSet>, events: &mut Vec<OutputEvent>) {
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let name = self.name.as_deref().unwrap_or_default();
        let coerced = coerce(value, tools.and_then(|t| t.parameter_type(name, &self.key)));
        let key = Value::from(self.key.as_str()).to_string();
        let opening = if self.parameters == 0 { "{" } else { ", " };
        self.parameters += 1;
        self.arguments(format!("{opening}{key}: {coerced}"), events);
    }

    fn arguments(&self, delta: String, events: &mut Vec<OutputEvent>) {
        events.push(OutputEvent::ToolCallArguments {
            index: self.index,
            delta,
        });
    }
}

/// A parameter's text as JSON, by the schema's type: numbers, booleans,
/// null, objects and arrays are parsed when they parse as that type;
/// everything else (strings, undeclared parameters) is a JSON string.
fn coerce(value: &str, kind: Option<&str>) -> String {
    let trimmed = value.trim();
    let parsed = serde_json::from_str::<Value>(trimmed).ok();
    let fits = match (kind, &parsed) {
        (Some("integer"), Some(Value::Number(n))) => n.is_i64() || n.is_u64(),
        (Some("number"), Some(Value::Number(_))) => true,
        (Some("null"), Some(Value::Null)) => true,
        (Some("object"), Some(Value::Object(_))) | (Some("array"), Some(Value::Array(_))) => true,
        _ => false,
    };
    if fits {
        return trimmed.to_owned();
    }
    if kind == Some("boolean") {
        match trimmed.to_ascii_lowercase().as_str() {
            "true" => return "true".to_owned(),
            "false" => return "false".to_owned(),
            _ => {}
        }
    }
    Value::from(value).to_string()
}

#[cfg(test)]
mod tests {
    use super::coerce;

    #[test]
    fn values_follow_the_schema_type() {
        assert_eq!(coerce("3", Some("integer")), "3");
        assert_eq!(coerce("3.5", Some("integer")), "\"3.5\"");
        assert_eq!(coerce(" 2.5 ", Some("number")), "2.5");
        assert_eq!(coerce("True", Some("boolean")), "true");
        assert_eq!(coerce("[1, 2]", Some("array")), "[1, 2]");
        assert_eq!(coerce("{\"a\": 1}", Some("object")), "{\"a\": 1}");
        assert_eq!(coerce("3", Some("string")), "\"3\"");
        assert_eq!(coerce("say \"hi\"", None), "\"say \\\"hi\\\"\"");
    }
}
