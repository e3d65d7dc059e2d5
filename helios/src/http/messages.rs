//! Anthropic's `POST /v1/messages`, streamed and not: text, `tool_use` and
//! `tool_result` blocks, `tools` and `tool_choice`, `thinking` blocks
//! (replayed ones accepted; `thinking: {type: enabled | disabled}` reaches
//! the template as `enable_thinking`); a conversation ending in an
//! assistant turn is continued (prefill). `seed` is accepted as a Helios
//! extension (chat's field, as on Responses): the same prompt, sampling and
//! seed give the same tokens on every route.

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::conversation;
use super::error::{AnthropicError, HttpError};
use super::generation::{self, Collected, Finish, Job};
use super::sampling::{SamplingFields, Stop};
use super::sse::{self, StreamFormat, Usage};
use super::tools::{call_id, ToolChoice, ToolRequest};
use super::{new_request_id, parse_body, respond, AppState, Body};
use crate::frontend::protocol::{OutputEvent, ParsedOutput};
use crate::frontend::ChatInput;

/// The signature of a thinking block: Anthropic's clients require one, and
/// a local server has nothing to sign.
const PLACEHOLDER_SIGNATURE: &str = "flare-unsigned";

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
    /// Helios's extension: the request's random seed.
    seed: Option<u64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

/// The handler: every response, success or failure, names the request.
pub async fn messages(State(state): State<AppState>, body: Body) -> Response {
    let request_id = new_request_id();
    let result = serve(&state, body, &request_id).await;
    respond(&request_id, result, |error| {
        AnthropicError(error).into_response()
    })
}

/// `thinking` as the template's `enable_thinking`.
fn thinking_kwargs(thinking: Option<&Value>) -> Result<Map<String, Value>, HttpError> {
    let mut kwargs = Map::new();
    match thinking.and_then(|t| t.get("type")).and_then(Value::as_str) {
        None if thinking.is_none() => {}
        Some("enabled") => {
            kwargs.insert("enable_thinking".to_owned(), Value::Bool(true));
        }
        Some("disabled") => {
            kwargs.insert("enable_thinking".to_owned(), Value::Bool(false));
        }
        _ => return Err(HttpError::InvalidParameter {
            param: "thinking",
            reason:
                "must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
        }),
    }
    Ok(kwargs)
}

async fn serve(state: &AppState, body: Body, request_id: &str) -> Result<Response, HttpError> {
    let request: MessagesRequest = parse_body(body)?;
    conversation::check_model(state.config(), request.model.as_deref())?;
    let sampling = state.config().sampling.resolve(SamplingFields {
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        seed: request.seed,
        stop: request.stop_sequences.clone().map(Stop::Many),
        ..SamplingFields::default()
    })?;
    let (choice, parallel) = ToolChoice::from_anthropic(request.tool_choice.as_ref())?;
    let definitions = conversation::anthropic_tools(request.tools.unwrap_or_default());
    let tools = ToolRequest::new(definitions, choice, parallel)?;
    let turns = (request.messages.into_iter())
        .map(|message| (message.role, message.content))
        .collect();
    let (messages, prefill) = conversation::anthropic_messages(request.system, turns)?;
    let input = ChatInput {
        messages,
        add_generation_prompt: !prefill,
        continue_final_message: prefill,
        kwargs: thinking_kwargs(request.thinking.as_ref())?,
        ..ChatInput::default()
    };
    let sent = Job::chat(
        state,
        input,
        Some(request.max_tokens),
        sampling,
        tools,
        None,
    )
    .await?;
    let mut generation = generation::start(state, sent).await?;
    let format = MessageStream {
        id: format!("msg_{request_id}"),
        model: state.config().model.clone(),
        stops: request.stop_sequences.unwrap_or_default(),
        input_tokens: generation.prompt_tokens - generation.cached_tokens,
        cache_read_input_tokens: generation.cached_tokens,
        blocks: 0,
        open: None,
    };
    if request.stream {
        return Ok(sse::response(generation, format, request_id));
    }
    let Collected {
        output,
        finish,
        completion_tokens,
    } = generation::collect(&mut generation).await?;
    let mut body = format.message(content(output), Some(finish));
    body["usage"]["output_tokens"] = json!(completion_tokens);
    Ok(Json(body).into_response())
}

/// The content blocks of a collected output: thinking, text, tool uses.
fn content(output: ParsedOutput) -> Value {
    let mut blocks = Vec::new();
    if !output.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": output.reasoning,
            "signature": PLACEHOLDER_SIGNATURE}));
    }
    if !output.text.is_empty() || output.calls.is_empty() {
        blocks.push(json!({"type": "text", "text": output.text}));
    }
    for call in output.calls {
        blocks.push(
            json!({"type": "tool_use", "id": call_id("toolu_"), "name": call.name,
            "input": input_object(&call.arguments)}),
        );
    }
    Value::from(blocks)
}

/// A call's arguments as the object `tool_use.input` needs (`{}` when the
/// text is not a JSON object, as a truncated call's is).
fn input_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        _ => json!({}),
    }
}

/// The kind of the content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse(usize),
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
    /// Content blocks started so far.
    blocks: usize,
    /// The block being streamed, if any.
    open: Option<Block>,
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

    /// Closes the open block (a thinking block gets its signature first).
    fn close(&mut self, events: &mut Vec<Event>) {
        let Some(block) = self.open.take() else {
            return;
        };
        let index = self.blocks - 1;
        if block == Block::Thinking {
            let delta = json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": PLACEHOLDER_SIGNATURE}});
            events.push(event("content_block_delta", &delta));
        }
        let stop = json!({"type": "content_block_stop", "index": index});
        events.push(event("content_block_stop", &stop));
    }

    /// Makes `block` the open block, closing another; its index.
    fn open(&mut self, block: Block, start: Value, events: &mut Vec<Event>) -> usize {
        if self.open != Some(block) {
            self.close(events);
            let index = self.blocks;
            self.blocks += 1;
            self.open = Some(block);
            let start = json!({"type": "content_block_start", "index": index,
                "content_block": start});
            events.push(event("content_block_start", &start));
        }
        self.blocks - 1
    }

    fn delta(index: usize, delta: Value) -> Event {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }
}

impl StreamFormat for MessageStream {
    fn start(&mut self) -> Vec<Event> {
        let start = json!({"type": "message_start", "message": self.message(json!([]), None)});
        vec![event("message_start", &start)]
    }

    fn output(&mut self, output: &OutputEvent) -> Vec<Event> {
        let mut events = Vec::new();
        match output {
            OutputEvent::Text(text) => {
                let start = json!({"type": "text", "text": ""});
                let index = self.open(Block::Text, start, &mut events);
                events.push(Self::delta(
                    index,
                    json!({"type": "text_delta", "text": text}),
                ));
            }
            OutputEvent::Reasoning(text) => {
                let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                let index = self.open(Block::Thinking, start, &mut events);
                let delta = json!({"type": "thinking_delta", "thinking": text});
                events.push(Self::delta(index, delta));
            }
            OutputEvent::ToolCallStart { index, name } => {
                let start = json!({"type": "tool_use", "id": call_id("toolu_"), "name": name,
                    "input": {}});
                self.open(Block::ToolUse(*index), start, &mut events);
            }
            OutputEvent::ToolCallArguments { index, delta } => {
                if self.open == Some(Block::ToolUse(*index)) {
                    let delta = json!({"type": "input_json_delta", "partial_json": delta});
                    events.push(Self::delta(self.blocks - 1, delta));
                }
            }
            OutputEvent::ToolCallEnd { .. } => self.close(&mut events),
        }
        events
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event> {
        let mut events = Vec::new();
        self.close(&mut events);
        let delta = json!({
            "type": "message_delta",
            "delta": {
                "stop_reason": finish.anthropic(),
                "stop_sequence": self.stop_sequence(Some(finish)),
            },
            "usage": {"output_tokens": usage.completion_tokens},
        });
        events.push(event("message_delta", &delta));
        events.push(event("message_stop", &json!({"type": "message_stop"})));
        events
    }

    fn error(&mut self, error: &HttpError) -> Vec<Event> {
        vec![event("error", &error.anthropic_envelope())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_reaches_the_template_as_enable_thinking() {
        let on = thinking_kwargs(Some(&json!({"type": "enabled", "budget_tokens": 512})));
        assert_eq!(on.unwrap()["enable_thinking"], true);
        let off = thinking_kwargs(Some(&json!({"type": "disabled"})));
        assert_eq!(off.unwrap()["enable_thinking"], false);
        assert!(thinking_kwargs(None).unwrap().is_empty());
        let error = thinking_kwargs(Some(&json!({"type": "maybe"}))).unwrap_err();
        assert_eq!(error.param().as_deref(), Some("thinking"));
    }

    #[test]
    fn a_truncated_call_still_has_an_object_as_input() {
        assert_eq!(input_object("{\"city\": \"Par"), json!({}));
        assert_eq!(
            input_object("{\"city\": \"Paris\"}"),
            json!({"city": "Paris"})
        );
    }
}
