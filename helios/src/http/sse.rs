//! Server-sent events over a generation's chunks, in an endpoint's format.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::{log_failure, HttpError};
use super::generation::{Chunk, Finish, Generation};
use crate::frontend::protocol::OutputEvent;

/// Token counts of a finished request, as OpenAI reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub completion_tokens: u32,
    /// Both.
    pub total_tokens: u32,
    /// What the prompt reused.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The part of the prompt served from the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens restored from a prefix checkpoint, not prefilled.
    pub cached_tokens: u32,
}

impl Usage {
    /// Counts of a generation's prompt and its output.
    pub fn new(generation: &Generation, completion_tokens: u32) -> Self {
        let prompt_tokens = generation.prompt_tokens;
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: generation.cached_tokens,
            },
        }
    }
}

/// How an endpoint spells its stream.
pub trait StreamFormat: Send + 'static {
    /// Events sent right after admission.
    fn start(&mut self) -> Vec<Event>;
    /// Events carrying one piece of output (text, reasoning, a call's
    /// start, arguments or end).
    fn output(&mut self, event: &OutputEvent) -> Vec<Event>;
    /// The last events of a request that finished, success marker included.
    fn finish(&mut self, finish: Finish, usage: Usage) -> Vec<Event>;
    /// The last event of a request that failed: no success marker follows.
    fn error(&mut self, error: &HttpError) -> Vec<Event>;
}

struct Progress<F> {
    generation: Generation,
    format: F,
    pending: VecDeque<Event>,
    /// The format's opening events go out with the first chunk's.
    started: bool,
    done: bool,
    request_id: String,
}

impl<F: StreamFormat> Progress<F> {
    fn fail(&mut self, error: &HttpError) -> Vec<Event> {
        self.done = true;
        log_failure(&self.request_id, error);
        self.format.error(error)
    }
}

/// The SSE response of an admitted generation. The format's opening events
/// (OpenAI's role delta, Anthropic's `message_start`) are sent together with
/// the first output, so the first event a client sees is never followed by a
/// wait for prefill. Dropping the body (client disconnect) drops the
/// generation, which cancels the request.
pub fn response<F: StreamFormat>(generation: Generation, format: F, request_id: &str) -> Response {
    let progress = Progress {
        generation,
        format,
        pending: VecDeque::new(),
        started: false,
        done: false,
        request_id: request_id.to_owned(),
    };
    let events = futures_util::stream::unfold(progress, |mut progress| async move {
        loop {
            if let Some(event) = progress.pending.pop_front() {
                return Some((Ok::<_, Infallible>(event), progress));
            }
            if progress.done {
                return None;
            }
            let chunk = progress.generation.next_chunk().await;
            if !progress.started {
                progress.started = true;
                let opening = progress.format.start();
                progress.pending.extend(opening);
            }
            let events = match chunk {
                Some(Chunk::Output(event)) => progress.format.output(&event),
                Some(Chunk::Finished {
                    finish,
                    completion_tokens,
                }) => {
                    progress.done = true;
                    let usage = Usage::new(&progress.generation, completion_tokens);
                    progress.format.finish(finish, usage)
                }
                Some(Chunk::Failed(error)) => progress.fail(&error),
                None => progress.fail(&HttpError::WorkerGone),
            };
            progress.pending.extend(events);
        }
    });
    Sse::new(events).into_response()
}

/// An SSE event whose data is `value` as JSON.
pub fn json_event<T: Serialize>(value: &T) -> Event {
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}
