//! Python's text conventions where Jinja2 exposes them: `str()` of values
//! (what `{{ x }}` prints), `repr()` inside containers, float `repr`, and
//! `str.isspace` for `strip()`.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// Python's `str.isspace` for one character: Unicode white space plus the
/// ASCII information separators U+001C..U+001F, which Python counts too.
pub(crate) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` with no argument.
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// Python's `str.rstrip()` with no argument.
pub(crate) fn rstrip(s: &str) -> &str {
    s.trim_end_matches(is_space)
}

/// Python's `str.lstrip()` with no argument.
pub(crate) fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

/// Python's `str.split()` with no separator: runs of white space separate,
/// and no empty strings result.
pub(crate) fn split_whitespace(s: &str) -> Vec<&str> {
    s.split(is_space).filter(|part| !part.is_empty()).collect()
}

/// Python's `str.title()`: a cased character after another cased character
/// is lowered, any other is upper-cased (words break at every non-letter).
pub(crate) fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for c in s.chars() {
        if previous_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        previous_cased = c.is_uppercase() || c.is_lowercase();
    }
    out
}

/// `str(value)` as Jinja2 prints it: strings as they are, `None`, `True`,
/// Python float and container `repr`s, and nothing for an undefined value.
pub(crate) fn str_of(value: &Value) -> Result<String, Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(String::new()),
        ValueKind::String => Ok(value.as_str().unwrap_or_default().to_owned()),
        _ => repr(value),
    }
}

/// `repr(value)` for the values a template can hold.
pub(crate) fn repr(value: &Value) -> Result<String, Error> {
    let mut out = String::new();
    write_repr(&mut out, value)?;
    Ok(out)
}

fn write_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(value)?),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            // Tuples (from `dictsort`, `items()`, `(a, b)` literals) keep
            // Python's parentheses, and a one-tuple its trailing comma.
            let (open, close) = if value.is_tuple() {
                ('(', ')')
            } else {
                ('[', ']')
            };
            out.push(open);
            let mut count = 0;
            for (index, item) in value.try_iter()?.enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item)?;
                count += 1;
            }
            if value.is_tuple() && count == 1 {
                out.push(',');
            }
            out.push(close);
        }
        ValueKind::Map => {
            out.push('{');
            for (index, key) in value.try_iter()?.enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?)?;
            }
            out.push('}');
        }
        ValueKind::Bytes | ValueKind::Plain | ValueKind::Invalid => {
            out.push_str(&value.to_string());
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// A number as Python prints it: integers in decimal, floats as `repr`.
pub(crate) fn number(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        let int = i128::try_from(value.clone())?;
        Ok(int.to_string())
    } else {
        let float = f64::try_from(value.clone())
            .map_err(|_| Error::new(ErrorKind::InvalidOperation, "not a number"))?;
        Ok(float_repr(float))
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed
/// notation when the decimal exponent is in [-4, 16), else scientific with a
/// signed two-digit-minimum exponent (`1e+16`, `1.5e-07`).
pub(crate) fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let sci = format!("{value:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1;
    let body = if (-3..=16).contains(&point) {
        fixed(&digits, point)
    } else {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{first}{fraction}e{exp_sign}{:02}", exponent.abs())
    };
    format!("{sign}{body}")
}

/// `digits` with the decimal point after `point` digits, always with a
/// fractional part (`1.0`).
fn fixed(digits: &str, point: i32) -> String {
    let len = digits.len() as i32;
    if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else if point >= len {
        format!("{digits}{}.0", "0".repeat((point - len) as usize))
    } else {
        let (int, frac) = digits.split_at(point as usize);
        format!("{int}.{frac}")
    }
}

/// Python's `repr(str)`: single quotes unless the text has a single quote and
/// no double quote; backslash escapes for quotes, backslashes, `\t\n\r`, and
/// non-printable characters.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, for the categories it
/// rejects that templates meet: controls (Cc), separators other than the
/// ASCII space (Zs, Zl, Zp), common format characters (Cf) and private use
/// (Co). Unassigned code points (Cn) are printed as they are.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    let control = u < 0x20 || (0x7f..0xa0).contains(&u);
    let separator = matches!(
        u,
        0xa0 | 0x1680 | 0x2000..=0x200a | 0x2028 | 0x2029 | 0x202f | 0x205f | 0x3000
    );
    let format = matches!(
        u,
        0xad | 0x600..=0x605
            | 0x61c
            | 0x6dd
            | 0x70f
            | 0x180e
            | 0x200b..=0x200f
            | 0x202a..=0x202e
            | 0x2060..=0x2064
            | 0x2066..=0x206f
            | 0xfeff
            | 0xfff9..=0xfffb
            | 0x110bd
            | 0x1d173..=0x1d17a
            | 0xe0001
            | 0xe0020..=0xe007f
    );
    let private = matches!(u, 0xe000..=0xf8ff | 0xf0000..=0xffffd | 0x100000..=0x10fffd);
    !(control || separator || format || private)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (123456789.125, "123456789.125"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (f64::INFINITY, "inf"),
        ];
        for (value, expected) in cases {
            assert_eq!(float_repr(value), expected, "{value}");
        }
    }

    #[test]
    fn strings_repr_like_python() {
        let repr_of = |s: &str| repr(&Value::from(s)).unwrap();
        assert_eq!(repr_of("a"), "'a'");
        assert_eq!(repr_of("it's"), "\"it's\"");
        assert_eq!(repr_of("'\""), "'\\'\"'");
        assert_eq!(repr_of("\u{1}\u{a0}é\u{2028}"), "'\\x01\\xa0é\\u2028'");
    }

    #[test]
    fn python_whitespace_includes_information_separators() {
        assert_eq!(strip("\u{1c} a \u{3000}"), "a");
        assert_eq!(split_whitespace(" a\tb\u{1f}c "), vec!["a", "b", "c"]);
    }
}
