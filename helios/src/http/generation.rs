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
//! bounded blocking pool ([`prepare`]); the thread that prepared a job sends
//! it to the model thread ([`Job::send`]), so the model thread starts on it
//! while the HTTP task is still being woken.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::error::HttpError;
use super::sampling::{output_limit, Sampling};
use super::tools::{ToolPolicy, ToolRequest};
use super::AppState;
use crate::frontend::protocol::{
    MarkerKind, OutputEvent, OutputParser, OutputProtocol, ParsedOutput,
};
use crate::frontend::{ChatInput, Detokenizer, Frontend, StopMatcher, StopStep};
use crate::prefix::PrefixChain;
use crate::scheduler::{Event, FinishReason, RequestSpec, RequestStream, Submission};

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
    /// The model ended its turn after completed tool calls.
    ToolCalls,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn openai(self) -> &'static str {
        match self {
            Self::Eos | Self::StopSequence(_) => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
        }
    }

    /// Anthropic's `stop_reason`.
    pub fn anthropic(self) -> &'static str {
        match self {
            Self::Eos => "end_turn",
            Self::StopSequence(_) => "stop_sequence",
            Self::Length => "max_tokens",
            Self::ToolCalls => "tool_use",
        }
    }
}

/// What a generation hands the HTTP task.
#[derive(Debug)]
pub enum Chunk {
    /// Output, in order, as the output protocol parsed it and the tool
    /// policy presents it (no text delta is empty).
    Output(OutputEvent),
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
    /// The output's parser (text passes through unless the core declares
    /// an output protocol and the request uses it).
    pub parser: OutputParser,
    /// What the output's calls must satisfy, and how they are presented.
    pub policy: ToolPolicy,
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
                grammar: None,
            },
            stops,
            parser: OutputProtocol::default().parser(None, false),
            policy: ToolPolicy::default(),
        })
    }
}

/// Runs CPU-heavy frontend work (rendering, tokenization, endpoint
/// mapping) on the runtime's blocking pool (bounded: see
/// [`crate::serve::serve_http_with`]), so that a long prompt never stalls
/// the async workers streaming other requests; its time goes to the
/// `flare_prompt_preparation_seconds` histogram. `work` gets the state and
/// ends by sending a job ([`Job::send`]).
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
    /// messages, sent to the model thread; the work and the sending run on
    /// the blocking pool ([`prepare`], [`Self::send`]).
    ///
    /// [`ServeConfig::marked_messages`]: super::ServeConfig::marked_messages
    ///
    /// `tools` decides which tools the template sees and how the output's
    /// calls are parsed and checked; the output's reasoning is parsed by the
    /// core's protocol, starting inside it when the prompt ends open.
    ///
    /// `answer`: the JSON schema the answer must follow (`answer_param` the
    /// field that gave it), or `None`; see [`super::structured`].
    pub async fn chat(
        state: &AppState,
        mut input: ChatInput,
        max_tokens: Option<u32>,
        sampling: Sampling,
        tools: ToolRequest,
        answer: Option<(serde_json::Value, &'static str)>,
    ) -> Result<Sent, HttpError> {
        prepare(state, move |state| {
            tools.prepare(&mut input, state.frontend().protocol());
            let (mut job, text) = Self::chat_now(state, &input, max_tokens, sampling)?;
            let protocol = state.frontend().protocol();
            let in_reasoning = protocol.starts_in_reasoning(&text);
            job.parser = protocol.parser(tools.parsed(), in_reasoning);
            job.policy = tools.policy();
            let (schema, param) = match &answer {
                Some((schema, param)) => (Some(schema), *param),
                None => (None, "response_format"),
            };
            job.spec.grammar =
                super::structured::grammar(state, &tools, schema, param, in_reasoning)?;
            job.send(state)
        })
        .await
    }

    /// Sends the job to the model thread from the thread that made it (the
    /// preparation pool's): the model thread starts on it while the HTTP
    /// task is being woken to await its admission ([`start`]). Dropping the
    /// result cancels the request. So a client that leaves during
    /// preparation still has its request sent, then cancelled when the pool
    /// drops the unread result: the model thread may admit it and run a
    /// chunk in between, and `/metrics` counts it as cancelled.
    pub fn send(self, state: &AppState) -> Result<Sent, HttpError> {
        let prompt = &self.spec.prompt;
        let prompt_tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        let context = &prompt[prompt.len().saturating_sub(DETOKENIZER_CONTEXT)..];
        let delivery = Delivery {
            frontend: Arc::clone(state.frontend()),
            detokenizer: Detokenizer::with_context(context, true),
            stops: self.stops,
            parser: self.parser,
            policy: self.policy,
            generated: 0,
        };
        let submission = state.handle().send(self.spec, self.chain)?;
        Ok(Sent {
            submission,
            delivery,
            prompt_tokens,
        })
    }
}

/// A job the model thread has been sent ([`Job::send`]), its admission not
/// yet awaited ([`start`]).
#[derive(Debug)]
pub struct Sent {
    submission: Submission,
    delivery: Delivery,
    prompt_tokens: u32,
}

impl Job {
    /// The job and its prompt's text.
    fn chat_now(
        state: &AppState,
        input: &ChatInput,
        max_tokens: Option<u32>,
        sampling: Sampling,
    ) -> Result<(Self, String), HttpError> {
        let recent = state.config().marked_messages;
        if recent == 0 {
            let prompt = state.frontend().encode_chat(input)?;
            let job = Self::new(state, prompt.token_ids, max_tokens, sampling)?;
            return Ok((job, prompt.text));
        }
        let prompt = state
            .frontend()
            .encode_chat_with_recent_marks(input, recent)?;
        let message_endpoints = prompt.message_endpoints();
        let mut job = Self::new(state, prompt.token_ids, max_tokens, sampling)?;
        job.spec.message_endpoints = message_endpoints;
        Ok((job, prompt.text))
    }
}

/// An admitted generation: its output chunks and its prompt size. Dropping
/// it before its last chunk cancels the request.
#[derive(Debug)]
pub struct Generation {
    stream: RequestStream,
    delivery: Delivery,
    /// The server's state, for the HTTP tasks' inter-token histogram.
    state: AppState,
    /// When the last output tokens reached this task.
    last_tokens: Option<Instant>,
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
                Ok(Some(Event::Tokens { tokens, .. })) => {
                    self.received(tokens.len());
                    self.delivery.tokens(&tokens)
                }
                Ok(Some(Event::Finished { reason, .. })) => self.delivery.finish(reason),
                Ok(Some(Event::Failed(error))) => vec![Chunk::Failed(error.into())],
                Ok(Some(Event::Admitted { .. } | Event::Preempted { .. })) => Vec::new(),
                Ok(None) | Err(_) => vec![Chunk::Failed(HttpError::WorkerGone)],
            };
            self.ready.extend(chunks);
        }
    }

    /// Observes the gap since the last tokens reached this task (the first
    /// tokens start the clock, as the model thread's histogram counts).
    fn received(&mut self, tokens: usize) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        if let Some(last) = self.last_tokens {
            let gap = now.saturating_duration_since(last).as_secs_f64();
            self.state.observe_delivery(gap, tokens);
        }
        self.last_tokens = Some(now);
    }
}

/// Waits for a sent job's acceptance and admission (or the failure that
/// prevents them); dropping the returned future, or the generation, cancels
/// it.
pub async fn start(state: &AppState, sent: Sent) -> Result<Generation, HttpError> {
    let Sent {
        submission,
        delivery,
        prompt_tokens,
    } = sent;
    let mut stream = submission.accepted().await?;
    let cached_tokens = wait_for_admission(&mut stream).await?;
    Ok(Generation {
        stream,
        delivery,
        state: state.clone(),
        last_tokens: None,
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

/// A generation's whole output, as a non-streamed response presents it.
#[derive(Debug)]
pub struct Collected {
    /// Text, reasoning and calls.
    pub output: ParsedOutput,
    /// How it ended.
    pub finish: Finish,
    /// Output tokens generated.
    pub completion_tokens: u32,
}

/// Reads the whole output and how it ended.
pub async fn collect(generation: &mut Generation) -> Result<Collected, HttpError> {
    let mut output = ParsedOutput::default();
    while let Some(chunk) = generation.next_chunk().await {
        match chunk {
            Chunk::Output(event) => output.apply(&event),
            Chunk::Finished {
                finish,
                completion_tokens,
            } => {
                return Ok(Collected {
                    output,
                    finish,
                    completion_tokens,
                })
            }
            Chunk::Failed(error) => return Err(error),
        }
    }
    Err(HttpError::WorkerGone)
}

/// The output of one request: detokenized, EOS dropped, cut at the first
/// stop sequence, parsed by the output protocol and presented by the tool
/// policy. A marker token of the protocol is handed to the parser by id and
/// never detokenized; the text before it is released first.
#[derive(Debug)]
struct Delivery {
    frontend: Arc<Frontend>,
    detokenizer: Detokenizer,
    stops: StopMatcher,
    parser: OutputParser,
    policy: ToolPolicy,
    generated: u32,
}

impl Delivery {
    fn tokens(&mut self, tokens: &[u32]) -> Vec<Chunk> {
        let mut events = Vec::new();
        for &id in tokens {
            self.generated += 1;
            if self.frontend.is_eos(id) {
                continue;
            }
            if let Some(kind) = self.parser.marker(id) {
                match self.marker(kind, &mut events) {
                    Ok(None) => continue,
                    Ok(Some(stop)) => return self.end(events, Finish::StopSequence(stop)),
                    Err(error) => return self.fail(events, error),
                }
            }
            let delta = match self.detokenizer.push(self.frontend.tokenizer(), id) {
                Ok(delta) => delta,
                Err(error) => return self.fail(events, error.into()),
            };
            match self.stops.push(&delta) {
                StopStep::Continue { text } => events.extend(self.parser.push_text(&text)),
                StopStep::Stopped { text, stop } => {
                    events.extend(self.parser.push_text(&text));
                    return self.end(events, Finish::StopSequence(stop));
                }
            }
        }
        self.present(events, Vec::new())
    }

    /// Releases the text before a marker token, then the marker; a stop
    /// sequence the released text completes ends the output (its index).
    fn marker(
        &mut self,
        kind: MarkerKind,
        events: &mut Vec<OutputEvent>,
    ) -> Result<Option<usize>, HttpError> {
        let rest = self.detokenizer.finish(self.frontend.tokenizer())?;
        match self.stops.push(&rest) {
            StopStep::Stopped { text, stop } => {
                events.extend(self.parser.push_text(&text));
                return Ok(Some(stop));
            }
            StopStep::Continue { mut text } => {
                // A stop sequence cannot span the marker.
                text.push_str(&self.stops.finish());
                events.extend(self.parser.push_text(&text));
            }
        }
        events.extend(self.parser.push_marker(kind));
        Ok(None)
    }

    fn finish(&mut self, reason: FinishReason) -> Vec<Chunk> {
        let finish = match reason {
            FinishReason::Stop => Finish::Eos,
            FinishReason::Length => Finish::Length,
            FinishReason::Cancelled => return vec![Chunk::Failed(HttpError::Cancelled)],
        };
        let rest = match self.detokenizer.finish(self.frontend.tokenizer()) {
            Ok(rest) => rest,
            Err(error) => return self.fail(Vec::new(), error.into()),
        };
        let mut events = Vec::new();
        match self.stops.push(&rest) {
            StopStep::Stopped { text, stop } => {
                events.extend(self.parser.push_text(&text));
                self.end(events, Finish::StopSequence(stop))
            }
            StopStep::Continue { mut text } => {
                text.push_str(&self.stops.finish());
                events.extend(self.parser.push_text(&text));
                self.end(events, finish)
            }
        }
    }

    /// The output's last events and how it ended, as the policy allows.
    fn end(&mut self, mut events: Vec<OutputEvent>, finish: Finish) -> Vec<Chunk> {
        events.extend(self.parser.finish());
        let mut chunks = self.present(events, Vec::new());
        if matches!(chunks.last(), Some(Chunk::Failed(_))) {
            return chunks;
        }
        chunks.push(match self.policy.finish(finish) {
            Ok(finish) => Chunk::Finished {
                finish,
                completion_tokens: self.generated,
            },
            Err(error) => Chunk::Failed(error),
        });
        chunks
    }

    /// The events decided before a failure, then the failure.
    fn fail(&mut self, events: Vec<OutputEvent>, error: HttpError) -> Vec<Chunk> {
        self.present(events, vec![Chunk::Failed(error)])
    }

    /// `events` as the policy presents them, followed by `rest`; a
    /// violation ends the chunks with its failure.
    fn present(&mut self, events: Vec<OutputEvent>, rest: Vec<Chunk>) -> Vec<Chunk> {
        let mut chunks = Vec::with_capacity(events.len() + rest.len());
        for event in events {
            match self.policy.present(event) {
                Ok(Some(event)) => chunks.push(Chunk::Output(event)),
                Ok(None) => {}
                Err(error) => {
                    chunks.push(Chunk::Failed(error));
                    return chunks;
                }
            }
        }
        chunks.extend(rest);
        chunks
    }
}
