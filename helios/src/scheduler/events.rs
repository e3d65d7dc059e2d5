//! What the scheduler tells the outside: per-request events and metrics.

use super::checkpoints::CacheMetrics;
use super::error::ExecutionError;
use super::ids::RequestId;

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// It sampled a stop token (the last output token is that token).
    Stop,
    /// It reached its output limit, or its history outgrew the page pool.
    Length,
    /// It was cancelled.
    Cancelled,
}

/// One thing that happened to a request.
///
/// A request sees `Admitted` once (its first admission; readmissions after a
/// preemption are internal), then `Tokens` in index order (with a
/// `Preempted` between them for each preemption), then exactly one terminal
/// event: `Finished` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    /// The request holds a slot and its reservation for the first time.
    Admitted {
        /// Prompt tokens restored from a prefix checkpoint instead of
        /// prefilled (0 without a hit or a cache).
        cached_tokens: u32,
    },
    /// The request was preempted after `generated` output tokens and, its
    /// launches completed, is queued again; it is readmitted by recompute and
    /// its random stream restarts with
    /// [`readmission_seed`](super::readmission_seed)`(seed, generated)`.
    Preempted {
        /// Output tokens generated before the preemption.
        generated: u32,
    },
    /// Output tokens `first..first + tokens.len()` of the request.
    Tokens {
        /// Output index of the first token.
        first: u32,
        /// The tokens.
        tokens: Vec<u32>,
    },
    /// The request finished; `output_tokens` tokens were delivered.
    Finished {
        /// Why it finished.
        reason: FinishReason,
        /// Output tokens delivered in `Tokens` events.
        output_tokens: u32,
    },
    /// Executing the request failed.
    Failed(ExecutionError),
}

impl Event {
    /// Whether no further event follows for this request.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Finished { .. } | Self::Failed(_))
    }
}

/// An event about one request.
#[derive(Debug, Clone)]
pub struct RequestEvent {
    /// The request.
    pub request: RequestId,
    /// What happened.
    pub event: Event,
}

/// Counters of the scheduler's state, for `/metrics` and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Metrics {
    /// The prefix cache's counters, when it is enabled.
    pub cache: Option<CacheMetrics>,
    /// Requests waiting for admission (preempted ones included).
    pub queue_depth: usize,
    /// Requests holding a slot that have not finished.
    pub running: usize,
    /// Launches submitted and not yet retrieved.
    pub in_flight: usize,
    /// Pages in some slot's page table (retiring requests included) or
    /// held by prefix checkpoints.
    pub pages_used: u32,
    /// Free pages reserved for admitted requests' growth.
    pub pages_reserved: u32,
    /// Pages neither used nor reserved.
    pub pages_free: u32,
    /// Preemptions since the scheduler started.
    pub preemptions: u64,
    /// Prompt tokens submitted for prefill since the scheduler started
    /// (restored prefixes are not prefilled).
    pub prefilled_tokens: u64,
    /// Requests finished by a stop token since the scheduler started.
    pub finished_stop: u64,
    /// Requests finished at their output limit (or pool) since it started.
    pub finished_length: u64,
    /// Requests cancelled since it started.
    pub cancelled: u64,
    /// Requests failed since it started.
    pub failed: u64,
    /// Graph launches submitted since it started, by kind (indexed by
    /// [`OperationKind::index`](super::OperationKind::index)): with the
    /// request counters, how many prefill chunks, snapshots and restores a
    /// request cost.
    pub launches: [u64; super::OperationKind::COUNT],
}
