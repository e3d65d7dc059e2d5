//! Anthropic's `POST /v1/messages` with text content, streamed and not; a
//! conversation ending in an assistant turn is continued (prefill).

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::conversation;
use super::error::{AnthropicError, HttpError};
use super::generation::{self, Finish, Job};
use super::sampling::{SamplingFields, Stop};
use super::sse::{self, StreamFormat, Usage};
use super::{new_request_id, parse_body, respond, AppState, Body};
use crate::frontend::ChatInput;

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    /// A string or a list of content blocks.
    content: Value,
}

/// The fields of a messages request Helios reads.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    max_tokens: u32,
    messages: Vec<Message>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
}

/// The handler: every response, success or failure, names the request.
pub async fn messages(State(state): State<AppState>, body: Body) -> Response {
    let request_id = new_request_id();
    let result = serve(&state, body, &request_id).await;
    respond(&request_id, result, |error| {
        AnthropicError(error).into_response()
    })
}

async fn serve(state: &AppState, body: Body, request_id: &str) -> Result<Response, HttpError> {
    let request: MessagesRequest = parse_body(body)?;
    conversation::check_model(state.config(), request.model.as_deref())?;
    let sampling = state.config().sampling.resolve(SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        stop: request.stop_sequences.clone().map(Stop::Many),
        ..SamplingFields::default()
    })?;
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = request.system {
        let content = conversation::anthropic_text(system, "system")?;
        messages.push(json!({"role": "system", "content": content}));
    }
    // A conversation ending in an assistant turn is that turn's prefill:
    // the output continues it.
    let prefill = (request.messages.last()).is_some_and(|message| message.role == "assistant");
    for (index, message) in request.messages.into_iter().enumerate() {
        conversation::anthropic_role(index, &message.role)?;
        let at = format!("messages[{index}].content");
        let content = conversation::anthropic_text(message.content, &at)?;
        messages.push(json!({"role": message.role, "content": content}));
    }
    let input = ChatInput {
        messages,
        add_generation_prompt: !prefill,
        continue_final_message: prefill,
        ..ChatInput::default()
    };
    let job = Job::chat(state, input, Some(request.max_tokens), sampling).await?;
    let mut generation = generation::start(state, job).await?;
    let format = MessageStream {
        id: format!("msg_{request_id}"),
        model: state.config().model.clone(),
        stops: request.stop_sequences.unwrap_or_default(),
        input_tokens: generation.prompt_tokens - generation.cached_tokens,
        cache_read_input_tokens: generation.cached_tokens,
    };
    if request.stream {
        return Ok(sse::response(generation, format, request_id));
    }
    let (text, finish, output_tokens) = generation::collect(&mut generation).await?;
    let mut body = format.message(json!([{"type": "text", "text": text}]), Some(finish));
    body["usage"]["output_tokens"] = json!(output_tokens);
    Ok(Json(body).into_response())
}

/// Anthropic's message object and its event stream.
struct MessageStream {
    id: String,
    model: String,
    stops: Vec<String>,
    /// Prompt tokens prefilled (Anthropic counts cached ones apart).
    input_tokens: u32,
    /// Prompt tokens restored from a prefix checkpoint.
    cache_read_input_tokens: u32,
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl MessageStream {
    fn stop_sequence(&self, finish: Option<Finish>) -> Option<&str> {
        match finish {
            Some(Finish::StopSequence(index)) => self.stops.get(index).map(String::as_str),
            _ => None,
        }
    }

    fn message(&self, content: Value, finish: Option<Finish>) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": finish.map(Finish::anthropic),
            "stop_sequence": self.stop_sequence(finish),
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_read_input_tokens": self.cache_read_input_tokens,
                "output_tokens": 0,
            },
        })
    }
}

impl StreamFormat for MessageStream {
    fn start(&mut self) -> Vec<Event> {
        let start = json!({"type": "message_start", "message": self.message(json!([]), None)});
        let block = json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}});
        vec![
            event("message_start", &start),
            event("content_block_start", &block),
        ]
    }

    fn text(&mut self, text: &str) -> Vec<Event> {
        let delta = json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}});
        vec![event("content_block_delta", &delta)]
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event> {
        let delta = json!({
            "type": "message_delta",
            "delta": {
                "stop_reason": finish.anthropic(),
                "stop_sequence": self.stop_sequence(Some(finish)),
            },
            "usage": {"output_tokens": usage.completion_tokens},
        });
        vec![
            event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            event("message_delta", &delta),
            event("message_stop", &json!({"type": "message_stop"})),
        ]
    }

    fn error(&mut self, error: &HttpError) -> Vec<Event> {
        vec![event("error", &error.anthropic_envelope())]
    }
}
