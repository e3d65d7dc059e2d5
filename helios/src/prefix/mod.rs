//! Exact prefix checkpoints: the CPU half of the prefix cache.
//!
//! The cache "retains immutable, content-addressed checkpoints at the
//! rendered endpoints of complete messages, final prompt boundary, and
//! terminal consumed boundary. Equal endpoints share one checkpoint." A
//! checkpoint owns a parent-linked chain of immutable complete pages plus a
//! continuation row whose contents the recipe declares. This module is pure
//! bookkeeping over ids (pages, rows, checkpoints); the scheduler drives it
//! and the core's maintenance graphs (`GraphKind::Snapshot`, `Restore`,
//! `Resume`) move the bytes.
//!
//! Rules implemented, each documented where it is enforced:
//! - prefix identity: chained SHA-256 over fixed 64-token blocks,
//!   independent of the page size, salted at the root with the stream's
//!   conditioning identity; a partial tail has its own key kind
//!   (`identity.rs`);
//! - the exact-cut rule mapping the renderer's byte marks through the
//!   prompt's untrimmed token offsets; the final prompt endpoint; the
//!   terminal consumed prefix without the pending token (`endpoints.rs`);
//! - the per-request snapshot budget (rows / concurrency, capped at eight,
//!   at least one) reserving terminal then prompt captures, and message
//!   endpoints chosen nearest to equal-interval targets over the uncached
//!   suffix, ties to the earlier (`selection.rs`);
//! - page geometry: a checkpoint at `t` shares `t / page` complete pages,
//!   its tail lives in its row; a restore at an aligned endpoint writes no
//!   page (`geometry.rs`, [`RestorePlan`]);
//! - rows the store never interprets, declared as named byte parts
//!   (`layout.rs`);
//! - lookup of the longest cached prefix, pins as logical references, GPU
//!   uses counted apart from them (`store.rs`);
//! - publication after the copy completes, moving the request's completed
//!   private pages into the chain in physical order; a duplicate
//!   publication releases only its reservation and leaves the request's
//!   pages private (`publication.rs`);
//! - snapshot pressure: thin the interior checkpoint whose parent and child
//!   delimit the shortest interval (ties: least recent access) before
//!   evicting the least recently used unpinned leaf; ancestor removal moves
//!   its page segment to its child and keeps descendant ids, rows and
//!   chains valid; page pressure: least recently used eligible leaves;
//!   pinned and branching checkpoints keep their snapshots (`eviction.rs`);
//! - page pressure and snapshot pressure reported apart, counters for hit
//!   tokens, published, duplicate, evicted and thinned checkpoints
//!   (`report.rs`); the invariants (`verify.rs`).
//!
//! Decided here where the design is open:
//! - under page pressure an interior ancestor is not removed: removal moves
//!   its pages to its child and frees none. "Removable ancestors" become
//!   page-pressure candidates once the eviction of their last child makes
//!   them leaves. If a row layout ever held KV pages, this would change;
//! - equal-interval targets: `n` targets split `[reused, prompt]` into
//!   `n + 1` equal parts; a root's thinning interval starts at token 0;
//! - a token crossing a mark cancels the endpoint (never moved);
//! - access (for LRU and thinning ties) is the checkpoint's publication, a
//!   hit, a pin, an unpin or a duplicate publication of it; a descendant's
//!   access does not refresh its ancestors.
//!
//! The scheduler drives the store (`scheduler/checkpoints.rs`): chat
//! requests offer the exact endpoints of their recent messages
//! (`Frontend::encode_chat_with_recent_marks`), admission restores the
//! longest cached prefix under a pin held until retirement (the pin covers
//! every launch that reads the chain, so no [`GpuUse`] is needed there),
//! prefill stops at the selected endpoints to snapshot them (on a
//! positional-KV core, message endpoints are snapshotted after the chunk
//! that holds them and published for extension only), and finished or
//! preempted requests capture their consumed prefix. The root salt is
//! the core's identity (recipe, checkpoint, configuration and tokenizer
//! fingerprints), and pool rows are the core's snapshot-row indices.
//! Positioned conditioning (images) and draft (MTP) boundary pages, which
//! the design also checkpoints, are not modelled yet.

mod checkpoint;
mod endpoints;
mod error;
mod eviction;
mod geometry;
mod identity;
mod ids;
mod layout;
mod publication;
mod report;
mod rows;
mod selection;
mod store;
mod verify;

pub use checkpoint::CheckpointInfo;
pub use endpoints::{prompt_endpoints, terminal_endpoint, EndpointError, PromptEndpoints};
pub use error::{NoSnapshotRow, PrefixError, RejectedPublication};
pub use eviction::{Eviction, SnapshotGrant};
pub use geometry::PageGeometry;
pub use identity::{BlockKey, EndpointKey, PrefixChain, BLOCK_TOKENS};
pub use ids::{CheckpointId, GpuUse, Hit, Pin, SnapshotReservation, SnapshotRow};
pub use layout::{RowLayout, RowPart};
pub use publication::{Publication, Published};
pub use report::{Outstanding, PageUse, PrefixMetrics, Pressure, RowUse};
pub use selection::{
    capture_budget, select_captures, CapturePlan, CaptureRequest, MAX_CAPTURES_PER_REQUEST,
};
pub use store::{CheckpointStore, RestorePlan, StoreConfig};
pub use verify::Inconsistency;
