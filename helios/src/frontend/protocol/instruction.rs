//! Instructions the server adds to a conversation: the declaration of tools
//! for templates that render none ([`super::ToolFormat::JsonInstructed`]),
//! and `tool_choice=required`'s demand for a call.

use serde_json::{json, Value};

use crate::frontend::template::python_json;
use crate::frontend::ChatInput;

/// An instruction the server adds to the system message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolInstruction {
    /// The answer must call at least one of the tools.
    RequireCall,
}

impl ToolInstruction {
    fn text(self) -> &'static str {
        match self {
            Self::RequireCall => {
                "You must call at least one of the available tools in this answer; \
                 do not answer with text only."
            }
        }
    }

    /// Appends the instruction to `input`'s system message (adding one
    /// first when the conversation has none).
    pub fn apply(self, input: &mut ChatInput) {
        append_to_system(&mut input.messages, self.text());
    }
}

/// `input` for a template that renders no tools: earlier calls are written
/// in the call format the parser reads (`call_start {"name": ..,
/// "arguments": ..} call_end`) and tool results become user turns wrapped in
/// `<tool_response>` tags, so the model sees every turn of the exchange in
/// the syntax it was told to use (whether or not this request shows tools);
/// the tools it shows are declared in the system message with that format.
/// `input.tools` is cleared.
pub fn instructed_input(input: &mut ChatInput, call_start: &str, call_end: &str) {
    let tools = input.tools.take().unwrap_or_default();
    let shown: Vec<&Value> = tools.iter().collect();
    instructed_input_showing(input, &shown, call_start, call_end);
}

/// [`instructed_input`] declaring `tools` (borrowed from the request, not
/// copied into `input` first); `input.tools` is cleared.
pub fn instructed_input_showing(
    input: &mut ChatInput,
    tools: &[&Value],
    call_start: &str,
    call_end: &str,
) {
    input.tools = None;
    let messages = std::mem::take(&mut input.messages);
    input.messages = messages
        .into_iter()
        .map(|message| written_out(message, call_start, call_end))
        .collect();
    if tools.is_empty() {
        return;
    }
    let declarations: Vec<String> = tools.iter().map(|tool| python_json(tool)).collect();
    let instruction = format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n\
         <tools>\n{}\n</tools>\n\n\
         For each function call, return a JSON object with the function name and its \
         arguments within {call_start}{call_end} tags:\n\
         {call_start}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{call_end}",
        declarations.join("\n"),
    );
    append_to_system(&mut input.messages, &instruction);
}

/// One message with its calls and results in the instructed syntax.
fn written_out(message: Value, call_start: &str, call_end: &str) -> Value {
    let Value::Object(mut message) = message else {
        return message;
    };
    match message.get("role").and_then(Value::as_str) {
        Some("assistant") => {
            let Some(Value::Array(calls)) = message.remove("tool_calls") else {
                return Value::Object(message);
            };
            let mut content = match message.remove("content") {
                Some(Value::String(text)) => text,
                _ => String::new(),
            };
            for call in calls {
                let function = call.get("function").unwrap_or(&call);
                let name = function.get("name").cloned().unwrap_or(Value::Null);
                let arguments = match function.get("arguments") {
                    Some(Value::String(text)) => {
                        serde_json::from_str(text).unwrap_or_else(|_| Value::from(text.as_str()))
                    }
                    Some(value) => value.clone(),
                    None => json!({}),
                };
                if !content.is_empty() {
                    content.push('\n');
                }
                let object = python_json(&json!({"name": name, "arguments": arguments}));
                content.push_str(&format!("{call_start}\n{object}\n{call_end}"));
            }
            message.insert("content".to_owned(), Value::from(content));
            Value::Object(message)
        }
        Some("tool") => {
            let content = match message.get("content") {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            json!({
                "role": "user",
                "content": format!("<tool_response>\n{content}\n</tool_response>"),
            })
        }
        _ => Value::Object(message),
    }
}

/// Appends `text` to the first message when it is the system message, or
/// adds a system message holding it at the start.
fn append_to_system(messages: &mut Vec<Value>, text: &str) {
    if let Some(first) = messages.first_mut() {
        if first.get("role").and_then(Value::as_str) == Some("system") {
            let content = match first.get("content") {
                Some(Value::String(existing)) if !existing.is_empty() => {
                    format!("{existing}\n\n{text}")
                }
                _ => text.to_owned(),
            };
            first["content"] = Value::from(content);
            return;
        }
    }
    messages.insert(0, json!({"role": "system", "content": text}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_calls_and_results_are_written_in_the_instructed_syntax() {
        let mut input = ChatInput {
            messages: vec![
                json!({"role": "user", "content": "weather?"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
            ],
            tools: Some(vec![
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ]),
            ..ChatInput::default()
        };
        instructed_input(&mut input, "<tool_call>", "</tool_call>");
        assert_eq!(input.tools, None);
        let system = input.messages[0]["content"].as_str().unwrap();
        assert!(system.contains(r#"{"type": "function", "function": {"name": "get_weather"}}"#));
        assert!(system.ends_with("</tool_call>"), "{system}");
        assert_eq!(
            input.messages[2]["content"],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(
            input.messages[3],
            json!({"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"})
        );
    }

    #[test]
    fn the_requirement_joins_an_existing_system_message() {
        let mut input = ChatInput {
            messages: vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "hi"}),
            ],
            ..ChatInput::default()
        };
        ToolInstruction::RequireCall.apply(&mut input);
        let system = input.messages[0]["content"].as_str().unwrap();
        assert!(system.starts_with("Be brief.\n\nYou must call"), "{system}");
        assert_eq!(input.messages.len(), 2);
    }
}
