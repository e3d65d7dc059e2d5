//! What a request's conversation may hold, checked before anything renders
//! it: the served model, the roles each route accepts, and content the core
//! can consume.
//!
//! Rules, each with its reason:
//! - a `model` other than the served id or an alias is 404, so a client
//!   pointed at the wrong server learns it at once instead of getting
//!   another model's answer (an absent `model` is served);
//! - a role the route does not accept is 400 naming `messages[i].role`: a
//!   template would otherwise render it verbatim into a prompt the model was
//!   never trained on;
//! - content is a string or a list of parts; text parts are joined with a
//!   newline into one string (as vLLM does for string-content templates), so
//!   every template sees the content type it was written for; any other part
//!   (an image, audio, a file) is 400 naming the part, since this core reads
//!   text only;
//! - OpenAI's `developer` role is the `system` role of newer clients, and is
//!   rendered as `system`;
//! - an assistant call's `arguments`, a JSON string on the wire, reaches the
//!   template as the object it encodes (as vLLM passes it), since templates
//!   print it with `tojson`; a string that is not a JSON object stays as it
//!   is;
//! - reasoning is accepted as `reasoning_content` or `reasoning` and the
//!   template sees both names;
//! - Anthropic conversations become the same OpenAI-shaped messages:
//!   `tool_use` blocks are the assistant's `tool_calls`, `tool_result`
//!   blocks are `tool` messages (before the turn's text), `thinking` blocks
//!   are its reasoning, and tool definitions take OpenAI's function shape.

use serde_json::{Map, Value};

use super::error::HttpError;
use super::ServeConfig;

/// The roles OpenAI's chat route accepts, as the error names them.
const OPENAI_ROLES: &str = "system, developer, user, assistant, tool";

/// The roles Anthropic's messages route accepts (the system prompt has its
/// own field).
const ANTHROPIC_ROLES: &str = "user, assistant";

/// Refuses a request naming a model other than the served one.
pub fn check_model(config: &ServeConfig, requested: Option<&str>) -> Result<(), HttpError> {
    match requested {
        Some(name) if name != config.model && !config.aliases.iter().any(|a| a == name) => {
            Err(HttpError::ModelNotFound {
                requested: name.to_owned(),
                served: config.model.clone(),
            })
        }
        _ => Ok(()),
    }
}

/// OpenAI chat messages, checked: roles accepted, text content joined into
/// one string, `developer` rendered as `system`. Every other field of a
/// message (`tool_calls`, `name`, `reasoning_content`, ...) is kept for the
/// template.
pub fn openai_messages(messages: Vec<Value>) -> Result<Vec<Value>, HttpError> {
    messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| {
            let Value::Object(mut message) = message else {
                // The frontend refuses it, naming the message.
                return Ok(message);
            };
            let role = match message.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(role @ ("system" | "user" | "assistant" | "tool")) => role,
                other => return Err(invalid_role(index, other, OPENAI_ROLES)),
            };
            message.insert("role".to_owned(), Value::from(role));
            if let Some(content) = message.remove("content") {
                let at = format!("messages[{index}].content");
                message.insert("content".to_owned(), text_content(content, &at)?);
            }
            let reasoning = (message.get("reasoning_content"))
                .or_else(|| message.get("reasoning"))
                .cloned();
            if let Some(reasoning) = reasoning.filter(|r| !r.is_null()) {
                message.insert("reasoning_content".to_owned(), reasoning.clone());
                message.insert("reasoning".to_owned(), reasoning);
            }
            if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
                calls.iter_mut().for_each(arguments_as_object);
            }
            Ok(Value::Object(message))
        })
        .collect()
}

/// A call's `function.arguments` string as the object it encodes.
fn arguments_as_object(call: &mut Value) {
    let Some(arguments) = call.pointer_mut("/function/arguments") else {
        return;
    };
    if let Some(Ok(object @ Value::Object(_))) =
        arguments.as_str().map(serde_json::from_str::<Value>)
    {
        *arguments = object;
    }
}

/// Anthropic's `tools` in OpenAI's function shape; tools of another `type`
/// (Anthropic's hosted tools) are skipped with a warning, since no model
/// here runs them.
pub fn anthropic_tools(tools: Vec<Value>) -> Vec<Value> {
    tools
        .into_iter()
        .filter_map(|tool| {
            let kind = tool.get("type").and_then(Value::as_str);
            if !matches!(kind, None | Some("custom")) {
                eprintln!("flare: skipping tool of type {kind:?}: only client tools are served");
                return None;
            }
            let mut function = Map::new();
            for (from, to) in [
                ("name", "name"),
                ("description", "description"),
                ("input_schema", "parameters"),
            ] {
                if let Some(value) = tool.get(from) {
                    function.insert(to.to_owned(), value.clone());
                }
            }
            Some(serde_json::json!({"type": "function", "function": function}))
        })
        .collect()
}

/// Anthropic messages (and the system prompt) as OpenAI-shaped messages,
/// and whether the conversation ends in an assistant turn (a prefill the
/// output continues).
pub fn anthropic_messages(
    system: Option<Value>,
    messages: Vec<(String, Value)>,
) -> Result<(Vec<Value>, bool), HttpError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        let content = anthropic_text(system, "system")?;
        out.push(serde_json::json!({"role": "system", "content": content}));
    }
    let prefill = messages.last().is_some_and(|(role, _)| role == "assistant");
    for (index, (role, content)) in messages.into_iter().enumerate() {
        anthropic_role(index, &role)?;
        let at = format!("messages[{index}].content");
        let blocks = match content {
            Value::Array(blocks) => blocks,
            other => {
                let text = anthropic_text(other, &at)?;
                out.push(serde_json::json!({"role": role, "content": text}));
                continue;
            }
        };
        let mut texts = Vec::new();
        let mut reasoning = Vec::new();
        let mut calls = Vec::new();
        for (position, block) in blocks.into_iter().enumerate() {
            let at = format!("{at}[{position}]");
            match block.get("type").and_then(Value::as_str) {
                Some("tool_use") if role == "assistant" => calls.push(serde_json::json!({
                    "id": block.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": block.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": block.get("input").cloned().unwrap_or_else(|| serde_json::json!({})),
                    },
                })),
                Some("tool_result") if role == "user" => {
                    let content = match block.get("content").cloned() {
                        None | Some(Value::Null) => String::new(),
                        Some(content) => anthropic_text(content, &format!("{at}.content"))?,
                    };
                    out.push(serde_json::json!({
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": content,
                    }));
                }
                Some("thinking") if role == "assistant" => {
                    if let Some(text) = block.get("thinking").and_then(Value::as_str) {
                        reasoning.push(text.to_owned());
                    }
                }
                // Redacted reasoning has no text to replay.
                Some("redacted_thinking") if role == "assistant" => {}
                _ => texts.push(part_text(block, &at)?),
            }
        }
        if texts.is_empty() && calls.is_empty() && reasoning.is_empty() {
            continue;
        }
        let mut message = Map::new();
        message.insert("role".to_owned(), Value::from(role.as_str()));
        message.insert("content".to_owned(), Value::from(texts.join("\n")));
        if !reasoning.is_empty() {
            let reasoning = Value::from(reasoning.join("\n"));
            message.insert("reasoning_content".to_owned(), reasoning.clone());
            message.insert("reasoning".to_owned(), reasoning);
        }
        if !calls.is_empty() {
            message.insert("tool_calls".to_owned(), Value::from(calls));
        }
        out.push(Value::Object(message));
    }
    Ok((out, prefill))
}

/// An Anthropic message's role, checked.
pub fn anthropic_role(index: usize, role: &str) -> Result<(), HttpError> {
    match role {
        "user" | "assistant" => Ok(()),
        other => Err(invalid_role(index, Some(other), ANTHROPIC_ROLES)),
    }
}

/// Anthropic content (a string or a list of blocks) as one string; `at`
/// names it in errors (`messages[1].content`, `system`).
pub fn anthropic_text(content: Value, at: &str) -> Result<String, HttpError> {
    match text_content(content, at)? {
        Value::String(text) => Ok(text),
        _ => Err(HttpError::InvalidParameter {
            param: "messages",
            reason: "content must be a string or a list of content blocks",
        }),
    }
}

fn invalid_role(index: usize, role: Option<&str>, accepted: &'static str) -> HttpError {
    HttpError::InvalidRole {
        index,
        role: role.unwrap_or("(none)").to_owned(),
        accepted,
    }
}

/// A message's content as one string, or `null` as it was (an assistant
/// message that only calls tools).
fn text_content(content: Value, at: &str) -> Result<Value, HttpError> {
    match content {
        Value::String(_) | Value::Null => Ok(content),
        Value::Array(parts) => {
            let texts = (parts.into_iter().enumerate())
                .map(|(position, part)| part_text(part, &format!("{at}[{position}]")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::from(texts.join("\n")))
        }
        _ => Err(HttpError::InvalidParameter {
            param: "messages",
            reason: "content must be a string, null or a list of content parts",
        }),
    }
}

/// The text of one content part; any other kind of part is refused.
fn part_text(part: Value, at: &str) -> Result<String, HttpError> {
    let Value::Object(mut part) = part else {
        return Err(not_a_part());
    };
    let kind = part.get("type").and_then(Value::as_str).map(str::to_owned);
    match kind.as_deref() {
        Some("text") => string_field(&mut part, "text"),
        // An assistant's refusal is its text.
        Some("refusal") => string_field(&mut part, "refusal"),
        Some(kind) => Err(HttpError::UnsupportedContent {
            at: at.to_owned(),
            kind: kind.to_owned(),
        }),
        None => Err(not_a_part()),
    }
}

fn string_field(part: &mut Map<String, Value>, name: &str) -> Result<String, HttpError> {
    match part.remove(name) {
        Some(Value::String(text)) => Ok(text),
        _ => Err(not_a_part()),
    }
}

fn not_a_part() -> HttpError {
    HttpError::InvalidParameter {
        param: "messages",
        reason: "holds a content part that is not an object with a `type` and its text",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_parts_join_and_developer_is_system() {
        let messages = openai_messages(vec![
            json!({"role": "developer", "content": "be brief"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
        ])
        .unwrap();
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[1]["content"], "one\ntwo");
        assert_eq!(messages[2]["content"], Value::Null);
        assert_eq!(messages[2]["tool_calls"], json!([]));
    }

    #[test]
    fn reasoning_has_both_names_and_call_arguments_are_objects() {
        let messages = openai_messages(vec![json!({"role": "assistant", "content": "",
            "reasoning": "plan", "tool_calls": [
                {"id": "c", "type": "function",
                 "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                {"id": "d", "type": "function",
                 "function": {"name": "g", "arguments": "not json"}}]})])
        .unwrap();
        assert_eq!(messages[0]["reasoning_content"], "plan");
        assert_eq!(messages[0]["reasoning"], "plan");
        assert_eq!(
            messages[0]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
        assert_eq!(
            messages[0]["tool_calls"][1]["function"]["arguments"],
            "not json"
        );
    }

    #[test]
    fn anthropic_blocks_become_calls_tool_messages_and_reasoning() {
        let (messages, prefill) = anthropic_messages(
            Some(json!("be brief")),
            vec![
                ("user".to_owned(), json!("weather?")),
                (
                    "assistant".to_owned(),
                    json!([
                    {"type": "thinking", "thinking": "call it", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather",
                     "input": {"city": "Paris"}}]),
                ),
                (
                    "user".to_owned(),
                    json!([
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "thanks"}]),
                ),
            ],
        )
        .unwrap();
        assert!(!prefill);
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[2]["reasoning_content"], "call it");
        assert_eq!(messages[2]["content"], "Checking.");
        assert_eq!(
            messages[2]["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": {"city": "Paris"}})
        );
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "sunny"})
        );
        assert_eq!(messages[4], json!({"role": "user", "content": "thanks"}));
        let tools = anthropic_tools(vec![
            json!({"name": "f", "input_schema": {"type": "object"}}),
            json!({"type": "web_search_20250305", "name": "web_search"}),
        ]);
        assert_eq!(
            tools,
            vec![json!({"type": "function",
                "function": {"name": "f", "parameters": {"type": "object"}}})]
        );
    }

    #[test]
    fn an_unknown_role_is_named_by_its_index() {
        let error = openai_messages(vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "wizard", "content": "hi"}),
        ])
        .unwrap_err();
        assert!(
            matches!(error, HttpError::InvalidRole { index: 1, .. }),
            "{error}"
        );
        assert_eq!(error.param().as_deref(), Some("messages[1].role"));
        let error = anthropic_role(0, "system").unwrap_err();
        assert_eq!(error.param().as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn an_image_part_is_refused_where_it_is() {
        let error = openai_messages(vec![json!({"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]})])
        .unwrap_err();
        assert!(
            matches!(error, HttpError::UnsupportedContent { .. }),
            "{error}"
        );
        assert_eq!(error.param().as_deref(), Some("messages[0].content[1]"));
        let error = anthropic_text(
            json!([{"type": "image", "source": {"type": "base64"}}]),
            "messages[2].content",
        )
        .unwrap_err();
        assert_eq!(error.param().as_deref(), Some("messages[2].content[0]"));
    }
}
