//! OpenAI's Responses API, `POST /v1/responses`: a translator onto the chat
//! path, sharing its rendering, tool policy and output parser events.
//!
//! Rules, each with its reason:
//! - `input` is a string (one user message) or a list of items: messages
//!   (typed, or role-only "easy" messages) with text parts, `function_call`,
//!   `function_call_output` and `reasoning` items; they become the chat
//!   messages the template reads (consecutive calls, and the assistant
//!   message before them, are one assistant turn; a reasoning item is the
//!   next assistant turn's `reasoning_content`), and then pass the chat
//!   route's checks ([`conversation::openai_messages`]);
//! - `instructions` are a system message first, and are not inherited from
//!   a previous response (as OpenAI specifies);
//! - function tools come in the flat `{type: "function", name, parameters}`
//!   shape and reach the template in chat's shape; `custom` tools (free
//!   text, or a Lark or regex grammar, as Codex sends) reach it as functions
//!   of one string argument, `input`, whose description gives the grammar,
//!   are held to that grammar where masks apply (a grammar makes the tool
//!   strict), and come back as `custom_tool_call` items whose decoded
//!   input streams as `response.custom_tool_call_input.delta` events;
//!   `custom_tool_call` and `custom_tool_call_output` input items continue
//!   the conversation as function calls and tool results; hosted tool types
//!   (`web_search`, `file_search`, ...) are skipped with a warning, since no
//!   model here runs them, and are not echoed back;
//! - `store` (default true) keeps the response's conversation in the
//!   bounded [`ResponseStore`]; `previous_response_id` continues one, and an
//!   unknown or evicted id is 400 `previous_response_not_found` before
//!   anything starts;
//! - `text.format` other than `text` is refused for now (400 on
//!   `text.format`); `reasoning`, `metadata`, `user` and unknown fields are
//!   accepted (`reasoning` options are ignored);
//! - output items are made from the parser's events by one state machine
//!   ([`ResponseStream`]), streamed or not, so both modes give the same
//!   items: a new item begins when output of another kind (or another call)
//!   begins; a response with no output has one empty message;
//! - a response that reached `max_output_tokens` is `incomplete`
//!   (`incomplete_details.reason = "max_output_tokens"`), and its last open
//!   item too;
//! - every streamed event names its type in `event:` and `type`, and carries
//!   an increasing `sequence_number` from 0; a failure after the stream
//!   started is an `error` event with Helios's code, then `response.failed`
//!   whose `error.code` is one the OpenAI schema allows (`server_error`, or
//!   `invalid_prompt` for the request's fault);
//! - `seed` is accepted as a Helios extension (as on chat), for
//!   reproducible output.

mod custom_input;
mod stream;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::conversation;
use super::error::HttpError;
use super::generation::{self, Chunk, Job};
use super::sampling::SamplingFields;
use super::sse::{self, Usage};
use super::tools::{ToolChoice, ToolRequest};
use super::{new_request_id, parse_body, respond, unix_time, AppState, Body};
use crate::frontend::protocol::{CustomInput, ToolSetError, CUSTOM_INPUT_KEY};
use crate::frontend::ChatInput;
use stream::{Record, ResponseStream};

/// The fields of a Responses request Helios reads; others (`reasoning`'s
/// `effort` and `summary` among them) are accepted and ignored.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    /// A string or a list of input items.
    input: Option<Value>,
    instructions: Option<Value>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// A Helios extension, as on chat completions.
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
    store: Option<bool>,
    previous_response_id: Option<String>,
    metadata: Option<Value>,
    user: Option<String>,
    text: Option<Value>,
}

/// The handler: every response, success or failure, names the request.
pub async fn responses(State(state): State<AppState>, body: Body) -> Response {
    let request_id = new_request_id();
    let result = serve(&state, body, &request_id).await;
    respond(&request_id, result, HttpError::into_response)
}

async fn serve(state: &AppState, body: Body, request_id: &str) -> Result<Response, HttpError> {
    let request: ResponsesRequest = parse_body(body)?;
    conversation::check_model(state.config(), request.model.as_deref())?;
    let format = request.text.as_ref().and_then(|text| text.get("format"));
    let answer = super::structured::answer_schema(format, "text.format")?;
    if request.max_output_tokens == Some(0) {
        return Err(HttpError::InvalidParameter {
            param: "max_output_tokens",
            reason: "must be at least 1",
        });
    }
    let instructions = match &request.instructions {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            return Err(HttpError::InvalidParameter {
                param: "instructions",
                reason: "must be a string",
            })
        }
    };
    let sampling = state.config().sampling.resolve(SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed,
        ..SamplingFields::default()
    })?;
    let given_tools = request.tools.unwrap_or_default();
    let (definitions, echoed_tools, custom) = function_tools(&given_tools)?;
    let choice = ToolChoice::from_openai(request.tool_choice.as_ref())?;
    let parallel = request.parallel_tool_calls.unwrap_or(true);
    let custom_names: Vec<String> = custom.iter().map(|(name, _)| name.clone()).collect();
    let tools = ToolRequest::new(definitions, choice.clone(), parallel)?.with_custom(custom);

    let mut conversation = match &request.previous_response_id {
        Some(id) => match state.responses().get(id) {
            Some(items) => items.as_ref().clone(),
            None => return Err(HttpError::PreviousResponseNotFound { id: id.clone() }),
        },
        None => Vec::new(),
    };
    conversation.extend(input_items(request.input)?);
    if conversation.is_empty() {
        return Err(HttpError::InvalidParameter {
            param: "input",
            reason: "must hold at least one item",
        });
    }
    let input = ChatInput {
        messages: chat_messages(instructions.as_deref(), &conversation)?,
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    let store = request.store.unwrap_or(true);
    let base = json!({
        "id": format!("resp_{request_id}"),
        "object": "response",
        "created_at": unix_time(),
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": state.config().model,
        "output": [],
        "parallel_tool_calls": parallel,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": null, "summary": null},
        "store": store,
        "temperature": rounded(sampling.params.temperature),
        "text": {"format": {"type": "text"}},
        "tool_choice": tool_choice_json(&choice, &tools),
        "tools": echoed_tools,
        "top_p": rounded(sampling.params.top_p),
        "truncation": "disabled",
        "usage": null,
        "user": request.user,
        "metadata": request.metadata.filter(Value::is_object).unwrap_or_else(|| json!({})),
    });
    let answer = answer.map(|schema| (schema, "text.format"));
    let sent = Job::chat(
        state,
        input,
        request.max_output_tokens,
        sampling,
        tools,
        answer,
    )
    .await?;
    let mut generation = generation::start(state, sent).await?;
    let mut format = ResponseStream::new(base, request.stream).with_custom_tools(custom_names);
    if store {
        format.record = Some(Record {
            state: state.clone(),
            conversation,
        });
    }
    if request.stream {
        return Ok(sse::response(generation, format, request_id));
    }
    loop {
        match generation.next_chunk().await {
            Some(Chunk::Output(event)) => {
                format.apply(&event);
            }
            Some(Chunk::Finished {
                finish,
                completion_tokens,
            }) => {
                let usage = Usage::new(&generation, completion_tokens);
                format.finished(finish, usage);
                return Ok(Json(format.response).into_response());
            }
            Some(Chunk::Failed(error)) => return Err(error),
            None => return Err(HttpError::WorkerGone),
        }
    }
}

/// A sampling value as the response echoes it (f32 noise rounded off).
fn rounded(value: f32) -> f64 {
    (f64::from(value) * 1e6).round() / 1e6
}

/// The function and custom tools of `tools` in chat's shape (for the
/// template and the tool policy), as the response echoes them, and the
/// custom tools' input formats; hosted tools are skipped with a warning. A
/// bad definition is named by its position in `tools`.
fn function_tools(tools: &[Value]) -> Result<FunctionTools, HttpError> {
    let mut definitions = Vec::new();
    let mut echoed = Vec::new();
    let mut custom = Vec::new();
    let mut positions = Vec::new();
    for (position, tool) in tools.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str);
        if kind == Some("custom") {
            let (definition, input) = custom_tool(tool)?;
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                custom.push((name.to_owned(), input));
            }
            definitions.push(definition);
            echoed.push(tool.clone());
            positions.push(position);
            continue;
        }
        if kind != Some("function") {
            eprintln!(
                "flare: skipping tool of type {kind:?} in a responses request: \
                 only function and custom tools are served"
            );
            continue;
        }
        let mut function = Map::new();
        // The chat shape (`function: {..}`) is accepted too.
        let fields = tool
            .get("function")
            .filter(|f| f.is_object())
            .unwrap_or(tool);
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(value) = fields.get(key).filter(|value| !value.is_null()) {
                function.insert(key.to_owned(), value.clone());
            }
        }
        let mut echo = function.clone();
        echo.insert("type".to_owned(), json!("function"));
        for key in ["description", "parameters", "strict"] {
            echo.entry(key).or_insert(Value::Null);
        }
        echoed.push(Value::Object(echo));
        definitions.push(json!({"type": "function", "function": function}));
        positions.push(position);
    }
    if let Err(error) = crate::frontend::protocol::ToolSet::from_definitions(&definitions) {
        let at = |index: usize| positions.get(index).copied().unwrap_or(index);
        return Err(HttpError::InvalidTools(match error {
            ToolSetError::NotAFunction { index } => ToolSetError::NotAFunction { index: at(index) },
            ToolSetError::Duplicate { index, name } => ToolSetError::Duplicate {
                index: at(index),
                name,
            },
        }));
    }
    Ok((definitions, echoed, custom))
}

/// Tool definitions in chat's shape, as echoed, and the custom tools'
/// input formats.
type FunctionTools = (Vec<Value>, Vec<Value>, Vec<(String, CustomInput)>);

/// A custom tool (`{"type": "custom", "name", "description", "format"}`)
/// as the template sees it: a function of one string argument, `input`,
/// whose description gives the grammar (the model writes what it is held
/// to); one with a grammar is `strict`, so `auto` holds its calls too.
fn custom_tool(tool: &Value) -> Result<(Value, CustomInput), HttpError> {
    let invalid = |reason| HttpError::InvalidParameter {
        param: "tools",
        reason,
    };
    let format = tool.get("format").filter(|format| !format.is_null());
    let input = match format.map(|format| (format.get("type"), format)) {
        None => CustomInput::Text,
        Some((Some(Value::String(kind)), _)) if kind == "text" => CustomInput::Text,
        Some((Some(Value::String(kind)), format)) if kind == "grammar" => {
            let definition = format.get("definition").and_then(Value::as_str);
            match (format.get("syntax").and_then(Value::as_str), definition) {
                (Some("lark"), Some(definition)) => CustomInput::Lark(definition.to_owned()),
                (Some("regex"), Some(definition)) => CustomInput::Regex(definition.to_owned()),
                _ => {
                    return Err(invalid(
                        "a custom tool's grammar format needs `syntax` \"lark\" or \"regex\" \
                         and a `definition` string",
                    ))
                }
            }
        }
        _ => {
            return Err(invalid(
                "a custom tool's `format` must be of type text or grammar",
            ))
        }
    };
    let about = match &input {
        CustomInput::Text => "The tool's input, as text.".to_owned(),
        CustomInput::Lark(grammar) => {
            format!("The tool's input, text in this Lark grammar:\n{grammar}")
        }
        CustomInput::Regex(regex) => format!("The tool's input, text matching the regex {regex}"),
    };
    let mut function = json!({
        "name": tool.get("name").cloned().unwrap_or(Value::Null),
        "parameters": {
            "type": "object",
            "properties": {CUSTOM_INPUT_KEY: {"type": "string", "description": about}},
            "required": [CUSTOM_INPUT_KEY],
            "additionalProperties": false,
        },
        "strict": input != CustomInput::Text,
    });
    if let Some(description) = tool.get("description").filter(|d| d.is_string()) {
        function["description"] = description.clone();
    }
    Ok((json!({"type": "function", "function": function}), input))
}

/// `tool_choice` as the response echoes it.
fn tool_choice_json(choice: &ToolChoice, tools: &ToolRequest) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Named(name) if tools.is_custom(name) => json!({"type": "custom", "name": name}),
        ToolChoice::Named(name) => json!({"type": "function", "name": name}),
    }
}

/// `input` as a list of items: a string is one user message.
fn input_items(input: Option<Value>) -> Result<Vec<Value>, HttpError> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![
            json!({"type": "message", "role": "user", "content": text}),
        ]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(HttpError::InvalidParameter {
            param: "input",
            reason: "must be a string or a list of input items",
        }),
    }
}

fn invalid_input(reason: &'static str) -> HttpError {
    HttpError::InvalidParameter {
        param: "input",
        reason,
    }
}

/// The chat messages of a conversation of Responses items, after
/// `instructions` as a system message, checked as chat's messages are.
fn chat_messages(instructions: Option<&str>, items: &[Value]) -> Result<Vec<Value>, HttpError> {
    let mut messages: Vec<Value> = Vec::with_capacity(items.len() + 1);
    if let Some(instructions) = instructions.filter(|text| !text.is_empty()) {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    // Whether the last message is an assistant turn later calls join.
    let mut assistant_open = false;
    // Reasoning waiting for the next assistant turn.
    let mut reasoning: Vec<String> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = format!("input[{index}]");
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(kind) => kind,
            None if item.get("role").is_some() => "message",
            None => return Err(invalid_input("holds an item without a `type`")),
        };
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some(role @ ("user" | "system" | "developer" | "assistant")) => role,
                    _ => {
                        return Err(invalid_input(
                            "holds a message whose role is not user, system, developer or \
                             assistant",
                        ))
                    }
                };
                let content = content_text(item.get("content"), &format!("{at}.content"))?;
                let mut message = Map::new();
                message.insert("role".to_owned(), json!(role));
                message.insert("content".to_owned(), json!(content));
                if role == "assistant" {
                    take_reasoning(&mut message, &mut reasoning);
                }
                messages.push(Value::Object(message));
                assistant_open = role == "assistant";
            }
            "function_call" | "custom_tool_call" => {
                let field = |name| item.get(name).and_then(Value::as_str);
                let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                    return Err(invalid_input(
                        "holds a function_call or custom_tool_call item without a `call_id` \
                         and a `name`",
                    ));
                };
                // A custom tool's input is its function's one argument.
                let arguments = match kind {
                    "custom_tool_call" => {
                        json!({CUSTOM_INPUT_KEY: field("input").unwrap_or_default()}).to_string()
                    }
                    _ => field("arguments").unwrap_or("{}").to_owned(),
                };
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                });
                let open = messages.last_mut().filter(|_| assistant_open);
                match open.and_then(Value::as_object_mut) {
                    Some(message) => {
                        take_reasoning(message, &mut reasoning);
                        let calls = message.entry("tool_calls").or_insert_with(|| json!([]));
                        if let Some(calls) = calls.as_array_mut() {
                            calls.push(call);
                        }
                    }
                    None => {
                        let mut message = Map::new();
                        message.insert("role".to_owned(), json!("assistant"));
                        message.insert("content".to_owned(), Value::Null);
                        take_reasoning(&mut message, &mut reasoning);
                        message.insert("tool_calls".to_owned(), json!([call]));
                        messages.push(Value::Object(message));
                    }
                }
                assistant_open = true;
            }
            "function_call_output" | "custom_tool_call_output" => {
                let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(invalid_input(
                        "holds a function_call_output or custom_tool_call_output item without \
                         a `call_id`",
                    ));
                };
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(parts @ Value::Array(_)) => {
                        content_text(Some(parts), &format!("{at}.output"))?
                    }
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                };
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                assistant_open = false;
            }
            "reasoning" => {
                let texts = |field: &str| -> Vec<String> {
                    (item
                        .get(field)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten())
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
                };
                let content = texts("content");
                let text = if content.is_empty() {
                    texts("summary")
                } else {
                    content
                };
                reasoning.extend(text);
                assistant_open = false;
            }
            other => {
                return Err(HttpError::UnsupportedContent {
                    at,
                    kind: other.to_owned(),
                })
            }
        }
    }
    conversation::openai_messages(messages)
}

/// Gives `message` the pending reasoning, if any.
fn take_reasoning(message: &mut Map<String, Value>, reasoning: &mut Vec<String>) {
    if reasoning.is_empty() || message.contains_key("reasoning_content") {
        return;
    }
    let text = reasoning.join("\n");
    reasoning.clear();
    message.insert("reasoning_content".to_owned(), json!(text));
}

/// A message's content (a string or a list of parts) as one string; `at`
/// names it in errors. Text parts (`input_text`, `output_text`, a refusal)
/// join with a newline; any other part is refused, naming it.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, HttpError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(text)) => return Ok(text.clone()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(invalid_input(
                "holds content that is not a string or a list of content parts",
            ))
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (position, part) in parts.iter().enumerate() {
        let field = match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            Some(kind) => {
                return Err(HttpError::UnsupportedContent {
                    at: format!("{at}[{position}]"),
                    kind: kind.to_owned(),
                })
            }
            None => return Err(invalid_input("holds a content part without a `type`")),
        };
        match part.get(field).and_then(Value::as_str) {
            Some(text) => texts.push(text),
            None => return Err(invalid_input("holds a text part without its text")),
        }
    }
    Ok(texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_their_outputs_become_tool_calls_and_tool_messages() {
        let items = vec![
            json!({"role": "user", "content": "weather in Paris and Rome?"}),
            json!({"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": "two calls"}]}),
            json!({"type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_a",
                "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}),
            json!({"type": "function_call", "call_id": "call_b", "name": "get_weather",
                "arguments": "{\"city\": \"Rome\"}", "status": "completed"}),
            json!({"type": "function_call_output", "call_id": "call_a", "output": "sunny"}),
            json!({"type": "function_call_output", "call_id": "call_b",
                "output": [{"type": "input_text", "text": "rain"}]}),
        ];
        let messages = chat_messages(Some("be brief"), &items).unwrap();
        assert_eq!(messages.len(), 5, "{messages:?}");
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[1]["role"], "user");
        let assistant = &messages[2];
        assert_eq!(assistant["role"], "assistant");
        assert_eq!(assistant["content"], "Checking.");
        assert_eq!(assistant["reasoning_content"], "two calls");
        assert_eq!(assistant["reasoning"], "two calls");
        let calls = assistant["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "call_a");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        // The arguments reach the template as the object they encode.
        assert_eq!(calls[1]["function"]["arguments"], json!({"city": "Rome"}));
        assert_eq!(
            messages[3],
            json!({"role": "tool", "tool_call_id": "call_a", "content": "sunny"})
        );
        assert_eq!(messages[4]["tool_call_id"], "call_b");
        assert_eq!(messages[4]["content"], "rain");
    }

    #[test]
    fn a_call_without_an_assistant_message_opens_one_and_parts_join() {
        let items = vec![
            json!({"type": "message", "role": "developer",
                "content": [{"type": "input_text", "text": "one"},
                            {"type": "input_text", "text": "two"}]}),
            json!({"type": "function_call", "call_id": "call_x", "name": "now",
                "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "call_x", "output": "noon"}),
            json!({"type": "function_call", "call_id": "call_y", "name": "now",
                "arguments": "{}"}),
        ];
        let messages = chat_messages(None, &items).unwrap();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "one\ntwo"})
        );
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[1]["content"], Value::Null);
        assert_eq!(messages[1]["tool_calls"][0]["id"], "call_x");
        assert_eq!(messages[2]["role"], "tool");
        // After a tool message, a call is a new assistant turn.
        assert_eq!(messages[3]["role"], "assistant");
        assert_eq!(messages[3]["tool_calls"][0]["id"], "call_y");
    }

    #[test]
    fn unsupported_parts_and_items_are_refused_where_they_are() {
        let image = vec![json!({"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]})];
        let error = chat_messages(None, &image).unwrap_err();
        assert!(
            matches!(error, HttpError::UnsupportedContent { .. }),
            "{error}"
        );
        assert_eq!(error.param().as_deref(), Some("input[0].content[1]"));
        let file = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"type": "message", "role": "user",
                "content": [{"type": "input_file", "file_id": "f"}]}),
        ];
        let error = chat_messages(None, &file).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("input[1].content[0]"));
        let hosted = vec![json!({"type": "web_search_call", "id": "ws_1"})];
        let error = chat_messages(None, &hosted).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("input[0]"));
        let role = vec![json!({"type": "message", "role": "tool", "content": "x"})];
        assert_eq!(
            chat_messages(None, &role).unwrap_err().param().as_deref(),
            Some("input")
        );
        let call = vec![json!({"type": "function_call", "name": "now"})];
        assert!(chat_messages(None, &call).is_err());
    }

    #[test]
    fn flat_function_tools_take_the_chat_shape_and_hosted_ones_are_skipped() {
        let tools = vec![
            json!({"type": "web_search"}),
            json!({"type": "function", "name": "get_weather", "description": "Weather.",
                "parameters": {"type": "object"}, "strict": true}),
            json!({"type": "file_search", "vector_store_ids": []}),
            json!({"type": "function", "name": "now"}),
        ];
        let (definitions, echoed, custom) = function_tools(&tools).unwrap();
        assert!(custom.is_empty());
        assert_eq!(
            definitions,
            vec![
                json!({"type": "function", "function": {"name": "get_weather",
                    "description": "Weather.", "parameters": {"type": "object"},
                    "strict": true}}),
                json!({"type": "function", "function": {"name": "now"}}),
            ]
        );
        assert_eq!(echoed.len(), 2);
        assert_eq!(echoed[1]["type"], "function");
        assert_eq!(echoed[1]["name"], "now");
        assert_eq!(echoed[1]["parameters"], Value::Null);
        // A bad definition is named by its place in the request.
        let duplicate = vec![
            json!({"type": "web_search"}),
            json!({"type": "function", "name": "now"}),
            json!({"type": "function", "name": "now"}),
        ];
        let error = function_tools(&duplicate).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("tools[2]"));
        let nameless = vec![json!({"type": "web_search"}), json!({"type": "function"})];
        let error = function_tools(&nameless).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("tools[1]"));
    }
}
