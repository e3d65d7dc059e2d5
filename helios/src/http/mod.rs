//! HTTP serving: OpenAI-compatible endpoints over the scheduler's worker.
//!
//! Handlers run on the async executor and never block it: submission and a
//! request's events are awaited on non-blocking channels (no OS thread is
//! held per request), `/health` and `/metrics` read the status the model
//! thread publishes, and only prompt preparation (rendering, tokenization)
//! runs on the runtime's bounded blocking pool. A generation response is sent only once its request was
//! admitted (or refused), carries an `x-request-id` header, and maps every
//! failure through [`HttpError`] (OpenAI envelopes, or Anthropic's on
//! `/v1/messages`). Routes:
//!
//! - `POST /v1/chat/completions` (streamed as SSE with `"stream": true`);
//! - `POST /v1/completions` (a text or token-id prompt, streamed or not);
//! - `POST /v1/messages` (Anthropic, text content, streamed or not);
//! - `POST /v1/responses` (OpenAI's Responses API over the chat path, with
//!   `previous_response_id` over a bounded in-memory store; streamed or not);
//! - `GET /v1/models`;
//! - `GET /health` (200 while the worker serves, 503 once it stops or fails);
//! - `GET /metrics` (the scheduler's gauges and counters, and histograms of
//!   time to first token and inter-token latency; Prometheus text format).
//!
//! With an API key configured, the `/v1` routes answer 401 without it;
//! `/health` and `/metrics` stay open.

mod auth;
mod chat;
mod completions;
mod conversation;
mod error;
mod generation;
mod info;
mod messages;
mod response_store;
mod responses;
mod sampling;
mod sse;
mod structured;
mod tools;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::HeaderValue;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;

pub use error::{AnthropicError, ErrorBody, ErrorCode, ErrorEnvelope, HttpError};
pub use sampling::{Declared, Sampling, SamplingFields, SamplingPolicy};

use crate::frontend::Frontend;
use crate::scheduler::{
    Histogram, PrefixConfig, SchedulerHandle, INTER_TOKEN_BUCKETS, PREPARATION_BUCKETS,
};

/// The header naming a generation request in responses and logs.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// What the HTTP layer serves and its limits.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The model id `/v1/models` lists and responses name.
    pub model: String,
    /// Other names a request may give `model` (a request naming any other
    /// is 404).
    pub aliases: Vec<String>,
    /// The core's sampling defaults and ranges.
    pub sampling: SamplingPolicy,
    /// The core's context limit (prompt plus output), for the default
    /// output limit.
    pub context_limit: u32,
    /// The largest request body accepted, in bytes; a larger one is 400.
    pub max_body_bytes: usize,
    /// When set, every `/v1` route requires this key (`Authorization: Bearer
    /// KEY` or `x-api-key: KEY`); a request without it is 401.
    pub api_key: Option<String>,
    /// Chat requests offer the prefix cache the endpoints of their last
    /// this many messages (0: none, when the cache is off); marking a
    /// message renders the conversation once more.
    pub marked_messages: usize,
    /// Whether the executor applies grammar masks: structured output is
    /// served, and required tool calls are constrained, only then.
    pub constrained: bool,
}

/// What [`ServeConfig::marked_messages`] should be: as many messages as one
/// request may capture (marking more would be wasted renders), at most
/// `limit` when the operator sets one, none without the prefix cache.
pub fn marked_messages(
    prefix: Option<&PrefixConfig>,
    max_concurrency: u32,
    limit: Option<usize>,
) -> usize {
    let budget = prefix.map_or(0, |prefix| {
        crate::prefix::capture_budget(prefix.snapshot_rows, max_concurrency) as usize
    });
    limit.map_or(budget, |limit| budget.min(limit))
}

#[derive(Debug)]
struct Shared {
    handle: SchedulerHandle,
    frontend: Arc<Frontend>,
    config: ServeConfig,
    /// Seconds each prompt's frontend work took (`/metrics`).
    preparation: Mutex<Histogram>,
    /// Seconds between successive output tokens of a request as its HTTP
    /// task receives them (`/metrics`; the model thread's own are the
    /// scheduler's inter-token histogram).
    delivery: Mutex<Histogram>,
    /// Stored Responses API conversations (`previous_response_id`).
    responses: response_store::ResponseStore,
}

/// What every handler shares: the scheduler handle, the frontend and the
/// configuration.
#[derive(Debug, Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

impl AppState {
    /// State over a running worker's handle and the core's frontend.
    pub fn new(handle: SchedulerHandle, frontend: Arc<Frontend>, config: ServeConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                handle,
                frontend,
                config,
                preparation: Mutex::new(Histogram::new(&PREPARATION_BUCKETS)),
                delivery: Mutex::new(Histogram::new(&INTER_TOKEN_BUCKETS)),
                responses: response_store::ResponseStore::new(),
            }),
        }
    }

    fn handle(&self) -> &SchedulerHandle {
        &self.shared.handle
    }

    fn frontend(&self) -> &Arc<Frontend> {
        &self.shared.frontend
    }

    /// Records one prompt's frontend work.
    fn observe_preparation(&self, seconds: f64) {
        self.preparation_histogram().observe(seconds);
    }

    /// The prompt preparation histogram so far.
    fn preparation(&self) -> Histogram {
        self.preparation_histogram().clone()
    }

    /// The histogram behind its lock (a panicked observer leaves it intact).
    fn preparation_histogram(&self) -> MutexGuard<'_, Histogram> {
        (self.shared.preparation.lock()).unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `tokens` output tokens that reached a request's HTTP task
    /// together, `seconds` after its tokens before them: they share the gap.
    fn observe_delivery(&self, seconds: f64, tokens: usize) {
        let mut delivery = (self.shared.delivery.lock()).unwrap_or_else(PoisonError::into_inner);
        for _ in 0..tokens {
            delivery.observe(seconds / tokens as f64);
        }
    }

    /// The HTTP tasks' inter-token histogram so far.
    fn delivery(&self) -> Histogram {
        (self.shared.delivery.lock())
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn config(&self) -> &ServeConfig {
        &self.shared.config
    }

    /// The Responses API's stored conversations.
    fn responses(&self) -> &response_store::ResponseStore {
        &self.shared.responses
    }
}

/// The router of every endpoint.
pub fn router(state: AppState) -> Router {
    let body_limit = DefaultBodyLimit::max(state.config().max_body_bytes);
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/models", get(info::models))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(api)
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .layer(body_limit)
        .with_state(state)
}

/// `stream_options` of the OpenAI endpoints.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
struct StreamOptions {
    /// Send a last chunk with the usage counts.
    #[serde(default)]
    include_usage: bool,
}

/// A fresh request id.
fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A request body as the handlers receive it: its bytes, or why it could
/// not be read (too large for the body limit).
type Body = Result<Bytes, BytesRejection>;

/// Parses a request body; a value of the wrong type or range is named by
/// its field (`HttpError::param`).
fn parse_body<T: DeserializeOwned>(body: Body) -> Result<T, HttpError> {
    parse_json(&read_body(body)?)
}

/// [`parse_body`] for a request that flattens [`sampling::SamplingFields`]
/// (chat, text completions): a flattened parse cannot place a failure inside
/// those fields, so on a failure with no field they are parsed alone to name
/// it (the success path parses once).
fn parse_sampled_body<T: DeserializeOwned>(body: Body) -> Result<T, HttpError> {
    let bytes = read_body(body)?;
    parse_json(&bytes).map_err(|error| match error {
        HttpError::InvalidJson { field: None, .. } => {
            match parse_json::<sampling::SamplingFields>(&bytes) {
                Err(named @ HttpError::InvalidJson { field: Some(_), .. }) => named,
                _ => error,
            }
        }
        other => other,
    })
}

fn read_body(body: Body) -> Result<Bytes, HttpError> {
    body.map_err(|rejection| HttpError::UnreadableBody {
        reason: rejection.body_text(),
    })
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(bytes).map_err(|error| HttpError::InvalidJson {
        field: failing_field::<T>(bytes, &error),
        reason: error.to_string(),
    })
}

/// The field whose value has the wrong type or range, as the request spells
/// it; none at the top or where the JSON itself is broken. Found by parsing
/// again with the path tracked, on failure only: tracking it costs a success
/// about a third more time (a 138 KB conversation on the development CPU:
/// 56 us against 40).
fn failing_field<T: DeserializeOwned>(bytes: &[u8], error: &serde_json::Error) -> Option<String> {
    if error.classify() != serde_json::error::Category::Data {
        return None;
    }
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let at = serde_path_to_error::deserialize::<_, T>(&mut json)
        .err()?
        .path()
        .to_string();
    (at != ".").then_some(at)
}

/// A generation response from a handler's result: a failure is logged and
/// rendered by `render` (the endpoint's error envelope); every response,
/// success or failure, carries the request id.
fn respond(
    request_id: &str,
    result: Result<Response, HttpError>,
    render: fn(HttpError) -> Response,
) -> Response {
    let response = result.unwrap_or_else(|error| {
        error::log_failure(request_id, &error);
        render(error)
    });
    with_request_id(response, request_id)
}

/// Sets the `x-request-id` header of a generation response.
fn with_request_id(mut response: Response, request_id: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// Seconds since the Unix epoch, for `created`.
fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}
