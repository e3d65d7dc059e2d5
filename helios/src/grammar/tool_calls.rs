//! The grammar of an answer that must be tool calls, in the core's own
//! call format (`tool_choice` required or a named tool): an optional
//! reasoning block first, then one call (or several, when parallel calls are
//! allowed) and nothing else, each call's arguments valid against its
//! tool's schema; of one that may call them (`auto` with strict tools),
//! free until a call opens; and of one that is a structured answer or calls. Markers that are one added token are matched by id, the
//! others as text; JSON is laid out as the templates print it (`", "` and
//! `": "`, no other white space), so the call the model writes is the call a
//! next turn renders.

use serde_json::{json, Value};

use super::json_quote::{self, lark_regex};
use super::GrammarError;
use crate::frontend::protocol::{
    schema_type, CustomInput, Marker, OutputProtocol, ToolFormat, ToolSet, CUSTOM_INPUT_KEY,
};

/// How the grammar's JSON is laid out.
fn layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// A marker as a Lark item: its token by id, or its text.
fn item(marker: &Marker) -> String {
    match marker.token_id {
        Some(id) => format!("<[{id}]>"),
        None => literal(&marker.text),
    }
}

/// `text` as a Lark string literal.
fn literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// A tool's parameter schema, an object when it declares none.
fn parameters(schema: &Value) -> Value {
    match schema {
        Value::Object(object) if !object.is_empty() => schema.clone(),
        _ => json!({"type": "object"}),
    }
}

/// The `%json` item of one call object: `name` fixed, the arguments (under
/// `arguments_key`) valid against the tool's schema.
fn json_call(name: &str, schema: &Value, arguments_key: &str) -> String {
    let object = json!({
        "type": "object",
        "properties": {"name": {"const": name}, arguments_key: parameters(schema)},
        "required": ["name", arguments_key],
        "additionalProperties": false,
        "x-guidance": layout(),
    });
    format!("%json {object}")
}

/// A custom tool's call: its one string argument in the tool's format (a
/// Lark grammar nested whole, a regex, or any text), JSON-escaped where the
/// call format writes arguments as JSON, raw in an XML-style parameter.
fn custom_call(
    name: &str,
    input: &CustomInput,
    format: ToolFormat,
    rules: &mut Vec<String>,
    rule: &str,
) -> Result<String, GrammarError> {
    let key = CUSTOM_INPUT_KEY;
    let value = format!("{rule}_input");
    if format == ToolFormat::XmlFunctions {
        let open = literal(&format!("<function={name}>\n<parameter={key}>\n"));
        let body = match input {
            CustomInput::Text => {
                return Ok(format!("{open} xml_text {}", literal("</function>\n")))
            }
            CustomInput::Lark(source) => format!("%lark {{\n{source}\n}}"),
            CustomInput::Regex(rx) => lark_regex(&json_quote::regex(rx, "", false)?),
        };
        rules.push(format!("{value}: {body}"));
        let close = literal("\n</parameter>\n</function>\n");
        return Ok(format!("{open} {value} {close}"));
    }
    let arguments = match format {
        ToolFormat::JsonAnswer => "parameters",
        _ => "arguments",
    };
    let body = match input {
        CustomInput::Text => lark_regex(&json_quote::regex("(?s:.*)", "", true)?),
        CustomInput::Lark(source) => format!("%lark {{\n{}\n}}", json_quote::lark(source)?),
        CustomInput::Regex(rx) => lark_regex(&json_quote::regex(rx, "", true)?),
    };
    rules.push(format!("{value}: {body}"));
    let name = Value::from(name);
    let open = literal(&format!(
        "{{\"name\": {name}, \"{arguments}\": {{\"{key}\": \""
    ));
    Ok(format!("{open} {value} {}", literal("\"}}")))
}

/// An XML-style call: `<function=NAME>` and one `<parameter=KEY>` per
/// property in schema order (optional ones may be left out), each value in
/// its type's syntax: one of its `enum` (or its `const`), digits for
/// integers and numbers, `true`/`false`, JSON for objects and arrays, and
/// free text up to the closing tag for other strings (a string's other
/// constraints, such as `pattern`, are not enforced in this format).
fn xml_call(name: &str, schema: &Value, rules: &mut Vec<String>, rule: &str) -> String {
    let schema = parameters(schema);
    let required: Vec<&str> = (schema.get("required").and_then(Value::as_array))
        .map(|keys| keys.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut parts = vec![literal(&format!("<function={name}>\n"))];
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (position, (key, property)) in properties.iter().enumerate() {
            let value = format!("{rule}_v{position}");
            let kind = schema_type(property).unwrap_or("string");
            let end = literal("\n</parameter>\n");
            // Values written as the parser reads them back: strings raw,
            // others as JSON.
            let written = |value: &Value| match value {
                Value::String(text) => literal(text),
                other => literal(&other.to_string()),
            };
            let choices: Option<Vec<String>> = match (property.get("enum"), property.get("const")) {
                (Some(Value::Array(values)), _) => Some(values.iter().map(written).collect()),
                (_, Some(value)) => Some(vec![written(value)]),
                _ => None,
            };
            let body = match kind {
                _ if choices.is_some() => {
                    format!("({}) {end}", choices.unwrap_or_default().join(" | "))
                }
                "integer" => format!("/-?[0-9]+/ {end}"),
                "number" => format!("/-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?/ {end}"),
                "boolean" => format!("(\"true\" | \"false\") {end}"),
                "object" | "array" => {
                    let mut schema = property.clone();
                    if let Some(object) = schema.as_object_mut() {
                        object.insert("x-guidance".to_owned(), layout());
                    }
                    format!("%json {schema} {end}")
                }
                _ => "xml_text".to_owned(),
            };
            rules.push(format!(
                "{value}: {} {body}",
                literal(&format!("<parameter={key}>\n"))
            ));
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            parts.push(format!("{value}{optional}"));
        }
    }
    parts.push(literal("</function>\n"));
    parts.join(" ")
}

/// The rules of one call in `protocol`'s format, each to one of `tools`,
/// pushed onto `rules`: `call` (a call, its start marker included), `rest`
/// (a call after its start marker, where the format has one) and, for the
/// bare JSON format, `first` (the answer's first call, after the optional
/// start marker). The tool-call syntax, for the callers' repetition.
fn call_rules<'p>(
    protocol: &'p OutputProtocol,
    tools: &ToolSet,
    rules: &mut Vec<String>,
) -> Result<&'p crate::frontend::protocol::ToolSyntax, GrammarError> {
    let unsupported = |reason: &str| GrammarError::Compile {
        reason: reason.to_owned(),
    };
    let syntax = (protocol.tools.as_ref())
        .ok_or_else(|| unsupported("the core declares no tool-call format"))?;
    if tools.is_empty() {
        return Err(unsupported("no tools to call"));
    }
    let mut bodies = Vec::new();
    for (index, (name, schema)) in tools.tools().enumerate() {
        let rule = format!("tool{index}");
        let body = match (tools.custom_input(name), syntax.format) {
            (Some(input), format) => custom_call(name, input, format, rules, &rule)?,
            (None, _) => match syntax.format {
                ToolFormat::JsonInTags | ToolFormat::JsonInstructed => {
                    json_call(name, schema, "arguments")
                }
                ToolFormat::JsonAnswer => json_call(name, schema, "parameters"),
                ToolFormat::XmlFunctions => xml_call(name, schema, rules, &rule),
            },
        };
        rules.push(format!("{rule}: {body}"));
        bodies.push(rule);
    }
    rules.push(format!("body: {}", bodies.join(" | ")));
    if syntax.format == ToolFormat::XmlFunctions {
        // A string value runs lazily to the first closing tag, where the
        // parser ends it too.
        rules.push("xml_text[lazy]: /(?s:.*)<\\/parameter>\\n/".to_owned());
    }
    match (syntax.format, &syntax.call_start, &syntax.call_end) {
        (ToolFormat::JsonAnswer, start, _) => {
            let start = start
                .as_ref()
                .map(item)
                .map_or(String::new(), |s| format!("{s} "));
            rules.push(format!("first: {start}body"));
            rules.push("call: body".to_owned());
        }
        (ToolFormat::XmlFunctions, Some(start), Some(end)) => {
            rules.push(format!("rest: {} body {}", literal("\n"), item(end)));
            rules.push(format!("call: {} rest", item(start)));
        }
        (_, Some(start), Some(end)) => {
            let newline = literal("\n");
            rules.push(format!("rest: {newline} body {newline} {}", item(end)));
            rules.push(format!("call: {} rest", item(start)));
        }
        _ => return Err(unsupported("the tool-call format lacks its markers")),
    }
    Ok(syntax)
}

/// The calls of an answer in `syntax`'s format: the first call, then more
/// when `parallel`, each after the format's separator.
fn calls(syntax: &crate::frontend::protocol::ToolSyntax, parallel: bool) -> String {
    let first = match syntax.format {
        ToolFormat::JsonAnswer => "first",
        _ => "call",
    };
    if !parallel {
        return first.to_owned();
    }
    let between = match syntax.format {
        ToolFormat::JsonAnswer => literal(&format!("{} ", syntax.separator)),
        _ => literal("\n"),
    };
    format!("{first} ({between} call)*")
}

/// The whole grammar: the start rule (`body` after the reasoning the
/// protocol allows) first, then `rules`.
fn grammar(
    protocol: &OutputProtocol,
    syntax: &crate::frontend::protocol::ToolSyntax,
    starts_in_reasoning: bool,
    body: &str,
    mut rules: Vec<String>,
) -> String {
    let call_start = syntax.call_start.as_ref();
    let start = reasoning_then(protocol, starts_in_reasoning, call_start, body, &mut rules);
    rules.insert(0, start);
    rules.join("\n")
}

/// The grammar (Lark) of an answer made of calls to `tools`, in
/// `protocol`'s format; `starts_in_reasoning`: the prompt opened reasoning,
/// which the answer closes first.
pub fn tool_call_grammar(
    protocol: &OutputProtocol,
    tools: &ToolSet,
    parallel: bool,
    starts_in_reasoning: bool,
) -> Result<String, GrammarError> {
    let mut rules = Vec::new();
    let syntax = call_rules(protocol, tools, &mut rules)?;
    let body = calls(syntax, parallel);
    Ok(grammar(protocol, syntax, starts_in_reasoning, &body, rules))
}

/// The grammar (Lark) of an answer that may call `tools` (`tool_choice`
/// auto with strict tools): free text until the format's call marker, then
/// a call valid by construction, then text again (and, when `parallel`,
/// further calls). The constraint is lazy: text holding no call marker is
/// never restricted. A textual marker ends the text at its first
/// occurrence; a marker that is one added token cannot occur in text; a
/// format without a start marker (bare JSON) calls only at the start, and
/// text that is not a call may not begin with `{`.
pub fn auto_call_grammar(
    protocol: &OutputProtocol,
    tools: &ToolSet,
    parallel: bool,
    starts_in_reasoning: bool,
) -> Result<String, GrammarError> {
    let mut rules = Vec::new();
    let syntax = call_rules(protocol, tools, &mut rules)?;
    let repeat = if parallel { "*" } else { "?" };
    let answer = match &syntax.call_start {
        Some(start) if start.token_id.is_some() => {
            // Text cannot spell an added token: the marker ends it.
            rules.push("TEXT: /(?s:.*)/".to_owned());
            format!("TEXT (call TEXT){repeat}")
        }
        Some(start) => {
            // Lazily to the first marker, which opens the call; text after
            // the last call holds no marker.
            rules.push(format!("head[lazy]: {}", until(&start.text)));
            rules.push(format!("TAIL: {}", without(&[&start.text])));
            format!("(head rest){repeat} TAIL")
        }
        None => {
            rules.push("PROSE: /[^{](?s:.*)/".to_owned());
            format!("PROSE? | {}", calls(syntax, parallel))
        }
    };
    rules.push(format!("auto: {answer}"));
    Ok(grammar(
        protocol,
        syntax,
        starts_in_reasoning,
        "auto",
        rules,
    ))
}

/// The grammar (Lark) of an answer that is either a JSON value valid
/// against `schema` or calls to `tools` (structured output with `auto`
/// tools, as an agent asks for its final output while it may still call
/// tools): nothing else, after the reasoning `protocol` allows.
pub fn answer_or_calls_grammar(
    protocol: &OutputProtocol,
    schema: &Value,
    tools: &ToolSet,
    parallel: bool,
    starts_in_reasoning: bool,
) -> Result<String, GrammarError> {
    let mut rules = Vec::new();
    let syntax = call_rules(protocol, tools, &mut rules)?;
    rules.push(format!("answer: %json {}", laid_out(schema)));
    rules.push(format!("either: answer | {}", calls(syntax, parallel)));
    Ok(grammar(
        protocol,
        syntax,
        starts_in_reasoning,
        "either",
        rules,
    ))
}

/// `schema` with the grammars' JSON layout, unless it declares its own.
fn laid_out(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(layout);
    }
    schema
}

/// The start rule: `body` after the reasoning the protocol allows first
/// (optional, or only its close when the prompt opened it). `call_start`:
/// a textual call marker the reasoning must not hold (a call opening inside
/// it would close it, the parser's rule).
fn reasoning_then(
    protocol: &OutputProtocol,
    starts_in_reasoning: bool,
    call_start: Option<&Marker>,
    body: &str,
    rules: &mut Vec<String>,
) -> String {
    let Some(reasoning) = &protocol.reasoning else {
        return format!("start: {body}");
    };
    let thought = match reasoning.end.token_id {
        Some(id) => {
            let call_start = call_start.filter(|m| m.token_id.is_none());
            let forbidden: Vec<&str> = call_start.map(|m| m.text.as_str()).into_iter().collect();
            rules.push(format!("THOUGHT_TEXT: {}", without(&forbidden)));
            format!("THOUGHT_TEXT <[{id}]>")
        }
        None => {
            // Lazily to the first end marker. (A textual call marker inside
            // it is not excluded: a lazy terminal cannot also be an
            // intersection, and a free terminal followed by a delimiter is
            // never left, the lexer extending it greedily; the validation
            // after completion catches it.)
            rules.push(format!(
                "thought_text[lazy]: {}",
                until(&reasoning.end.text)
            ));
            "thought_text".to_owned()
        }
    };
    if starts_in_reasoning {
        format!("start: {thought} /\\n*/ {body}")
    } else {
        let open = item(&reasoning.start);
        format!("start: ({open} {thought} /\\n*/)? {body}")
    }
}

/// The grammar (Lark) of an answer that is a JSON value valid against
/// `schema`, after the reasoning `protocol` allows first: structured output
/// composed with the protocol's reasoning delimiters.
pub fn answer_grammar(
    protocol: &OutputProtocol,
    schema: &Value,
    starts_in_reasoning: bool,
) -> String {
    let mut rules = vec![format!("answer: %json {}", laid_out(schema))];
    let start = reasoning_then(protocol, starts_in_reasoning, None, "answer", &mut rules);
    rules.insert(0, start);
    rules.join("\n")
}

/// A terminal: any text holding none of `forbidden`.
fn without(forbidden: &[&str]) -> String {
    let any = "/(?s:.*)/";
    if forbidden.is_empty() {
        return any.to_owned();
    }
    let alternatives: Vec<String> = (forbidden.iter())
        .map(|text| regex_syntax::escape(text))
        .collect();
    let holding = format!("(?s:.*)({})(?s:.*)", alternatives.join("|"));
    format!("{any} & ~{}", lark_regex(&holding))
}

/// A Lark regex of any text up to and including the first `marker`.
fn until(marker: &str) -> String {
    lark_regex(&format!("(?s:.*){}", regex_syntax::escape(marker)))
}
