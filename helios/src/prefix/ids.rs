//! Identifiers of the checkpoint store and the handles it lends out.
//!
//! A [`Pin`] is a logical reference, a [`GpuUse`] an outstanding GPU
//! operation, a [`SnapshotReservation`] a row a snapshot copy may be writing.
//! None is `Clone`: each is handed back exactly once, and the store counts
//! those outstanding so a test can prove none leaks.

use std::fmt;

use super::identity::EndpointKey;

/// A checkpoint. Ids are never reused, so a stale id is detected, not
/// confused with a later checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId(pub u64);

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}", self.0)
    }
}

/// A row of the snapshot-row pool, `0..rows`. The recipe declares what a
/// row holds ([`super::RowLayout`]); the store never interprets it. Mapping
/// a pool row to the state pool's physical row is the executor's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotRow(pub u32);

impl fmt::Display for SnapshotRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot row {}", self.0)
    }
}

/// A logical reference to a checkpoint: while held, the checkpoint keeps
/// its snapshot and its page chain.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a pin is handed back with CheckpointStore::unpin"]
pub struct Pin {
    pub(super) id: CheckpointId,
}

impl Pin {
    /// The pinned checkpoint.
    pub fn checkpoint(&self) -> CheckpointId {
        self.id
    }
}

/// An outstanding GPU operation that reads a checkpoint's row or pages (a
/// restore, or launches still in flight after the logical reference ended).
/// The checkpoint cannot be retired until it is handed back.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a GPU use is handed back with CheckpointStore::end_use"]
pub struct GpuUse {
    pub(super) id: CheckpointId,
}

impl GpuUse {
    /// The checkpoint in use.
    pub fn checkpoint(&self) -> CheckpointId {
        self.id
    }
}

/// A snapshot row taken for one capture. Hand it to
/// [`super::CheckpointStore::publish`] after the snapshot copy completed, or
/// back with [`super::CheckpointStore::release_reservation`] once no copy
/// can still write it.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is published or released"]
pub struct SnapshotReservation {
    pub(super) row: SnapshotRow,
}

impl SnapshotReservation {
    /// The row the snapshot graph writes.
    pub fn row(&self) -> SnapshotRow {
        self.row
    }
}

/// A cached prefix found for a token stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Its endpoint key (its token count is the reused prefix).
    pub key: EndpointKey,
}

impl Hit {
    /// Tokens the hit covers.
    pub fn tokens(&self) -> u32 {
        self.key.tokens()
    }
}
