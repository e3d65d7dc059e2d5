//! The scheduler: admission, batching, page reservations, preemption and
//! cancellation over an [`Executor`] of the prepared graphs.
//!
//! One model thread owns the [`Scheduler`] ([`Worker`]); HTTP tasks talk to
//! it through a [`SchedulerHandle`]. The scheduler plans in the prepared
//! contract's vocabulary (slots, pages, capacities, graph operations) from
//! the declared [`Geometry`] only, and hands the executor typed [`Launch`]es.
//!
//! Rules, each documented where it is enforced:
//! - admission is FIFO subject to a slot and a reservation of the prompt plus
//!   one page of output; a request that does not fit lets smaller ones pass,
//!   a bounded number of times (`admission.rs`);
//! - each iteration submits at most one prefill chunk and one decode step
//!   over every runnable request, with up to two decode steps in flight
//!   (`engine.rs`);
//! - pages grow one ahead of decode; when a running request cannot continue
//!   the newest eligible decoder is preempted and later readmitted with its
//!   history, remaining budget and random-stream counter (`growth.rs`);
//! - one page ledger owns slots, pages, reservations and page tables; a
//!   placement holds its slot through a lease that only the ledger's
//!   release consumes (`ledger.rs`), and its phase (admitting, restoring,
//!   prefilling, decoding, exiting) is an explicit state (`request.rs`);
//! - every completion record is validated before any state changes
//!   (`validate.rs`); cancellation and completion are applied at submission
//!   boundaries, and a slot or page is reused only once no launch in flight
//!   references it (`retire.rs`);
//! - with a snapshot-row pool, admission restores the longest cached exact
//!   prefix, prefill stops at the selected endpoints to snapshot them (a
//!   positional-KV core snapshots message endpoints after the chunk holding
//!   them), and finished or preempted requests capture their terminal prefix
//!   (`checkpoints.rs`).
//!
//! `test_executor` is a deterministic CPU executor for tests, compiled only
//! with the `test-support` feature (and in Helios's own unit tests).

mod admission;
mod checkpoints;
mod collect;
mod engine;
mod error;
mod events;
mod executor;
mod geometry;
mod grammar;
mod growth;
mod ids;
mod latency;
mod ledger;
mod plan;
mod pool;
mod ranks;
mod request;
mod retire;
mod rng;
mod submit;
#[cfg(any(test, feature = "test-support"))]
pub mod test_executor;
mod validate;
mod worker;

pub use checkpoints::{CacheMetrics, PrefixConfig};
pub use engine::{Scheduler, SchedulerConfig, StepReport};
pub use error::{
    AdmissionError, ErrorClass, ExecutionError, GeometryError, InvalidRecord, SchedulerError,
};
pub use events::{Event, FinishReason, Metrics, RequestEvent};
pub use executor::{
    done, Admit, Completion, CompletionRecord, Decode, Executor, Launch, Operation, OperationKind,
    PageTableUpdate, PrefillChunk, Restore, Resume, SamplingParams, Snapshot, Ticket,
    MAX_IN_FLIGHT,
};
pub use geometry::Geometry;
pub use grammar::Grammar;
pub use ids::{Page, RequestId, Slot};
pub use latency::{
    FirstTokenSplit, Histogram, Latency, FIRST_TOKEN_PART_BUCKETS, INTER_TOKEN_BUCKETS,
    MASK_BUCKETS, PREPARATION_BUCKETS, TTFT_BUCKETS,
};
pub use ranks::{RankFailure, RankGroup, RankPanicked, RankProblem, COLLECTIVES_WAIT_LIMIT_MAX};
pub use request::RequestSpec;
pub use rng::readmission_seed;
pub use worker::{
    Health, RequestStream, SchedulerHandle, ShutdownMode, Status, Submission, Worker,
};
