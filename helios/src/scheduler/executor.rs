//! The executor interface: what the scheduler asks the prepared graphs to do,
//! in the prepared contract's vocabulary, and what comes back.
//!
//! The scheduler hands the executor a typed [`Launch`] (page-table diffs plus
//! one operation) and never reaches into it; the executor packs the staging
//! inputs, replays the graph and copies the completion records back. Launches
//! run in submission order on one stream, and completions are retrieved in
//! that order. A launch's records are raw device values: the scheduler
//! validates them before changing any state.

use super::error::ExecutionError;
use super::ids::{Page, Slot};
use crate::prefix::{SnapshotRow, MAX_CAPTURES_PER_REQUEST};

/// Sampling parameters the admit operation writes into a slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; must be finite and positive.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (ties kept); 0 disables.
    pub top_k: u32,
    /// Nucleus threshold; 1 disables.
    pub top_p: f32,
    /// Minimum probability relative to the most likely token; 0 disables.
    pub min_p: f32,
    /// Repetition penalty over the histogram; 1 is neutral.
    pub repetition_penalty: f32,
    /// Presence penalty; 0 is neutral.
    pub presence_penalty: f32,
    /// Frequency penalty; 0 is neutral.
    pub frequency_penalty: f32,
}

impl Default for SamplingParams {
    /// Temperature 1 with every filter disabled and neutral penalties.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// Initialize a slot for a request (the admit graph).
///
/// The graph sets sampling parameters and seed, zeroes the counters, and builds the
/// penalty histogram once from the whole `prompt`.
#[derive(Debug, Clone, PartialEq)]
pub struct Admit {
    /// The slot the request occupies.
    pub slot: Slot,
    /// Every token the request's history starts from (after a preemption,
    /// the original prompt followed by the output so far).
    pub prompt: Vec<u32>,
    /// Output tokens this admission may still sample (the device's
    /// `max_new`).
    pub max_new_tokens: u32,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// The Philox key: the request's seed, or after a preemption
    /// [`readmission_seed`](super::readmission_seed) of it and the tokens
    /// generated so far (the device counter starts at 0 on every admission).
    pub seed: u64,
    /// Tokens already in the slot's pages (after a prefix restore); 0 when
    /// the whole prompt is prefilled.
    pub consumed: u32,
}

/// One prefill chunk of one request (a prefill graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillChunk {
    /// The request's slot.
    pub slot: Slot,
    /// The captured prefill capacity to replay (holds `tokens`).
    pub capacity: u32,
    /// The next prompt tokens, consumed at positions `consumed..`.
    pub tokens: Vec<u32>,
    /// The graph samples the first output: the chunk ends the prompt and no
    /// capture inside it follows (after one, a resume samples instead).
    pub samples: bool,
    /// The sampled token's mask (packed, bit set = allowed) when the
    /// request is constrained.
    pub mask: Option<Vec<u32>>,
}

/// One decode step (a decode graph): every row consumes its slot's pending
/// token and samples the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decode {
    /// The captured decode capacity to replay.
    pub capacity: u32,
    /// One slot per row, `capacity` rows, padded with [`Slot::NULL`].
    pub slots: Vec<Slot>,
    /// Each row's mask when any row is constrained (`None`: the row is
    /// not); empty when none is.
    pub masks: Vec<Option<Vec<u32>>>,
}

/// Sample from a slot's saved hidden vector (the resume graph): after a
/// whole-history checkpoint restore, and after a chunk ending the prompt
/// with captures inside it (then once more after the captures, to repeat
/// the sample).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The restored slot.
    pub slot: Slot,
    /// The sampled token's mask when the request is constrained.
    pub mask: Option<Vec<u32>>,
}

/// Freeze a slot's exact consumed state into a snapshot row (the snapshot
/// graph): the recipe's continuation row (for the dense recipe, the partial
/// tail page and the saved hidden vector) and the consumed count. The
/// pending sampled token is not part of it. The graph reports status 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The slot whose state is frozen.
    pub slot: Slot,
    /// The row written.
    pub row: SnapshotRow,
}

/// Install a snapshot row into an admitted slot whose page table already
/// maps the checkpoint's shared pages and, for an unaligned endpoint, a
/// private tail page (the restore graph). It applies only when the row holds
/// `expect` consumed tokens, and reports status 1 when it applied, 0 when
/// not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restore {
    /// The restored slot.
    pub slot: Slot,
    /// The row read.
    pub row: SnapshotRow,
    /// The consumed count the row must hold.
    pub expect: u32,
}

/// One graph replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Initialize a slot for a request.
    Admit(Admit),
    /// Consume prompt tokens of one request.
    PrefillChunk(PrefillChunk),
    /// Consume and sample one token for each row.
    Decode(Decode),
    /// Sample from a restored slot's saved hidden vector.
    Resume(Resume),
    /// Copy a slot's state into a snapshot row.
    Snapshot(Snapshot),
    /// Copy a snapshot row into a slot.
    Restore(Restore),
}

impl Operation {
    /// The operation's kind.
    pub fn kind(&self) -> OperationKind {
        match self {
            Self::Admit(_) => OperationKind::Admit,
            Self::PrefillChunk(_) => OperationKind::PrefillChunk,
            Self::Decode(_) => OperationKind::Decode,
            Self::Resume(_) => OperationKind::Resume,
            Self::Snapshot(_) => OperationKind::Snapshot,
            Self::Restore(_) => OperationKind::Restore,
        }
    }

    /// Whether the graph reports a maintenance status (snapshot, restore).
    pub fn reports_status(&self) -> bool {
        matches!(self, Self::Snapshot(_) | Self::Restore(_))
    }

    /// Completion records the graph writes: one per decode row (padding
    /// included), one for a prefill chunk or resume, none for admit,
    /// snapshot or restore.
    pub fn record_rows(&self) -> usize {
        match self {
            Self::Admit(_) | Self::Snapshot(_) | Self::Restore(_) => 0,
            Self::PrefillChunk(_) | Self::Resume(_) => 1,
            Self::Decode(decode) => decode.slots.len(),
        }
    }

    /// The slot of each record row.
    pub fn record_slots(&self) -> Vec<Slot> {
        match self {
            Self::Admit(_) | Self::Snapshot(_) | Self::Restore(_) => Vec::new(),
            Self::PrefillChunk(chunk) => vec![chunk.slot],
            Self::Resume(resume) => vec![resume.slot],
            Self::Decode(decode) => decode.slots.clone(),
        }
    }
}

/// The kind of an [`Operation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OperationKind {
    /// [`Operation::Admit`].
    Admit,
    /// [`Operation::PrefillChunk`].
    PrefillChunk,
    /// [`Operation::Decode`].
    Decode,
    /// [`Operation::Resume`].
    Resume,
    /// [`Operation::Snapshot`].
    Snapshot,
    /// [`Operation::Restore`].
    Restore,
}

impl OperationKind {
    /// How many kinds there are.
    pub const COUNT: usize = 6;

    /// Every kind, in declaration order (the index of
    /// [`Metrics::launches`](super::Metrics::launches)).
    pub const ALL: [OperationKind; Self::COUNT] = [
        Self::Admit,
        Self::PrefillChunk,
        Self::Decode,
        Self::Resume,
        Self::Snapshot,
        Self::Restore,
    ];

    /// The kind's position in [`OperationKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Writes page-table entries `first..first + pages.len()` of `slot`
/// (logical page index to physical page). [`Page::NULL`] clears an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTableUpdate {
    /// The slot whose page table changes.
    pub slot: Slot,
    /// The first logical page written.
    pub first: u32,
    /// The physical pages, in logical order.
    pub pages: Vec<Page>,
}

/// One submission: page-table updates, applied in order, then one operation,
/// both ordered after every earlier launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Page-table changes the operation (or a later one) relies on.
    pub page_updates: Vec<PageTableUpdate>,
    /// The graph to replay.
    pub operation: Operation,
}

/// Identifies a submitted launch until its completion is retrieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// One completion record as the graph wrote it (the contract's
/// `completion_fields`: slot, token, generated, consumed, done, valid).
/// Raw device values: validated by the scheduler, never trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompletionRecord {
    /// The row's slot.
    pub slot: i32,
    /// The sampled token, -1 when the row did not sample.
    pub token: i32,
    /// Output tokens sampled since admission.
    pub generated: i32,
    /// Tokens in the slot's pages.
    pub consumed: i32,
    /// Finish flag: 0 running, 1 stop, 2 length.
    pub done: i32,
    /// 1 when the row sampled a token.
    pub valid: i32,
}

/// The device's finish flag values.
pub mod done {
    /// The request is still running.
    pub const RUNNING: i32 = 0;
    /// It sampled a stop token.
    pub const STOP: i32 = 1;
    /// It reached its output limit.
    pub const LENGTH: i32 = 2;
}

/// What a finished launch wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Completion {
    /// One record per row ([`Operation::record_rows`]).
    pub records: Vec<CompletionRecord>,
    /// The maintenance status a snapshot or restore wrote (1: applied), as
    /// the device wrote it; `None` for other operations.
    pub status: Option<i32>,
}

/// A bound on the launches the scheduler has in flight at once: one prefill
/// iteration's admit, restore, chunk, resume and snapshot, then a decode
/// step (a prefill iteration drains first, so no earlier decode step runs);
/// on a positional-KV core also an admit and a snapshot per message endpoint
/// captured inside the chunk, the admit back to its end and the resample
/// after them. The test executor flags a launch beyond it.
pub const MAX_IN_FLIGHT: usize = 8 + 2 * MAX_CAPTURES_PER_REQUEST as usize;

/// Runs launches over the prepared graphs.
///
/// Launches execute in submission order. The scheduler submits a
/// dependency-free decode step before the previous decode step's (or prefill
/// chunk's) completion is retrieved, so outside a prefill iteration at most
/// two launches that write completion records are in flight, possibly
/// behind one admit launch; a prefill iteration's chunk, resume, resample
/// and decode step all write records.
/// Completions are retrieved in submission order, each exactly once; the
/// storage a launch reads or writes (staging inputs, completion records)
/// stays owned by the executor until then. A prefill iteration with prefix
/// checkpoints submits at most admit, restore, a chunk or resume, the
/// captures inside the chunk and a snapshot before its decode step:
/// [`MAX_IN_FLIGHT`] launches.
pub trait Executor {
    /// Enqueues `launch` after every earlier launch.
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError>;

    /// The completion of `ticket` when the launch finished, `None` while it
    /// runs. `ticket` is the oldest launch not yet retrieved.
    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError>;

    /// Blocks until `ticket`, the oldest launch not yet retrieved, finished.
    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError>;

    /// Whether launches may carry token masks (constrained decoding): the
    /// executor's sampling applies them. Those that cannot refuse
    /// constrained requests at submission.
    fn applies_masks(&self) -> bool {
        false
    }

    /// Waits until every launch submitted so far has finished on the device,
    /// retrieving none: what a tensor-parallel rank does before any rank's
    /// memory is released (a peer's launch may still read it). Nothing to do
    /// for an executor without a device.
    fn drain(&mut self) -> Result<(), ExecutionError> {
        Ok(())
    }
}
