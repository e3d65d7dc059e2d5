//! `POST /v1/chat/completions`, streamed and not, with tools
//! (`tool_choice`, `parallel_tool_calls`), tool calls and reasoning
//! (`reasoning_content`, also spelled `reasoning`) on the message and in
//! deltas.

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::conversation;
use super::error::HttpError;
use super::generation::{self, Collected, Finish, Job};
use super::sampling::SamplingFields;
use super::sse::{self, json_event, StreamFormat, Usage};
use super::tools::{call_id, ToolChoice, ToolRequest};
use super::{
    new_request_id, parse_sampled_body, respond, unix_time, AppState, Body, StreamOptions,
};
use crate::frontend::protocol::{OutputEvent, ParsedOutput};
use crate::frontend::ChatInput;

/// The fields of a chat completion request Helios reads.
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<Value>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    n: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<Value>,
    chat_template_kwargs: Option<Map<String, Value>>,
    /// End the prompt inside the final message, which the output continues
    /// (vLLM's spelling; it turns the generation prompt off by default).
    #[serde(default)]
    continue_final_message: bool,
    /// Open a new assistant turn (default: unless continuing).
    add_generation_prompt: Option<bool>,
    #[serde(flatten)]
    sampling: SamplingFields,
}

/// The handler: every response, success or failure, names the request.
pub async fn completions(State(state): State<AppState>, body: Body) -> Response {
    let request_id = new_request_id();
    let result = serve(&state, body, &request_id).await;
    respond(&request_id, result, HttpError::into_response)
}

async fn serve(state: &AppState, body: Body, request_id: &str) -> Result<Response, HttpError> {
    let request: ChatRequest = parse_sampled_body(body)?;
    conversation::check_model(state.config(), request.model.as_deref())?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(HttpError::InvalidParameter {
            param: "n",
            reason: "must be 1",
        });
    }
    let continue_final_message = request.continue_final_message;
    let add_generation_prompt = request
        .add_generation_prompt
        .unwrap_or(!continue_final_message);
    if continue_final_message && add_generation_prompt {
        return Err(HttpError::InvalidParameter {
            param: "add_generation_prompt",
            reason: "must be false when continue_final_message is true",
        });
    }
    let sampling = state.config().sampling.resolve(request.sampling)?;
    let tools = ToolRequest::new(
        request.tools.unwrap_or_default(),
        ToolChoice::from_openai(request.tool_choice.as_ref())?,
        request.parallel_tool_calls.unwrap_or(true),
    )?;
    let input = ChatInput {
        messages: conversation::openai_messages(request.messages)?,
        add_generation_prompt,
        continue_final_message,
        kwargs: request.chat_template_kwargs.unwrap_or_default(),
        ..ChatInput::default()
    };
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
    let answer =
        super::structured::answer_schema(request.response_format.as_ref(), "response_format")?;
    let answer = answer.map(|schema| (schema, "response_format"));
    let sent = Job::chat(state, input, max_tokens, sampling, tools, answer).await?;
    let mut generation = generation::start(state, sent).await?;
    let header = Header {
        id: format!("chatcmpl-{request_id}"),
        created: unix_time(),
        model: state.config().model.clone(),
    };
    if request.stream {
        let include_usage = request.stream_options.unwrap_or_default().include_usage;
        let format = ChatStream {
            header,
            include_usage,
            call_ids: Vec::new(),
        };
        return Ok(sse::response(generation, format, request_id));
    }
    let Collected {
        output,
        finish,
        completion_tokens,
    } = generation::collect(&mut generation).await?;
    let usage = Usage::new(&generation, completion_tokens);
    Ok(Json(json!({
        "id": header.id,
        "object": "chat.completion",
        "created": header.created,
        "model": header.model,
        "choices": [{
            "index": 0,
            "message": message(output),
            "logprobs": null,
            "finish_reason": finish.openai(),
        }],
        "usage": usage,
    }))
    .into_response())
}

/// The assistant message of a collected output: `content` (`null` when a
/// call-only answer has none), reasoning under both names, and the calls.
fn message(output: ParsedOutput) -> Value {
    let mut message = Map::new();
    message.insert("role".to_owned(), json!("assistant"));
    let content = if output.text.is_empty() && !output.calls.is_empty() {
        Value::Null
    } else {
        Value::from(output.text)
    };
    message.insert("content".to_owned(), content);
    if !output.reasoning.is_empty() {
        message.insert("reasoning_content".to_owned(), json!(output.reasoning));
        message.insert("reasoning".to_owned(), json!(output.reasoning));
    }
    if !output.calls.is_empty() {
        let calls: Vec<Value> = (output.calls.into_iter())
            .map(|call| {
                json!({
                    "id": call_id("call_"),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        message.insert("tool_calls".to_owned(), Value::from(calls));
    }
    Value::Object(message)
}

/// What every chunk of one response repeats.
#[derive(Debug, Clone)]
struct Header {
    id: String,
    created: u64,
    model: String,
}

/// OpenAI's `chat.completion.chunk` stream, ending with `[DONE]`.
struct ChatStream {
    header: Header,
    include_usage: bool,
    /// The ids of the calls started so far, by index.
    call_ids: Vec<String>,
}

impl ChatStream {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Event {
        json_event(&json!({
            "id": self.header.id,
            "object": "chat.completion.chunk",
            "created": self.header.created,
            "model": self.header.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        }))
    }
}

impl StreamFormat for ChatStream {
    fn start(&mut self) -> Vec<Event> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn output(&mut self, event: &OutputEvent) -> Vec<Event> {
        let delta = match event {
            OutputEvent::Text(text) => json!({"content": text}),
            OutputEvent::Reasoning(text) => json!({"reasoning_content": text, "reasoning": text}),
            OutputEvent::ToolCallStart { index, name } => {
                let id = call_id("call_");
                self.call_ids.push(id.clone());
                json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]})
            }
            OutputEvent::ToolCallArguments { index, delta } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
            }
            OutputEvent::ToolCallEnd { .. } => return Vec::new(),
        };
        vec![self.chunk(delta, None)]
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event> {
        let mut events = vec![self.chunk(json!({}), Some(finish.openai()))];
        if self.include_usage {
            events.push(json_event(&json!({
                "id": self.header.id,
                "object": "chat.completion.chunk",
                "created": self.header.created,
                "model": self.header.model,
                "choices": [],
                "usage": usage,
            })));
        }
        events.push(Event::default().data("[DONE]"));
        events
    }

    fn error(&mut self, error: &HttpError) -> Vec<Event> {
        vec![json_event(&error.envelope())]
    }
}
