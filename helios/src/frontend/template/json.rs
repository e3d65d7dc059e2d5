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
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                ('{', '}'),
                &entries,
                style,
                depth,
                |out, (key, item), depth| {
                    write_string(out, key, style);
                    out.push_str(&style.key_separator);
                    write_value(out, item, style, depth)
                },
            )?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
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
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => push_escape(out, c as u32),
            c if style.ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    push_escape(out, u32::from(*unit));
                }
            }
            c => out.push(c),
        }
    }
}

fn push_escape(out: &mut String, unit: u32) {
    out.push_str(&format!("\\u{unit:04x}"));
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

    #[test]
    fn undefined_is_not_serializable() {
        let err = dumps(&Value::UNDEFINED, &JsonStyle::default()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadSerialization);
    }
}
