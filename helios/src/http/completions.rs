//! `POST /v1/completions`: a raw prompt, streamed and not.

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::conversation;
use super::error::HttpError;
use super::generation::{self, Finish, Job};
use super::sampling::SamplingFields;
use super::sse::{self, json_event, StreamFormat, Usage};
use super::{
    new_request_id, parse_sampled_body, respond, unix_time, AppState, Body, StreamOptions,
};
use crate::frontend::protocol::OutputEvent;

/// OpenAI's default output limit for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// `prompt`: text, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Batch(Vec<String>),
}

/// The fields of a completion request Helios reads.
#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Prompt,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    n: Option<u32>,
    #[serde(default)]
    echo: bool,
    #[serde(flatten)]
    sampling: SamplingFields,
}

/// The handler: every response, success or failure, names the request.
pub async fn completions(State(state): State<AppState>, body: Body) -> Response {
    let request_id = new_request_id();
    let result = serve(&state, body, &request_id).await;
    respond(&request_id, result, HttpError::into_response)
}

fn invalid(param: &'static str, reason: &'static str) -> HttpError {
    HttpError::InvalidParameter { param, reason }
}

async fn serve(state: &AppState, body: Body, request_id: &str) -> Result<Response, HttpError> {
    let request: CompletionRequest = parse_sampled_body(body)?;
    conversation::check_model(state.config(), request.model.as_deref())?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(invalid("n", "must be 1"));
    }
    if request.echo {
        return Err(invalid("echo", "is not supported"));
    }
    let sampling = state.config().sampling.resolve(request.sampling)?;
    let text = match request.prompt {
        Prompt::Tokens(tokens) => Err(tokens),
        Prompt::Text(text) => Ok(text),
        Prompt::Batch(mut texts) if texts.len() == 1 => Ok(texts.pop().unwrap_or_default()),
        Prompt::Batch(_) => return Err(invalid("prompt", "must be one prompt")),
    };
    let max_tokens = Some(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS));
    // A text prompt is encoded (with the tokenizer's special tokens), every
    // prompt's prefix chain hashed and the job sent on the preparation pool.
    let sent = generation::prepare(state, move |state| {
        let prompt = match text {
            Ok(text) => state.frontend().tokenizer().encode(&text, true)?,
            Err(tokens) => tokens,
        };
        Job::new(state, prompt, max_tokens, sampling)?.send(state)
    })
    .await?;
    let mut generation = generation::start(state, sent).await?;
    let format = CompletionStream {
        id: format!("cmpl-{request_id}"),
        created: unix_time(),
        model: state.config().model.clone(),
        include_usage: request.stream_options.unwrap_or_default().include_usage,
    };
    if request.stream {
        return Ok(sse::response(generation, format, request_id));
    }
    let collected = generation::collect(&mut generation).await?;
    let usage = Usage::new(&generation, collected.completion_tokens);
    let mut body = format.body(&collected.output.text, Some(collected.finish));
    body["usage"] = json!(usage);
    Ok(Json(body).into_response())
}

/// OpenAI's `text_completion` objects, streamed and not.
struct CompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl CompletionStream {
    fn body(&self, text: &str, finish: Option<Finish>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": finish.map(Finish::openai),
            }],
        })
    }
}

impl StreamFormat for CompletionStream {
    fn start(&mut self) -> Vec<Event> {
        Vec::new()
    }

    fn output(&mut self, event: &OutputEvent) -> Vec<Event> {
        // A completion's output is its text: no protocol parses it.
        match event {
            OutputEvent::Text(text) => vec![json_event(&self.body(text, None))],
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event> {
        let mut events = vec![json_event(&self.body("", Some(finish)))];
        if self.include_usage {
            let mut last = self.body("", None);
            last["choices"] = json!([]);
            last["usage"] = json!(usage);
            events.push(json_event(&last));
        }
        events.push(Event::default().data("[DONE]"));
        events
    }

    fn error(&mut self, error: &HttpError) -> Vec<Event> {
        vec![json_event(&error.envelope())]
    }
}
