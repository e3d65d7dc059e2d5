//! The `tojson` filter as Transformers defines it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)`, not Jinja2's HTML-safe one.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use super::python;

/// How `json.dumps` lays out its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonStyle {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Indentation per level; `None` puts everything on one line.
    pub indent: Option<String>,
    /// Between items (`", "` on one line, `","` when indented).
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// Sort object keys.
    pub sort_keys: bool,
}

impl Default for JsonStyle {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".to_owned(),
            key_separator: ": ".to_owned(),
            sort_keys: false,
        }
    }
}

/// The filter: `x | tojson`, `x | tojson(indent=2)`, and the positional form
/// `tojson(ensure_ascii, indent, separators, sort_keys)` of Transformers'
/// signature.
pub(crate) fn tojson(value: &Value, args: &[Value], kwargs: Kwargs) -> Result<String, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let mut params: [Option<Value>; 4] = Default::default();
    for (slot, (name, positional)) in params.iter_mut().zip(NAMES.iter().zip(args.iter())) {
        if kwargs.has(name) {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson() got multiple values for argument {name:?}"),
            ));
        }
        *slot = Some(positional.clone());
    }
    for (slot, name) in params.iter_mut().zip(NAMES) {
        if slot.is_none() {
            *slot = kwargs.get::<Option<Value>>(name)?;
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = params;
    let indent = indent
        .filter(|v| !v.is_none())
        .map(indent_text)
        .transpose()?;
    let (item_separator, key_separator) = match separators.filter(|v| !v.is_none()) {
        Some(pair) => separator_pair(&pair)?,
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let style = JsonStyle {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    dumps(value, &style)
}

/// `indent` as Python takes it: a string as is, an integer as that many
/// spaces (none when zero or negative; `True` is 1).
fn indent_text(indent: Value) -> Result<String, Error> {
    if let Some(text) = indent.as_str() {
        return Ok(text.to_owned());
    }
    if indent.kind() == ValueKind::Bool {
        return Ok(if indent.is_true() { " " } else { "" }.to_owned());
    }
    let spaces = i64::try_from(indent)?;
    Ok(" ".repeat(usize::try_from(spaces).unwrap_or(0)))
}

fn separator_pair(pair: &Value) -> Result<(String, String), Error> {
    let parts: Vec<Value> = pair.try_iter()?.collect();
    match parts.as_slice() {
        [item, key] => match (item.as_str(), key.as_str()) {
            (Some(item), Some(key)) => Ok((item.to_owned(), key.to_owned())),
            _ => Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be strings",
            )),
        },
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "separators must be an (item_separator, key_separator) pair",
        )),
    }
}

/// Serializes `value` as `json.dumps` would with `style`.
pub(crate) fn dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

/// Serializes a JSON request value as `dumps` does its template value
/// ([`super::value::from_json`]), written straight from the JSON: a prompt
/// declaring tools writes each of them on every request, and building
/// template values first cost most of that.
pub(crate) fn dumps_json(value: &serde_json::Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &serde_json::Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    use serde_json::Value as Json;
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        // Numbers are the template value's own (integer or float, as parsed).
        Json::Number(_) => out.push_str(&number(&super::value::from_json(value))?),
        Json::String(text) => write_string(out, text, style),
        Json::Array(items) => {
            write_container(out, ('[', ']'), items, style, depth, |out, item, depth| {
                write_json(out, item, style, depth)
            })?;
        }
        Json::Object(map) => {
            let entries: Vec<(&String, &Json)> = map.iter().collect();
            write_object(out, entries, style, depth, |out, item, depth| {
                write_json(out, item, style, depth)
            })?;
        }
    }
    Ok(())
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::BadSerialization,
        format!("object of kind {} is not JSON serializable", value.kind()),
    )
}

fn write_value(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)?),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, style, depth, |out, item, depth| {
                write_value(out, item, style, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            // Key and value together where the map gives them, else by lookup.
            if let Some(pairs) = value.as_object().and_then(|map| map.try_iter_pairs()) {
                for (key, item) in pairs {
                    entries.push((key_text(&key)?, item));
                }
            } else {
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_text(&key)?, item));
                }
            }
            write_object(out, entries, style, depth, |out, item, depth| {
                write_value(out, item, style, depth)
            })?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// An object's `(key, value)` entries, sorted by key when `style` asks.
fn write_object<K: AsRef<str>, V>(
    out: &mut String,
    mut entries: Vec<(K, V)>,
    style: &JsonStyle,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &V, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    if style.sort_keys {
        entries.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
    }
    write_container(
        out,
        ('{', '}'),
        &entries,
        style,
        depth,
        |out, (key, item), depth| {
            write_string(out, key.as_ref(), style);
            out.push_str(&style.key_separator);
            write_item(out, item, depth)
        },
    )
}

fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    style: &JsonStyle,
    depth: usize,
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push_str(&style.item_separator);
        }
        newline(out, style, depth + 1);
        write_item(out, item, depth + 1)?;
    }
    newline(out, style, depth);
    out.push(close);
    Ok(())
}

fn newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// Numbers as `json.dumps` writes them: `float.__repr__`, except the
/// non-finite values, which it spells `NaN` and `Infinity`.
fn number(value: &Value) -> Result<String, Error> {
    let text = python::number(value)?;
    Ok(match text.as_str() {
        "nan" => "NaN".to_owned(),
        "inf" => "Infinity".to_owned(),
        "-inf" => "-Infinity".to_owned(),
        _ => text,
    })
}

/// Object keys as `json.dumps` converts them.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => number(key),
        _ => Err(Error::new(
            ErrorKind::BadSerialization,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

/// `text` as it is written inside a JSON string, as `json.dumps` writes it
/// without `ensure_ascii` (and as `serde_json` does): `\"`, `\\`, `\n`,
/// `\r`, `\t`, `\b`, `\f`, `\u00XX` for other control characters,
/// everything else raw.
pub(crate) fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The default style does not escape non-ASCII characters.
    write_escaped(&mut out, text, &JsonStyle::default());
    out
}

fn write_string(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    write_escaped(out, s, style);
    out.push('"');
}

fn write_escaped(out: &mut String, s: &str, style: &JsonStyle) {
    // Runs of characters written as they are go in one copy each.
    let mut run = 0;
    for (at, c) in s.char_indices() {
        let escape = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            c if (c as u32) < 0x20 || (style.ensure_ascii && !(' '..='~').contains(&c)) => None,
            _ => continue,
        };
        out.push_str(&s[run..at]);
        run = at + c.len_utf8();
        match escape {
            Some(text) => out.push_str(text),
            None => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    push_escape(out, u32::from(*unit));
                }
            }
        }
    }
    out.push_str(&s[run..]);
}

fn push_escape(out: &mut String, unit: u32) {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = write!(out, "\\u{unit:04x}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(items: Vec<Value>) -> Value {
        Value::from(items)
    }

    #[test]
    fn compact_and_indented_layouts_match_python() {
        let value = Value::from_pairs([
            ("b", seq(vec![Value::from(1), Value::from(2.5)])),
            ("a", Value::from_pairs::<_, &str, Value>([])),
        ]);
        assert_eq!(
            dumps(&value, &JsonStyle::default()).unwrap(),
            r#"{"b": [1, 2.5], "a": {}}"#
        );
        let indented = JsonStyle {
            indent: Some("  ".to_owned()),
            item_separator: ",".to_owned(),
            sort_keys: true,
            ..JsonStyle::default()
        };
        assert_eq!(
            dumps(&value, &indented).unwrap(),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5\n  ]\n}"
        );
    }

    #[test]
    fn strings_escape_like_python() {
        let text = Value::from("\"\\\n\u{1}\u{7f}é😀");
        assert_eq!(
            dumps(&text, &JsonStyle::default()).unwrap(),
            "\"\\\"\\\\\\n\\u0001\u{7f}é😀\""
        );
        let ascii = JsonStyle {
            ensure_ascii: true,
            ..JsonStyle::default()
        };
        assert_eq!(
            dumps(&text, &ascii).unwrap(),
            "\"\\\"\\\\\\n\\u0001\\u007f\\u00e9\\ud83d\\ude00\""
        );
    }

    /// A JSON value drawn from `seed`: nested arrays and objects (keys out
    /// of order, some repeated across levels), strings with escapes, control
    /// and non-ASCII characters, integers past `i64`, and floats Python
    /// writes in exponent form.
    fn drawn(seed: &mut u64, depth: usize) -> serde_json::Value {
        fn next(seed: &mut u64, n: u64) -> u64 {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) % n
        }
        let pieces = [
            "a", "é", "😀", "\"", "\\", "\n", "\u{1}", "\u{7f}", " ", "<tool>", "\t",
        ];
        let floats = [0.5, -0.0, 1.0, 1e16, 1.5e-7, 123456.789, f64::MAX, 3.0e-310];
        match next(seed, if depth == 0 { 6 } else { 8 }) {
            0 => serde_json::Value::Null,
            1 => serde_json::Value::Bool(next(seed, 2) == 1),
            2 => serde_json::json!(next(seed, 1000) as i64 - 500),
            3 => serde_json::json!(u64::MAX - next(seed, 10)),
            4 => serde_json::json!(floats[next(seed, floats.len() as u64) as usize]),
            5 => serde_json::Value::String(
                (0..next(seed, 6))
                    .map(|_| pieces[next(seed, pieces.len() as u64) as usize])
                    .collect(),
            ),
            6 => serde_json::Value::Array(
                (0..next(seed, 4)).map(|_| drawn(seed, depth - 1)).collect(),
            ),
            _ => {
                let mut map = serde_json::Map::new();
                for _ in 0..next(seed, 5) {
                    let key = ["z", "b", "name", "é", "a\"b", "type"][next(seed, 6) as usize];
                    map.insert(key.to_owned(), drawn(seed, depth - 1));
                }
                serde_json::Value::Object(map)
            }
        }
    }

    #[test]
    fn json_values_are_written_as_their_template_values_are() {
        let styles = [
            JsonStyle::default(),
            JsonStyle {
                ensure_ascii: true,
                indent: Some("  ".to_owned()),
                item_separator: ",".to_owned(),
                key_separator: ": ".to_owned(),
                sort_keys: true,
            },
            JsonStyle {
                item_separator: ",".to_owned(),
                key_separator: ":".to_owned(),
                sort_keys: true,
                ..JsonStyle::default()
            },
        ];
        let mut seed = 7;
        let mut nested = 0;
        for _ in 0..2000 {
            let value = drawn(&mut seed, 4);
            nested += usize::from(value.is_object() || value.is_array());
            for style in &styles {
                let through_template = dumps(&super::super::value::from_json(&value), style);
                assert_eq!(
                    dumps_json(&value, style).unwrap(),
                    through_template.unwrap()
                );
            }
        }
        assert!(nested > 500, "the draws were nested {nested} times");
        let tool = serde_json::json!({"type": "function", "function": {
            "name": "read_file", "parameters": {"type": "object", "required": ["path"],
            "properties": {"path": {"type": "string", "description": "a \"quoted\" path"}}}}});
        assert_eq!(
            dumps_json(&tool, &JsonStyle::default()).unwrap(),
            "{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"parameters\": \
             {\"type\": \"object\", \"required\": [\"path\"], \"properties\": {\"path\": \
             {\"type\": \"string\", \"description\": \"a \\\"quoted\\\" path\"}}}}}"
        );
    }

    #[test]
    fn undefined_is_not_serializable() {
        let err = dumps(&Value::UNDEFINED, &JsonStyle::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadSerialization);
    }
}
