//! Grammars over the text inside a JSON string: a custom tool's input is a
//! string, and where the core's call format writes arguments as JSON, the
//! model writes that string escaped. Escaping is a homomorphism (each
//! character maps to a fixed text, whatever surrounds it), so the escaped
//! language of a grammar is the grammar with every string literal and
//! regex rewritten to match exactly the escaped forms of what it matched.
//!
//! Rules, each with its reason:
//! - one canonical escape per character, as `serde_json` writes it (`\"`,
//!   `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, `\u00XX` for other control
//!   characters, everything else raw), so the grammar and the parser that
//!   reads the string back agree on every byte;
//! - a Lark grammar's terminals become rules whose lexemes are runs of
//!   plain characters and whole escapes: the engine's lexer is greedy, and
//!   a terminal that may go on with an escape would otherwise swallow the
//!   `\` that starts the next terminal's escape (a line's text, then `\n`);
//! - a standalone regex (a regex tool's input, one lexeme) drops a leading
//!   `^` or `\A` and a trailing `$` or `\z` (the whole input is matched
//!   anyway, as OpenAI's regex tools write them); other anchors and word
//!   boundaries are refused, since the grammar engine matches none;
//! - `%import common.NAME` becomes NAME's definition (Lark's common
//!   terminals), escaped; other directives (`%ignore`, nested `%json`,
//!   `%lark`, `%regex`) and special tokens cannot be escaped and are refused.

use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Look, Repetition};

use super::GrammarError;
use crate::frontend::json_escaped;

/// Lark's common terminals: their names and regexes.
const COMMON: &[(&str, &str)] = &[
    ("DIGIT", "[0-9]"),
    ("HEXDIGIT", "[a-fA-F0-9]"),
    ("INT", "[0-9]+"),
    ("SIGNED_INT", "[+-]?[0-9]+"),
    ("DECIMAL", r"[0-9]+\.[0-9]*|\.[0-9]+"),
    (
        "FLOAT",
        r"([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+",
    ),
    (
        "SIGNED_FLOAT",
        r"[+-]?(([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)",
    ),
    (
        "NUMBER",
        r"[0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+",
    ),
    (
        "SIGNED_NUMBER",
        r"[+-]?([0-9]+|([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)",
    ),
    ("ESCAPED_STRING", r#""([^"\\]|\\.)*""#),
    ("LCASE_LETTER", "[a-z]"),
    ("UCASE_LETTER", "[A-Z]"),
    ("LETTER", "[A-Za-z]"),
    ("WORD", "[A-Za-z]+"),
    ("CNAME", "[_A-Za-z][_A-Za-z0-9]*"),
    ("WS_INLINE", "[ \t]+"),
    ("WS", "[ \t\x0C\r\n]+"),
    ("CR", "\r"),
    ("LF", "\n"),
    ("NEWLINE", "(\r?\n)+"),
];

fn refused(reason: impl Into<String>) -> GrammarError {
    GrammarError::Compile {
        reason: reason.into(),
    }
}

/// `text` as it is written inside a JSON string (one canonical escape per
/// character, as the templates' `tojson` and `serde_json` write it).
pub fn escape(text: &str) -> String {
    json_escaped(text)
}

/// The characters that are escaped: control characters, `"` and `\`.
fn escaped_class() -> ClassUnicode {
    ClassUnicode::new([
        ClassUnicodeRange::new('\0', '\u{1f}'),
        ClassUnicodeRange::new('"', '"'),
        ClassUnicodeRange::new('\\', '\\'),
    ])
}

/// `hir` matching the escaped forms of what it matched.
fn escaped(hir: Hir) -> Result<Hir, GrammarError> {
    Ok(match hir.into_kind() {
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0)
                .map_err(|_| refused("a regex matches bytes that are not UTF-8"))?;
            Hir::literal(escape(text).into_bytes())
        }
        HirKind::Class(Class::Unicode(class)) => {
            let mut plain = class.clone();
            plain.difference(&escaped_class());
            let mut special = class;
            special.intersect(&escaped_class());
            let mut branches = Vec::new();
            if plain.iter().next().is_some() {
                branches.push(Hir::class(Class::Unicode(plain)));
            }
            for range in special.iter() {
                for c in range.start()..=range.end() {
                    branches.push(Hir::literal(escape(&c.to_string()).into_bytes()));
                }
            }
            Hir::alternation(branches)
        }
        HirKind::Class(Class::Bytes(_)) => {
            return Err(refused("a regex matches bytes that are not UTF-8"))
        }
        HirKind::Look(look) => {
            return Err(refused(format!(
                "a regex uses {look:?}: anchors other than a leading ^ and a trailing $, and \
                 word boundaries, are not supported"
            )))
        }
        HirKind::Repetition(repetition) => Hir::repetition(Repetition {
            sub: Box::new(escaped(*repetition.sub)?),
            ..repetition
        }),
        HirKind::Capture(capture) => escaped(*capture.sub)?,
        HirKind::Concat(parts) => {
            Hir::concat(parts.into_iter().map(escaped).collect::<Result<_, _>>()?)
        }
        HirKind::Alternation(branches) => Hir::alternation(
            branches
                .into_iter()
                .map(escaped)
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// `hir` without a leading start anchor and a trailing end anchor (in
/// each branch of a top-level alternation).
fn unanchored(hir: Hir) -> Hir {
    let start = |hir: &Hir| matches!(hir.kind(), HirKind::Look(Look::Start | Look::StartLF));
    let end = |hir: &Hir| matches!(hir.kind(), HirKind::Look(Look::End | Look::EndLF));
    if start(&hir) || end(&hir) {
        return Hir::empty();
    }
    if !matches!(
        hir.kind(),
        HirKind::Concat(_) | HirKind::Alternation(_) | HirKind::Capture(_)
    ) {
        return hir;
    }
    match hir.into_kind() {
        HirKind::Concat(mut parts) => {
            if parts.first().is_some_and(start) {
                parts.remove(0);
            }
            if parts.last().is_some_and(end) {
                parts.pop();
            }
            Hir::concat(parts)
        }
        HirKind::Alternation(branches) => {
            Hir::alternation(branches.into_iter().map(unanchored).collect())
        }
        HirKind::Capture(capture) => unanchored(*capture.sub),
        _ => Hir::empty(),
    }
}

/// The regex `pattern` (Rust syntax) under Lark's `flags`, parsed.
fn parsed(pattern: &str, flags: &str) -> Result<Hir, GrammarError> {
    let pattern = if flags.is_empty() {
        pattern.to_owned()
    } else {
        format!("(?{flags}){pattern}")
    };
    regex_syntax::parse(&pattern)
        .map_err(|error| refused(format!("the regex does not parse: {error}")))
}

/// The regex `pattern` (Rust syntax, `flags` as Lark writes them) as the
/// engine's regex text, escaped for a JSON string when `quoted`, anchors
/// at its ends dropped.
pub fn regex(pattern: &str, flags: &str, quoted: bool) -> Result<String, GrammarError> {
    let hir = unanchored(parsed(pattern, flags)?);
    let hir = if quoted { escaped(hir)? } else { hir };
    Ok(hir.to_string())
}

/// `rx` as a Lark regex item (`/` inside escaped).
pub fn lark_regex(rx: &str) -> String {
    let mut out = String::with_capacity(rx.len() + 2);
    out.push('/');
    let mut chars = rx.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push(c);
                out.extend(chars.next());
            }
            '/' => out.push_str("\\/"),
            c => out.push(c),
        }
    }
    out.push('/');
    out
}

/// A Lark string literal's text: JSON escapes, and `\xXX`.
fn unquote(body: &str) -> Result<String, GrammarError> {
    let mut json = String::with_capacity(body.len() + 2);
    json.push('"');
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.clone().next() == Some('x') {
            chars.next();
            let hex: String = chars.by_ref().take(2).collect();
            json.push_str(&format!("\\u00{hex}"));
        } else {
            json.push(c);
            if c == '\\' {
                json.extend(chars.next());
            }
        }
    }
    json.push('"');
    serde_json::from_str(&json)
        .map_err(|_| refused(format!("the string \"{body}\" does not parse")))
}

/// Reads the Lark source from `at`: a string literal's body and flag, or a
/// regex's body and flags, and where it ends.
fn scan(source: &str, at: usize, delimiter: char, flags: &str) -> Option<(String, String, usize)> {
    let mut end = at + 1;
    let mut chars = source[end..].char_indices();
    let body_end = loop {
        let (offset, c) = chars.next()?;
        match c {
            '\\' => {
                chars.next();
            }
            c if c == delimiter => break end + offset,
            '\n' => return None,
            _ => {}
        }
    };
    end = body_end + 1;
    let flag_len = source[end..]
        .chars()
        .take_while(|c| flags.contains(*c))
        .map(char::len_utf8)
        .sum::<usize>();
    let body = source[at + 1..body_end].to_owned();
    let found = source[end..end + flag_len].to_owned();
    Some((body, found, end + flag_len))
}

/// The rule-level expression (Lark) of the escaped forms of what `hir`
/// matches. A grammar engine's lexer is greedy: a terminal that may go on
/// with an escape (`\t`) would swallow the `\` that starts the next
/// terminal (`\n`), so escaped terminals are rules whose lexemes are runs of
/// plain characters and whole escapes, never a partial escape.
fn expression(hir: &Hir) -> Result<String, GrammarError> {
    Ok(match hir.kind() {
        HirKind::Empty => "\"\"".to_owned(),
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0)
                .map_err(|_| refused("a regex matches bytes that are not UTF-8"))?;
            serde_json::Value::from(escape(text)).to_string()
        }
        HirKind::Class(Class::Unicode(class)) => characters(class, false),
        HirKind::Class(Class::Bytes(_)) => {
            return Err(refused("a regex matches bytes that are not UTF-8"))
        }
        HirKind::Look(look) => {
            return Err(refused(format!(
                "a grammar's regex uses {look:?}: anchors and word boundaries are not supported"
            )))
        }
        HirKind::Repetition(repetition) => {
            let op = match (repetition.min, repetition.max) {
                (0, None) => "*".to_owned(),
                (1, None) => "+".to_owned(),
                (0, Some(1)) => "?".to_owned(),
                (min, None) => format!("{{{min},}}"),
                (min, Some(max)) => format!("{{{min},{max}}}"),
            };
            match repetition.sub.kind() {
                // Unbounded runs of a class: runs of its plain characters.
                HirKind::Class(Class::Unicode(class)) if repetition.max.is_none() => {
                    format!("{}{op}", characters(class, true))
                }
                _ => format!("({}){op}", expression(&repetition.sub)?),
            }
        }
        HirKind::Capture(capture) => expression(&capture.sub)?,
        HirKind::Concat(parts) => {
            let parts: Result<Vec<String>, _> = parts.iter().map(expression).collect();
            format!("({})", parts?.join(" "))
        }
        HirKind::Alternation(branches) => {
            let branches: Result<Vec<String>, _> = branches.iter().map(expression).collect();
            format!("({})", branches?.join(" | "))
        }
    })
}

/// One character of `class` escaped (or a run of its plain characters,
/// when `runs`): its plain characters as one lexeme, its escaped ones as
/// another.
fn characters(class: &ClassUnicode, runs: bool) -> String {
    let mut plain = class.clone();
    plain.difference(&escaped_class());
    let mut special = class.clone();
    special.intersect(&escaped_class());
    let mut items = Vec::new();
    if plain.iter().next().is_some() {
        let one = Hir::class(Class::Unicode(plain));
        let lexeme = if runs {
            Hir::repetition(Repetition {
                min: 1,
                max: None,
                greedy: true,
                sub: Box::new(one),
            })
        } else {
            one
        };
        items.push(lark_regex(&lexeme.to_string()));
    }
    let escapes: Vec<Hir> = (special.iter())
        .flat_map(|range| range.start()..=range.end())
        .map(|c| Hir::literal(escape(&c.to_string()).into_bytes()))
        .collect();
    if !escapes.is_empty() {
        items.push(lark_regex(&Hir::alternation(escapes).to_string()));
    }
    match items.len() {
        0 => "/[^\\s\\S]/".to_owned(),
        _ => format!("({})", items.join(" | ")),
    }
}

/// The escaped expression of the regex `pattern` with Lark's `flags`.
fn regex_expression(pattern: &str, flags: &str) -> Result<String, GrammarError> {
    expression(&parsed(pattern, flags)?)
}

/// The rule a terminal `NAME` becomes.
fn terminal_rule(name: &str) -> String {
    format!("t__{}", name.to_lowercase().replace('-', "_"))
}

/// Whether `name` is a Lark terminal's (upper case) name.
fn is_terminal(name: &str) -> bool {
    let name = name.trim_start_matches('_');
    name.starts_with(|c: char| c.is_ascii_uppercase()) && !name.chars().any(|c| c.is_lowercase())
}

/// The Lark grammar `source` over the text inside a JSON string: every
/// string literal and regex matches exactly the escaped forms of what it
/// matched, and terminals become rules (see [`expression`]).
pub fn lark(source: &str) -> Result<String, GrammarError> {
    let mut out = String::with_capacity(source.len() * 2);
    let mut at = 0;
    // Whether only white space precedes `at` on its line.
    let mut line_start = true;
    while at < source.len() {
        let rest = &source[at..];
        let c = rest.chars().next().unwrap_or_default();
        let starts_line = line_start;
        line_start = c == '\n' || (line_start && (c == ' ' || c == '\t'));
        if c == '#' || rest.starts_with("//") {
            let line = rest.find('\n').unwrap_or(rest.len());
            at += line;
        } else if c == '"' {
            let (body, flags, end) =
                scan(source, at, '"', "i").ok_or_else(|| refused("a string is not closed"))?;
            let text = unquote(&body)?;
            // A range of characters, "a".."z".
            let after = source[end..].trim_start_matches([' ', '\t']);
            if let Some(range) = after.strip_prefix("..") {
                let range = range.trim_start_matches([' ', '\t']);
                let offset = source.len() - range.len();
                let (last, _, range_end) = (range.starts_with('"'))
                    .then(|| scan(source, offset, '"', ""))
                    .flatten()
                    .ok_or_else(|| refused("a range does not end in a string"))?;
                let mut class = String::from("[");
                for bound in [text, unquote(&last)?] {
                    let mut chars = bound.chars();
                    let (Some(c), None) = (chars.next(), chars.next()) else {
                        return Err(refused("a range's ends are not single characters"));
                    };
                    class.push_str(&regex_syntax::escape(&c.to_string()));
                    class.push('-');
                }
                class.pop();
                class.push(']');
                out.push_str(&regex_expression(&class, "")?);
                at = range_end;
                continue;
            }
            if flags.is_empty() {
                out.push_str(&serde_json::Value::from(escape(&text)).to_string());
            } else {
                out.push_str(&regex_expression(&regex_syntax::escape(&text), "i")?);
            }
            at = end;
        } else if c == '/' {
            let (body, flags, end) =
                scan(source, at, '/', "imslux").ok_or_else(|| refused("a regex is not closed"))?;
            if flags.contains('l') {
                return Err(refused("the l flag is not supported in regexes"));
            }
            out.push_str(&regex_expression(&body.replace("\\/", "/"), &flags)?);
            at = end;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let len = rest
                .char_indices()
                .find(|&(i, c)| {
                    let dash = c == '-' && rest[i + 1..].starts_with(|n: char| n.is_alphanumeric());
                    !(c.is_ascii_alphanumeric() || c == '_' || dash)
                })
                .map_or(rest.len(), |(i, _)| i);
            let name = &rest[..len];
            at += len;
            if !is_terminal(name) {
                out.push_str(name);
                continue;
            }
            out.push_str(&terminal_rule(name));
            // A definition's priority (`NAME.2:`) has no rule equivalent.
            let after = &source[at..];
            if starts_line {
                let digits = after
                    .strip_prefix('.')
                    .map(|tail| tail.chars().take_while(char::is_ascii_digit).count());
                if let Some(digits) = digits.filter(|&d| d > 0) {
                    at += 1 + digits;
                }
            }
        } else if let Some(import) = rest.strip_prefix("%import") {
            let line = import.find('\n').unwrap_or(import.len());
            out.push_str(&common_imports(&import[..line])?);
            at += "%import".len() + line;
        } else if c == '%' {
            return Err(refused(
                "where a custom tool's input is a JSON string, its grammar can use \
                 `%import common...` but no other directive (%ignore, %json, %lark, %regex, ...)",
            ));
        } else if c == '<' && rest[1..].starts_with(|c: char| !c.is_whitespace() && c != '<') {
            return Err(refused(
                "a custom tool's grammar cannot name special tokens where its input is a JSON \
                 string",
            ));
        } else {
            out.push(c);
            at += c.len_utf8();
        }
    }
    Ok(out)
}

/// The rules an `%import common...` line (after `%import`) names,
/// escaped: `common.NAME`, `common.NAME -> ALIAS`, or `common (A, B)`.
fn common_imports(line: &str) -> Result<String, GrammarError> {
    let line = line.trim();
    let unknown = || {
        refused(format!(
            "only Lark's common terminals can be imported, not `{line}`"
        ))
    };
    let list = (line.strip_prefix("common"))
        .map(str::trim_start)
        .and_then(|rest| rest.strip_prefix('('));
    let (names, alias): (Vec<&str>, Option<&str>) = if let Some(list) = list {
        let list = list.strip_suffix(')').ok_or_else(unknown)?;
        (list.split(',').map(str::trim).collect(), None)
    } else if let Some(name) = line.strip_prefix("common.") {
        match name.split_once("->") {
            Some((name, alias)) => (vec![name.trim()], Some(alias.trim())),
            None => (vec![name.trim()], None),
        }
    } else {
        return Err(unknown());
    };
    let mut out = String::new();
    for name in names {
        let (_, rx) = (COMMON.iter())
            .find(|(known, _)| *known == name)
            .ok_or_else(unknown)?;
        let defined = terminal_rule(alias.unwrap_or(name));
        out.push_str(&format!("{defined}: {}\n", regex_expression(rx, "")?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string of up to `length` characters of `alphabet`.
    fn strings(alphabet: &[char], length: usize) -> Vec<String> {
        let mut all = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..length {
            last = (last.iter())
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            all.extend(last.iter().cloned());
        }
        all
    }

    fn whole(rx: &str) -> regex::Regex {
        regex::Regex::new(&format!("^(?:{rx})$")).unwrap()
    }

    const PATTERNS: &[&str] = &[
        "a+",
        "[^\"]*",
        "(?s:.*)",
        "\"[a-z]*\"",
        "[\\x00-\\x1f]b?",
        "(?i)ab",
        "a|\\\\",
        "\\n+|\\t",
        "é{1,2}",
        "[^a]",
    ];

    #[test]
    fn an_escaped_regex_matches_exactly_the_escaped_strings() {
        let texts = strings(&['a', 'b', 'A', '"', '\\', '\n', '\t', 'é', '\u{1}'], 3);
        // Text that might be an escape: what the escaped regex may match.
        let written = strings(&['a', '"', '\\', 'n', 'u', '0', '1', 't'], 4);
        for pattern in PATTERNS {
            let plain = whole(pattern);
            let escaped = whole(&regex(pattern, "", true).unwrap());
            for text in &texts {
                assert_eq!(
                    plain.is_match(text),
                    escaped.is_match(&escape(text)),
                    "{pattern} on {text:?}"
                );
            }
            for text in written.iter().filter(|t| escaped.is_match(t)) {
                let decoded: String = serde_json::from_str(&format!("\"{text}\""))
                    .unwrap_or_else(|_| panic!("{pattern} matched {text:?}, not JSON"));
                assert_eq!(
                    &escape(&decoded),
                    text,
                    "{pattern}: not the canonical escape"
                );
                assert!(plain.is_match(&decoded), "{pattern} on {decoded:?}");
            }
        }
    }

    #[test]
    fn end_anchors_are_dropped_and_others_refused() {
        let rx = regex("^(yes|no)$", "", true).unwrap();
        assert!(whole(&rx).is_match("yes") && !whole(&rx).is_match("^yes$"));
        let rx = regex("^a$|^b$", "", false).unwrap();
        assert!(whole(&rx).is_match("b"));
        for pattern in ["a\\bb", "a^b", "(?-u:\\xff)"] {
            let error = regex(pattern, "", true).unwrap_err();
            assert!(matches!(error, GrammarError::Compile { .. }), "{pattern}");
        }
        assert!(regex("(", "", true).is_err());
    }

    #[test]
    fn lark_terminals_become_escaped_rules_and_the_rest_is_kept() {
        let source = "start: \"say \\\"\" WORD LF \"a\"..\"c\" /\\// \"x\"i // a comment\n\
                      WORD.2: /[a-z]+/\n%import common (LF)\n";
        let escaped = lark(source).unwrap();
        let lines: Vec<&str> = escaped.lines().map(str::trim_end).collect();
        assert_eq!(
            lines,
            [
                "start: \"say \\\\\\\"\" t__word t__lf (/[a-c]/) \"/\" (/[Xx]/)",
                "t__word: (/[a-z]+/)+",
                "t__lf: \"\\\\n\"",
                "",
            ],
            "{escaped}"
        );
        assert!(!escaped.contains("comment"), "{escaped}");
        for refused in [
            "start: %json {\"type\": \"object\"}",
            "start: <|im_end|>",
            "start: \"a\"\n%import other.X",
            "start: \"a\"\n%ignore \" \"",
            "start: \"open",
            "start: \"a\"..\"bc\"",
        ] {
            assert!(lark(refused).is_err(), "{refused}");
        }
    }
}
