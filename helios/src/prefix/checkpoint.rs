//! One checkpoint: an endpoint key, its link into a page chain, and its row.

use crate::scheduler::Page;

use super::identity::EndpointKey;
use super::ids::{CheckpointId, SnapshotRow};

/// A published checkpoint as the store holds it.
///
/// Its complete pages are its ancestors' segments, root first, then its own
/// `segment`: together exactly `t / page` pages for endpoint `t`. Pages are
/// immutable once published; the partial tail lives in `row`.
#[derive(Debug)]
pub(super) struct Checkpoint {
    pub(super) key: EndpointKey,
    pub(super) parent: Option<CheckpointId>,
    pub(super) children: Vec<CheckpointId>,
    /// The complete pages past the parent's, in logical order.
    pub(super) segment: Vec<Page>,
    pub(super) row: SnapshotRow,
    /// Whether its row holds only what extending it needs: the hidden vector
    /// in it belongs to a later position, so no request resumes sampling
    /// from it ([`super::Publication::extension_only`]).
    pub(super) extension_only: bool,
    /// Logical references: requests restoring, branching or extending it.
    pub(super) pins: u32,
    /// Outstanding GPU operations reading its row or pages.
    pub(super) uses: u32,
    /// The store clock at its last access.
    pub(super) last_use: u64,
}

impl Checkpoint {
    pub(super) fn tokens(&self) -> u32 {
        self.key.tokens()
    }

    /// Retained whatever the pressure: directly pinned or in use.
    pub(super) fn held(&self) -> bool {
        self.pins > 0 || self.uses > 0
    }

    pub(super) fn info(&self, id: CheckpointId) -> CheckpointInfo {
        CheckpointInfo {
            id,
            key: self.key,
            parent: self.parent,
            children: self.children.clone(),
            segment: self.segment.clone(),
            row: self.row,
            extension_only: self.extension_only,
            pins: self.pins,
            uses: self.uses,
            last_use: self.last_use,
        }
    }
}

/// A snapshot of one checkpoint's bookkeeping, for reports and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The checkpoint.
    pub id: CheckpointId,
    /// Its endpoint key.
    pub key: EndpointKey,
    /// The checkpoint whose pages precede its segment.
    pub parent: Option<CheckpointId>,
    /// Checkpoints whose chains continue through it.
    pub children: Vec<CheckpointId>,
    /// Its own complete pages, past the parent's.
    pub segment: Vec<Page>,
    /// Its continuation row.
    pub row: SnapshotRow,
    /// Whether it serves extensions only (never a whole-prompt resume).
    pub extension_only: bool,
    /// Logical references.
    pub pins: u32,
    /// Outstanding GPU uses.
    pub uses: u32,
    /// The store clock at its last access.
    pub last_use: u64,
}

impl CheckpointInfo {
    /// Tokens it covers.
    pub fn tokens(&self) -> u32 {
        self.key.tokens()
    }
}
