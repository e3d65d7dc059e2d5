//! One generation: submission, the wait for admission, and the delivery of
//! text to the HTTP task.
//!
//! Everything here is async: the model thread's events arrive on a
//! non-blocking channel ([`RequestStream::next`]) and the HTTP task itself
//! detokenizes them and applies stop sequences, so no OS thread is held per
//! request. The request's [`RequestStream`] lives inside its [`Generation`]
//! (and, before admission, inside the future waiting for it): dropping the
//! response, or the future, drops the stream, which is the one cancellation
//! path. Only CPU-heavy prompt preparation runs elsewhere, on the runtime's
//! bounded blocking pool ([`prepare`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::error::HttpError;
use super::sampling::{output_limit, Sampling};
use super::AppState;
use crate::frontend::{ChatInput, Detokenizer, Frontend, StopMatcher, StopStep};
use crate::prefix::PrefixChain;
use crate::scheduler::{Event, FinishReason, RequestSpec, RequestStream};

/// Prompt tokens the detokenizer decodes before the output, so the first
/// output word keeps the spacing the full decode gives it.
const DETOKENIZER_CONTEXT: usize = 4;

/// Why generation ended, as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token was sampled.
    Eos,
    /// The stop sequence at this index of the request's list matched.
    StopSequence(usize),
    /// The output limit was reached.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn openai(self) -> &'static str {
        match self {
            Self::Eos | Self::StopSequence(_) => "stop",
            Self::Length => "length",
        }
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic(self) -> &'static str {
        match self {
            Self::Eos => "end_turn",
            Self::StopSequence(_) => "stop_sequence",
            Self::Length => "max_tokens",
        }
    }
}

/// What a generation hands the HTTP task.
#[derive(Debug)]
pub enum Chunk {
    /// Output text, in order (never empty).
    Text(String),
    /// The request finished; no chunk follows.
    Finished {
        /// Why.
        finish: Finish,
        /// Output tokens generated (up to the one that completed a stop
        /// sequence).
        completion_tokens: u32,
    },
    /// The request failed after admission; no chunk follows.
    Failed(HttpError),
}

/// A request ready for submission, made on the preparation pool
/// ([`prepare`]).
#[derive(Debug)]
pub struct Job {
    /// Tokens, limit, sampling and seed.
    pub spec: RequestSpec,
    /// Its prompt's prefix chain, when the cache is on.
    pub chain: Option<PrefixChain>,
    /// The request's stop sequences.
    pub stops: StopMatcher,
}

impl Job {
    /// A job for `prompt` with checked sampling; the output limit defaults
    /// to what the context leaves after the prompt.
    pub fn new(
        state: &AppState,
        prompt: Vec<u32>,
        max_tokens: Option<u32>,
        sampling: Sampling,
    ) -> Result<Self, HttpError> {
        let stops = StopMatcher::new(&sampling.stops)?;
        let max_new_tokens = output_limit(max_tokens, prompt.len(), state.config().context_limit)?;
        Ok(Self {
            chain: state.handle().chain(&prompt),
            spec: RequestSpec {
                prompt,
                max_new_tokens,
                sampling: sampling.params,
                seed: sampling.seed,
                message_endpoints: Vec::new(),
            },
            stops,
        })
    }
}

/// Runs CPU-heavy frontend work (rendering, tokenization, endpoint
/// mapping) on the runtime's blocking pool (bounded: see
/// [`crate::serve::serve_http_with`]), so that a long prompt never stalls
/// the async workers streaming other requests; its time goes to the
/// `flare_prompt_preparation_seconds` histogram. `work` gets the state.
pub async fn prepare<T: Send + 'static>(
    state: &AppState,
    work: impl FnOnce(&AppState) -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let prepared = work(&state);
        state.observe_preparation(started.elapsed().as_secs_f64());
        prepared
    })
    .await
    .map_err(|_| HttpError::PreparationFailed)?
}

impl Job {
    /// A job for a rendered conversation, offering the prefix cache the
    /// exact endpoints of its last [`ServeConfig::marked_messages`]
    /// messages; the work runs on the blocking pool ([`prepare`]).
    ///
    /// [`ServeConfig::marked_messages`]: super::ServeConfig::marked_messages
    pub async fn chat(
        state: &AppState,
        input: ChatInput,
        max_tokens: Option<u32>,
        sampling: Sampling,
    ) -> Result<Self, HttpError> {
        prepare(state, move |state| {
            Self::chat_now(state, &input, max_tokens, sampling)
        })
        .await
    }

    fn chat_now(
        state: &AppState,
        input: &ChatInput,
        max_tokens: Option<u32>,
        sampling: Sampling,
    ) -> Result<Self, HttpError> {
        let recent = state.config().marked_messages;
        if recent == 0 {
            let prompt = state.frontend().encode_chat(input)?;
            return Self::new(state, prompt.token_ids, max_tokens, sampling);
        }
        let prompt = state
            .frontend()
            .encode_chat_with_recent_marks(input, recent)?;
        let message_endpoints = prompt.message_endpoints();
        let mut job = Self::new(state, prompt.token_ids, max_tokens, sampling)?;
        job.spec.message_endpoints = message_endpoints;
        Ok(job)
    }
}

/// An admitted generation: its output chunks and its prompt size. Dropping
/// it before its last chunk cancels the request.
#[derive(Debug)]
pub struct Generation {
    stream: RequestStream,
    delivery: Delivery,
    /// Chunks made from one event and not yet taken.
    ready: VecDeque<Chunk>,
    /// The terminal chunk was taken: nothing follows.
    ended: bool,
    /// Prompt tokens, for usage.
    pub prompt_tokens: u32,
    /// Of those, tokens restored from a prefix checkpoint.
    pub cached_tokens: u32,
}

impl Generation {
    /// The next chunk: text in order, then `Finished` or `Failed`; `None`
    /// once that was taken.
    pub async fn next_chunk(&mut self) -> Option<Chunk> {
        loop {
            if let Some(chunk) = self.ready.pop_front() {
                self.ended = matches!(chunk, Chunk::Finished { .. } | Chunk::Failed(_));
                return Some(chunk);
            }
            if self.ended {
                return None;
            }
            let chunks = match self.stream.next().await {
                Ok(Some(Event::Tokens { tokens, .. })) => self.delivery.tokens(&tokens),
                Ok(Some(Event::Finished { reason, .. })) => self.delivery.finish(reason),
                Ok(Some(Event::Failed(error))) => vec![Chunk::Failed(error.into())],
                Ok(Some(Event::Admitted { .. } | Event::Preempted { .. })) => Vec::new(),
                Ok(None) | Err(_) => vec![Chunk::Failed(HttpError::WorkerGone)],
            };
            self.ready.extend(chunks);
        }
    }
}

/// Submits `job` and waits for its admission (or the failure that prevents
/// it); dropping the returned future, or the generation, cancels it.
pub async fn start(state: &AppState, job: Job) -> Result<Generation, HttpError> {
    let prompt_tokens = u32::try_from(job.spec.prompt.len()).unwrap_or(u32::MAX);
    let prompt = &job.spec.prompt;
    let context = &prompt[prompt.len().saturating_sub(DETOKENIZER_CONTEXT)..];
    let delivery = Delivery {
        frontend: Arc::clone(state.frontend()),
        detokenizer: Detokenizer::with_context(context, true),
        stops: job.stops,
        generated: 0,
    };
    let mut stream = state.handle().submit(job.spec, job.chain).await?;
    let cached_tokens = wait_for_admission(&mut stream).await?;
    Ok(Generation {
        stream,
        delivery,
        ready: VecDeque::new(),
        ended: false,
        prompt_tokens,
        cached_tokens,
    })
}

/// Waits for the request's admission; the prompt tokens it restored.
async fn wait_for_admission(stream: &mut RequestStream) -> Result<u32, HttpError> {
    loop {
        match stream.next().await {
            Ok(Some(Event::Admitted { cached_tokens })) => return Ok(cached_tokens),
            Ok(Some(Event::Failed(error))) => return Err(error.into()),
            Ok(Some(Event::Finished { .. })) | Ok(None) => return Err(HttpError::Cancelled),
            Ok(Some(Event::Tokens { .. } | Event::Preempted { .. })) => {}
            Err(_) => return Err(HttpError::WorkerGone),
        }
    }
}

/// Reads collected output: the text and how it ended.
pub async fn collect(generation: &mut Generation) -> Result<(String, Finish, u32), HttpError> {
    let mut text = String::new();
    while let Some(chunk) = generation.next_chunk().await {
        match chunk {
            Chunk::Text(delta) => text.push_str(&delta),
            Chunk::Finished {
                finish,
                completion_tokens,
            } => return Ok((text, finish, completion_tokens)),
            Chunk::Failed(error) => return Err(error),
        }
    }
    Err(HttpError::WorkerGone)
}

/// Output text of one request: detokenized, EOS dropped, cut at the first
/// stop sequence.
#[derive(Debug)]
struct Delivery {
    frontend: Arc<Frontend>,
    detokenizer: Detokenizer,
    stops: StopMatcher,
    generated: u32,
}

impl Delivery {
    fn tokens(&mut self, tokens: &[u32]) -> Vec<Chunk> {
        let mut text = String::new();
        for &id in tokens {
            self.generated += 1;
            if self.frontend.is_eos(id) {
                continue;
            }
            let delta = match self.detokenizer.push(self.frontend.tokenizer(), id) {
                Ok(delta) => delta,
                Err(error) => return vec![Chunk::Failed(error.into())],
            };
            match self.stops.push(&delta) {
                StopStep::Continue { text: released } => text.push_str(&released),
                StopStep::Stopped {
                    text: released,
                    stop,
                } => {
                    text.push_str(&released);
                    return self.end(text, Finish::StopSequence(stop));
                }
            }
        }
        with_text(text, Vec::new())
    }

    fn finish(&mut self, reason: FinishReason) -> Vec<Chunk> {
        let finish = match reason {
            FinishReason::Stop => Finish::Eos,
            FinishReason::Length => Finish::Length,
            FinishReason::Cancelled => return vec![Chunk::Failed(HttpError::Cancelled)],
        };
        let rest = match self.detokenizer.finish(self.frontend.tokenizer()) {
            Ok(rest) => rest,
            Err(error) => return vec![Chunk::Failed(error.into())],
        };
        match self.stops.push(&rest) {
            StopStep::Stopped { text, stop } => self.end(text, Finish::StopSequence(stop)),
            StopStep::Continue { mut text } => {
                text.push_str(&self.stops.finish());
                self.end(text, finish)
            }
        }
    }

    fn end(&self, text: String, finish: Finish) -> Vec<Chunk> {
        let finished = Chunk::Finished {
            finish,
            completion_tokens: self.generated,
        };
        with_text(text, vec![finished])
    }
}

/// `text` as a chunk (unless empty), followed by `rest`.
fn with_text(text: String, rest: Vec<Chunk>) -> Vec<Chunk> {
    let mut chunks = Vec::with_capacity(rest.len() + 1);
    if !text.is_empty() {
        chunks.push(Chunk::Text(text));
    }
    chunks.extend(rest);
    chunks
}
