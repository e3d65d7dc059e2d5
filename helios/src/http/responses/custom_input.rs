//! A custom tool call's input as its arguments stream: the model writes
//! `{"input": "..."}` (the function a custom tool is presented as), and the
//! Responses API streams the string itself.
//!
//! [`InputReader`] decodes the string under `input` as the arguments
//! arrive, giving each piece once it is certain (an escape only when
//! whole). Arguments of another shape (possible where nothing constrained
//! them) stop the stream; [`InputReader::finish`] then gives the input the
//! whole arguments hold: the `input` string when there is one, else the
//! arguments' text as written.

use serde_json::Value;

use crate::frontend::protocol::CUSTOM_INPUT_KEY;

/// Where the reader is in the arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum State {
    /// Before the string: the text since the start.
    #[default]
    Head,
    /// Inside the string.
    In,
    /// After a `\`: the escape so far.
    Escape(String),
    /// After the string's closing quote.
    Done,
    /// The arguments are not `{"input": "..."}` as far as read.
    Lost,
}

/// Decodes one call's input ([module docs](self)).
#[derive(Debug, Clone, Default)]
pub(super) struct InputReader {
    state: State,
    /// The head's text without white space, while in [`State::Head`].
    head: String,
    /// The arguments so far.
    arguments: String,
    /// The input decoded so far (what was given out).
    decoded: String,
    /// A high surrogate waiting for its low half.
    high: Option<u16>,
}

impl InputReader {
    /// Reads `delta` of the arguments; the input text it completes.
    pub(super) fn push(&mut self, delta: &str) -> String {
        self.arguments.push_str(delta);
        let mut out = String::new();
        for c in delta.chars() {
            self.step(c, &mut out);
        }
        self.decoded.push_str(&out);
        out
    }

    /// The input read so far; after [`Self::finish`], the whole input.
    pub(super) fn decoded(&self) -> &str {
        &self.decoded
    }

    /// Ends the input: what of the whole input was not given out yet (empty
    /// when the streamed text is not a prefix of it, which only arguments of
    /// another shape can cause); [`Self::decoded`] is then the whole input.
    pub(super) fn finish(&mut self) -> String {
        let parsed = serde_json::from_str::<Value>(&self.arguments).ok();
        let input = match parsed.as_ref().and_then(|v| v.get(CUSTOM_INPUT_KEY)) {
            Some(Value::String(input)) => input.clone(),
            _ if self.state == State::Lost || parsed.is_some() => self.arguments.clone(),
            // Cut off inside the string: what was decoded.
            _ => self.decoded.clone(),
        };
        let rest = (input.strip_prefix(self.decoded.as_str()))
            .unwrap_or_default()
            .to_owned();
        self.decoded = input;
        rest
    }

    fn step(&mut self, c: char, out: &mut String) {
        self.state = match std::mem::take(&mut self.state) {
            State::Head => {
                let wanted = format!("{{\"{CUSTOM_INPUT_KEY}\":\"");
                let between = [
                    "",
                    "{",
                    &wanted[..wanted.len() - 2],
                    &wanted[..wanted.len() - 1],
                ];
                if c.is_whitespace() {
                    match between.contains(&self.head.as_str()) {
                        true => State::Head,
                        false => State::Lost,
                    }
                } else {
                    self.head.push(c);
                    match (self.head == wanted, wanted.starts_with(&self.head)) {
                        (true, _) => State::In,
                        (false, true) => State::Head,
                        (false, false) => State::Lost,
                    }
                }
            }
            State::In => match c {
                '"' => State::Done,
                '\\' => State::Escape(String::new()),
                c if self.high.is_some() => {
                    let _ = c;
                    State::Lost
                }
                c => {
                    out.push(c);
                    State::In
                }
            },
            State::Escape(mut escape) => {
                escape.push(c);
                match self.escaped(&escape, out) {
                    Some(true) => State::In,
                    Some(false) => State::Escape(escape),
                    None => State::Lost,
                }
            }
            state @ (State::Done | State::Lost) => state,
        }
    }

    /// Decodes the escape `escape` (after its `\`) into `out`: `Some(true)`
    /// when whole, `Some(false)` when it needs more, `None` when invalid.
    fn escaped(&mut self, escape: &str, out: &mut String) -> Option<bool> {
        let simple = match escape {
            "\"" => Some('"'),
            "\\" => Some('\\'),
            "/" => Some('/'),
            "b" => Some('\u{8}'),
            "f" => Some('\u{c}'),
            "n" => Some('\n'),
            "r" => Some('\r'),
            "t" => Some('\t'),
            _ => None,
        };
        if let Some(c) = simple {
            if self.high.is_some() {
                return None;
            }
            out.push(c);
            return Some(true);
        }
        let hex = escape.strip_prefix('u')?;
        if hex.len() < 4 {
            return hex.chars().all(|c| c.is_ascii_hexdigit()).then_some(false);
        }
        let unit = u16::from_str_radix(hex, 16).ok()?;
        match (self.high.take(), unit) {
            (None, 0xD800..=0xDBFF) => {
                self.high = Some(unit);
                Some(true)
            }
            (Some(high), 0xDC00..=0xDFFF) => {
                let code =
                    0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                out.push(char::from_u32(code)?);
                Some(true)
            }
            (None, unit) => {
                out.push(char::from_u32(u32::from(unit))?);
                Some(true)
            }
            (Some(_), _) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `arguments` read in pieces of `size` characters: the streamed text
    /// and the final input.
    fn read(arguments: &str, size: usize) -> (String, String, String) {
        let mut reader = InputReader::default();
        let chars: Vec<char> = arguments.chars().collect();
        let streamed: String = chars
            .chunks(size)
            .map(|piece| reader.push(&piece.iter().collect::<String>()))
            .collect();
        let rest = reader.finish();
        (streamed, rest, reader.decoded().to_owned())
    }

    #[test]
    fn the_input_streams_decoded_in_any_pieces() {
        let text = "line \"one\"\n\ttab \\ back \u{e9} \u{1f600} / end";
        let arguments = serde_json::json!({"input": text}).to_string();
        let spaced = format!(
            "{{ \"input\" :  {} }}",
            serde_json::to_string(text).unwrap()
        );
        // And with every escape JSON allows.
        let escaped = r#"{"input": "line \"one\"\n\ttab \\ back \u00e9 \ud83d\ude00 \/ end"}"#;
        for arguments in [arguments, spaced, escaped.to_owned()] {
            for size in [1, 2, 3, 7, 1000] {
                let (streamed, rest, input) = read(&arguments, size);
                assert_eq!(input, text, "{arguments} by {size}");
                assert_eq!(format!("{streamed}{rest}"), text, "{arguments} by {size}");
                assert_eq!(streamed, text, "{arguments} by {size}: all streamed");
            }
        }
    }

    #[test]
    fn other_arguments_give_their_text_and_a_cut_string_what_was_read() {
        let (streamed, rest, input) = read("{\"patch\": \"x\"}", 1);
        assert_eq!(
            (streamed.as_str(), input.as_str()),
            ("", "{\"patch\": \"x\"}")
        );
        assert_eq!(rest, input);
        let (streamed, rest, input) = read("{\"input\": \"half a \\", 2);
        assert_eq!(
            (streamed.as_str(), rest.as_str(), input.as_str()),
            ("half a ", "", "half a ")
        );
    }
}
