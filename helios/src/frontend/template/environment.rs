//! The MiniJinja environment configured as Transformers configures Jinja2
//! (`transformers/utils/chat_template_utils.py`, `_cached_compile_jinja_template`).

use std::fmt::Write as _;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value};

use super::{json, python};

/// Name under which the chat template is stored in its environment.
pub(crate) const TEMPLATE_NAME: &str = "chat_template";

/// The error `raise_exception` raises, found again in the render error's
/// source chain to become [`crate::frontend::FrontendError::TemplateException`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RaisedException(pub String);

/// An environment holding `source` as [`TEMPLATE_NAME`].
///
/// Jinja2 as Transformers sets it up: `trim_blocks` and `lstrip_blocks` on, a
/// single trailing newline dropped, no autoescaping, lenient undefined values,
/// `break`/`continue`, the `{% generation %}` tag (a plain block here: the
/// assistant mask it tracks is not needed for serving), the globals
/// `raise_exception` and `strftime_now`, and `tojson` as `json.dumps`.
/// Python compatibility beyond that: string/dict methods (`.strip()`,
/// `.items()`, ...), and values printed as Python's `str()` does (`None`,
/// `True`, `['a', 1]`).
pub(crate) fn environment(source: &str) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()?,
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(method);
    env.set_formatter(|out, _state, value| {
        let text = python::str_of(value)?;
        out.write_str(&text).map_err(|err| {
            Error::new(ErrorKind::WriteFailure, "cannot write output").with_source(err)
        })
    });
    env.add_filter("tojson", json::tojson);
    env.add_filter("string", |value: &Value| python::str_of(value));
    env.add_filter("trim", trim);
    env.add_test("sequence", is_sequence);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(TEMPLATE_NAME, generation_as_plain_block(source))?;
    Ok(env)
}

/// Python string methods, with Python's idea of white space where the
/// argument-less forms use it and Python's `str.title`; everything else is
/// MiniJinja's `pycompat`.
fn method(state: &mut State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let no_argument = match args {
            [] => true,
            [only] => only.is_none(),
            _ => false,
        };
        if no_argument {
            match name {
                "strip" => return Ok(Value::from(python::strip(s))),
                "lstrip" => return Ok(Value::from(python::lstrip(s))),
                "rstrip" => return Ok(Value::from(python::rstrip(s))),
                "title" => return Ok(Value::from(python::title(s))),
                "split" => {
                    let parts = python::split_whitespace(s).into_iter().map(Value::from);
                    return Ok(parts.collect());
                }
                _ => {}
            }
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args)
}

/// Jinja2's `sequence` test: anything with a length and items, so strings
/// and mappings too.
fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Bytes
    )
}

/// Jinja2's `trim(value, chars=None)`: `str.strip(chars)`.
fn trim(value: &Value, chars: Option<&str>) -> Result<String, Error> {
    let text = python::str_of(value)?;
    Ok(match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_owned(),
        None => python::strip(&text).to_owned(),
    })
}

/// `raise_exception(message)`: the template refuses its input.
fn raise_exception(message: &Value) -> Result<Value, Error> {
    let message = python::str_of(message)?;
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// `strftime_now(format)`: the local time formatted like Python's
/// `datetime.now().strftime(format)` (`%f` is microseconds there).
fn strftime_now(format: &str) -> Result<String, Error> {
    let mut chrono_format = String::with_capacity(format.len());
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        chrono_format.push(c);
        if c == '%' {
            match chars.next() {
                Some('f') => chrono_format.push_str("6f"),
                Some(next) => chrono_format.push(next),
                None => {}
            }
        }
    }
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&chrono_format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("invalid strftime format {format:?}"),
        )
    })?;
    Ok(out)
}

/// Rewrites Transformers' `{% generation %}` / `{% endgeneration %}` tags as
/// `{% if true %}` / `{% endif %}`, keeping their whitespace-control marks, so
/// that block trimming treats them exactly as Jinja2 treats the tag.
fn generation_as_plain_block(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_owned();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        match tag
            .find("%}")
            .and_then(|close| rewrite_tag(&tag[..close + 2]))
        {
            Some((replacement, len)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `{%- generation +%}` → `{%- if true +%}`; `None` for any other tag.
fn rewrite_tag(tag: &str) -> Option<(String, usize)> {
    let inner = tag.strip_prefix("{%")?.strip_suffix("%}")?;
    let (open_mark, inner) = split_mark(inner, true);
    let (close_mark, inner) = split_mark(inner, false);
    let replacement = match inner.trim() {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    Some((
        format!("{{%{open_mark} {replacement} {close_mark}%}}"),
        tag.len(),
    ))
}

/// Splits a leading (or trailing) `-`/`+` whitespace-control mark off.
fn split_mark(inner: &str, leading: bool) -> (&str, &str) {
    let is_mark = |c: char| c == '-' || c == '+';
    if leading {
        match inner.chars().next() {
            Some(c) if is_mark(c) => (&inner[..1], &inner[1..]),
            _ => ("", inner),
        }
    } else {
        match inner.chars().last() {
            Some(c) if is_mark(c) => (&inner[inner.len() - 1..], &inner[..inner.len() - 1]),
            _ => ("", inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            generation_as_plain_block(
                "a{%- generation %}b{% endgeneration -%}c{% if x %}{% endif %}"
            ),
            "a{%- if true %}b{% endif -%}c{% if x %}{% endif %}"
        );
    }

    #[test]
    fn strftime_now_formats_the_current_time() {
        let year = strftime_now("%Y|%f|%%f").unwrap();
        let parts: Vec<&str> = year.split('|').collect();
        assert_eq!(parts[0].len(), 4);
        assert_eq!(parts[1].len(), 6);
        assert_eq!(parts[2], "%f");
        assert!(strftime_now("%Q").is_err());
    }
}
