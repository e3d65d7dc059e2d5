//! The scheduler's errors: one enum per failure stage.
//!
//! [`AdmissionError`] rejects a request before it is queued (HTTP maps it
//! with [`AdmissionError::class`]); [`ExecutionError`] fails requests that
//! were admitted (HTTP 500); [`SchedulerError`] is the worker's own failure.

use std::error::Error;
use std::sync::Arc;

use super::ids::Slot;

/// A contract the scheduler cannot drive; `field` is the contract field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("contract.{field} {reason}")]
pub struct GeometryError {
    /// The contract field, for example `decode_capacities`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// How a frontend should answer an [`AdmissionError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The request itself is outside the contract (HTTP 400).
    InvalidRequest,
    /// The server is at capacity or cannot serve now (HTTP 503).
    Unavailable,
}

/// Why a request was not accepted into the admission queue.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The request is constrained, and this executor cannot apply masks
    /// (the core's sampling graphs take none).
    #[error("this core cannot constrain decoding: its sampling takes no token mask")]
    GrammarUnsupported,
    /// The prompt holds no token.
    #[error("prompt is empty")]
    EmptyPrompt,
    /// `max_new_tokens` is 0; such a request needs no admission.
    #[error("max_new_tokens must be at least 1")]
    ZeroOutputBudget,
    /// A prompt token is not in the vocabulary.
    #[error(
        "prompt token {token} at position {position} is outside the vocabulary of {vocab_size}"
    )]
    TokenOutsideVocabulary {
        /// Position of the token in the prompt.
        position: usize,
        /// The token.
        token: u32,
        /// Size of the vocabulary.
        vocab_size: u32,
    },
    /// Prompt plus output limit exceed the context limit.
    #[error(
        "{prompt_tokens} prompt tokens plus max_new_tokens {max_new_tokens} exceed \
         the context limit {context_limit}"
    )]
    ExceedsContext {
        /// Tokens in the prompt.
        prompt_tokens: u32,
        /// The requested output limit.
        max_new_tokens: u32,
        /// The contract's context limit.
        context_limit: u32,
    },
    /// The admission reservation is larger than the whole page pool.
    #[error("the request reserves {required_pages} pages, the pool holds {usable_pages}")]
    ExceedsPool {
        /// Pages the admission reservation needs.
        required_pages: u32,
        /// Pages of the whole pool (the null page excluded).
        usable_pages: u32,
    },
    /// The message endpoints are not strictly ascending inside the prompt.
    #[error(
        "message endpoint {endpoint} is not strictly after the previous one and inside \
         the {prompt_tokens}-token prompt"
    )]
    MessageEndpoint {
        /// The offending endpoint.
        endpoint: u32,
        /// Tokens in the prompt.
        prompt_tokens: u32,
    },
    /// A sampling parameter the graphs cannot use.
    #[error("sampling.{field} {reason}")]
    InvalidSampling {
        /// The parameter, for example `temperature`.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The bounded admission queue is full.
    #[error("the admission queue is full ({capacity} requests)")]
    QueueFull {
        /// Capacity of the queue.
        capacity: usize,
    },
    /// The scheduler stopped admitting requests (shutdown).
    #[error("the scheduler is shutting down")]
    ShuttingDown,
    /// The scheduler's worker failed or is gone.
    #[error("the scheduler is unavailable")]
    Unavailable,
}

impl AdmissionError {
    /// Whether the request or the server's state is at fault.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::EmptyPrompt
            | Self::ZeroOutputBudget
            | Self::TokenOutsideVocabulary { .. }
            | Self::ExceedsContext { .. }
            | Self::MessageEndpoint { .. }
            | Self::InvalidSampling { .. }
            | Self::GrammarUnsupported => ErrorClass::InvalidRequest,
            Self::ExceedsPool { .. }
            | Self::QueueFull { .. }
            | Self::ShuttingDown
            | Self::Unavailable => ErrorClass::Unavailable,
        }
    }
}

/// A completion record that contradicts what was submitted. `row` is the
/// record's position in its launch's completion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRecord {
    /// The launch returned the wrong number of records.
    #[error("expected {expected} completion records, found {found}")]
    RowCount {
        /// Records the launch writes.
        expected: usize,
        /// Records returned.
        found: usize,
    },
    /// A record names another slot than the one submitted in its row.
    #[error("row {row}: expected {expected}, found slot {found}")]
    Slot {
        /// The row.
        row: usize,
        /// The submitted slot.
        expected: Slot,
        /// The slot in the record.
        found: i32,
    },
    /// A record is valid where no sample was possible, or the reverse.
    #[error("row {row}: valid should be {expected}, found {found}")]
    Valid {
        /// The row.
        row: usize,
        /// Whether the row had to sample.
        expected: bool,
        /// The raw `valid` field.
        found: i32,
    },
    /// A sampled token is outside the vocabulary.
    #[error("row {row}: token {token} is outside the vocabulary of {vocab_size}")]
    Token {
        /// The row.
        row: usize,
        /// The raw token.
        token: i32,
        /// Size of the vocabulary.
        vocab_size: u32,
    },
    /// The generation count did not advance by exactly the row's samples.
    #[error("row {row}: generated should be {expected}, found {found}")]
    Generated {
        /// The row.
        row: usize,
        /// The count the submitted launches imply.
        expected: u32,
        /// The raw field.
        found: i32,
    },
    /// The consumed count did not advance by exactly the row's tokens.
    #[error("row {row}: consumed should be {expected}, found {found}")]
    Consumed {
        /// The row.
        row: usize,
        /// The count the submitted launches imply.
        expected: u32,
        /// The raw field.
        found: i32,
    },
    /// The finish flag contradicts the token, the output limit or an earlier
    /// finish.
    #[error("row {row}: done should be {expected}, found {found}")]
    Done {
        /// The row.
        row: usize,
        /// The flag the token and budget imply.
        expected: i32,
        /// The raw field.
        found: i32,
    },
    /// A resample did not repeat the token the request's last sample gave.
    #[error("row {row}: a resample should repeat token {expected:?}, found {found}")]
    ResampleDiffers {
        /// The row.
        row: usize,
        /// The request's last output token (`None`: it has none).
        expected: Option<u32>,
        /// The raw token.
        found: i32,
    },
    /// A snapshot or restore did not report that it applied (status 1): a
    /// restore's row did not hold the consumed count the checkpoint records.
    #[error("{operation} reported status {status:?}, expected 1")]
    Maintenance {
        /// `snapshot` or `restore`.
        operation: &'static str,
        /// The raw status, `None` when none came back.
        status: Option<i32>,
    },
}

/// A failure while executing admitted work. Cloneable so one failure can
/// fail every affected request; the source chain is shared.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ExecutionError {
    /// A completion record failed validation; the requests of its rows fail.
    #[error("invalid completion record: {0}")]
    InvalidRecord(#[from] InvalidRecord),
    /// The executor could not launch or complete an operation; every
    /// admitted request fails and the scheduler stops.
    #[error("{operation} failed: {source}")]
    Device {
        /// What was being done, for example `decode launch`.
        operation: &'static str,
        /// The underlying failure.
        #[source]
        source: Arc<dyn Error + Send + Sync>,
    },
    /// A ticket was polled that is not the oldest one in flight.
    #[error("ticket {ticket} is not the oldest launch in flight")]
    UnknownTicket {
        /// The ticket.
        ticket: u64,
    },
    /// A constrained request's grammar failed (its matcher refused a token
    /// or could not compute a mask); that request alone fails.
    #[error("the request's grammar failed: {reason}")]
    Grammar {
        /// The matcher's message.
        reason: String,
    },
}

/// The scheduler itself cannot continue, or was misconfigured.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SchedulerError {
    /// The contract cannot be scheduled.
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    /// A configuration value is unusable.
    #[error("invalid scheduler configuration: {field} {reason}")]
    Config {
        /// The configuration field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The executor failed; every request was failed with this error.
    #[error("the executor failed: {0}")]
    Execution(ExecutionError),
    /// The model thread could not be started.
    #[error("cannot start the model thread: {0}")]
    Spawn(Arc<std::io::Error>),
    /// The worker thread is gone (it panicked or was shut down).
    #[error("the scheduler worker is gone")]
    WorkerGone,
}
