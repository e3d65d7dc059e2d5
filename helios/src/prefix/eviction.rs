//! Retiring checkpoints under snapshot pressure and under page pressure.
//!
//! The design: "Track logical references separately from outstanding GPU
//! use. A page or slot becomes reusable only after both have ended." A
//! checkpoint with a pin or a [`super::GpuUse`] is never retired here.
//!
//! Snapshot pressure ([`CheckpointStore::reserve_snapshot`]): "thin
//! checkpoint chains before evicting their endpoints. A removable checkpoint
//! has exactly one child and no direct request pin. Prefer interior
//! checkpoints over chain roots, and remove the checkpoint whose surviving
//! parent and child delimit the shortest token interval. Break
//! equal-distance ties by least recent access. [...] If no chain can be
//! thinned, evict the least recently used unpinned leaf, regardless of its
//! age." A root's interval runs from token 0 to its child.
//!
//! Before either, a *superseded* leaf goes (a deliberate reading, for the
//! coverage the design wants: "this retains sparse history coverage"): a
//! leaf whose parent has a child published after it, so that the
//! conversation continued from the parent along another path. An agent's
//! terminal checkpoint becomes one when the next turn renders the reply
//! differently from the sampled tokens (a reasoning model's template drops
//! the reasoning, a tokenizer encodes the text otherwise): the next turn
//! extends the prompt-end checkpoint, which then has two children and is
//! never removable, so with the design's order alone the least recently
//! used leaves go first, each leaves its parent removable as the chain's
//! root, and the chain is eaten from its oldest end. With rows that hold
//! recurrent state (36 at the hybrid's H200 geometry) a fork of a turn 40
//! turns back found nothing to restore (`tests/prefix_eviction.rs`). A
//! superseded leaf is what a client is least likely to extend: only a
//! request that repeats the sampled tokens exactly reaches it, and a
//! regenerated answer supersedes the earlier one.
//!
//! Removing an ancestor "transfers its storage without invalidating
//! descendants: transfer its ordered page segment and last-use fence to that
//! child, bypass the ancestor in the parent chain, and retire only the
//! ancestor snapshot." A checkpoint with a GPU use is not removable, so its
//! last-use fence has passed when it is removed; reads of its pages by
//! descendants' uses are counted on those descendants, whose chains still
//! hold the pages. "Branching ancestors and directly pinned checkpoints
//! retain their snapshots": a branching ancestor has two children and is
//! neither removable nor a leaf.
//!
//! Page pressure ([`CheckpointStore::reclaim_pages`]): "select the least
//! recently used eligible leaf or removable ancestor and recheck physical
//! backing after each retirement." Only a leaf's eviction frees pages;
//! removing an interior ancestor moves its pages to its child and frees
//! none, so under page pressure it would discard a reusable prefix for
//! nothing. Here an ancestor becomes a page-pressure candidate when the
//! eviction of its last child makes it a leaf, and competes by its own last
//! use (a deliberate reading, recorded in the module docs).

use crate::scheduler::Page;

use super::error::NoSnapshotRow;
use super::ids::{CheckpointId, SnapshotReservation};
use super::store::CheckpointStore;

/// Checkpoints retired by one call, and the pages that became free. The
/// pages go back to the page pool: no checkpoint references them and no GPU
/// use of a retired checkpoint is outstanding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use = "freed pages go back to the page pool"]
pub struct Eviction {
    /// Pages freed, in no particular order.
    pub pages: Vec<Page>,
    /// Leaves evicted with their pages, in eviction order.
    pub evicted: Vec<CheckpointId>,
    /// Ancestors removed by thinning (pages moved to their child).
    pub thinned: Vec<CheckpointId>,
}

/// A snapshot row for one capture, and what was retired to get it.
#[derive(Debug)]
#[must_use = "the reservation is published or released"]
pub struct SnapshotGrant {
    /// The row.
    pub reservation: SnapshotReservation,
    /// Retired checkpoints and freed pages (a leaf eviction frees pages).
    pub eviction: Eviction,
}

impl CheckpointStore {
    /// Takes a snapshot row for a capture at a selected endpoint, thinning
    /// a chain or evicting a leaf when every row is taken. When the
    /// scheduler is also short of pages it reclaims pages first
    /// ([`Self::reclaim_pages`]), which frees rows too; this call handles
    /// snapshot-only pressure.
    pub fn reserve_snapshot(&mut self) -> Result<SnapshotGrant, NoSnapshotRow> {
        let mut eviction = Eviction::default();
        if self.rows.free_count() == 0 {
            self.metrics.snapshot_pressure += 1;
            if let Some(id) = self.superseded_leaf() {
                eviction.pages.extend(self.evict_leaf(id));
                eviction.evicted.push(id);
                self.metrics.superseded += 1;
            } else if let Some(id) = self.thinning_candidate() {
                self.remove_ancestor(id);
                eviction.thinned.push(id);
            } else if let Some(id) = self.leaf_candidate() {
                eviction.pages.extend(self.evict_leaf(id));
                eviction.evicted.push(id);
            } else {
                self.metrics.snapshot_refusals += 1;
                return Err(NoSnapshotRow {
                    rows: self.rows.rows(),
                    reserved: self.rows.reserved_count(),
                });
            }
        }
        let row = self.rows.take().expect("a free or just freed row");
        Ok(SnapshotGrant {
            reservation: SnapshotReservation { row },
            eviction,
        })
    }

    /// Evicts least recently used eligible leaves until `wanted` pages are
    /// free or none is left; the caller rechecks its pool after. Pinned
    /// chains, chains in GPU use and branching ancestors keep everything.
    pub fn reclaim_pages(&mut self, wanted: u32) -> Eviction {
        let mut eviction = Eviction::default();
        if wanted == 0 {
            return eviction;
        }
        self.metrics.page_pressure += 1;
        while eviction.pages.len() < wanted as usize {
            let Some(id) = self.leaf_candidate() else {
                self.metrics.page_shortfalls += 1;
                break;
            };
            eviction.pages.extend(self.evict_leaf(id));
            eviction.evicted.push(id);
        }
        eviction
    }

    /// Evicts every checkpoint no pin or GPU use retains (a cache reset).
    pub fn clear_unused(&mut self) -> Eviction {
        let mut eviction = Eviction::default();
        while let Some(id) = self.leaf_candidate() {
            eviction.pages.extend(self.evict_leaf(id));
            eviction.evicted.push(id);
        }
        eviction
    }

    /// The removable checkpoint to thin: interior before root, then the
    /// shortest interval its parent and child delimit, then least recent
    /// access (then the older id, for a total order).
    fn thinning_candidate(&self) -> Option<CheckpointId> {
        (self.checkpoints.iter())
            .filter(|(_, node)| node.children.len() == 1 && !node.held())
            .map(|(&id, node)| {
                let child = &self.checkpoints[&node.children[0]];
                let parent_tokens = node.parent.map_or(0, |p| self.checkpoints[&p].tokens());
                let interval = child.tokens() - parent_tokens;
                ((node.parent.is_none(), interval, node.last_use, id), id)
            })
            .min_by_key(|(order, _)| *order)
            .map(|(_, id)| id)
    }

    /// The least recently used leaf no pin or GPU use retains whose parent
    /// has a child published after it (ids grow with publication).
    fn superseded_leaf(&self) -> Option<CheckpointId> {
        (self.checkpoints.iter())
            .filter(|(&id, node)| {
                node.children.is_empty()
                    && !node.held()
                    && node.parent.is_some_and(|parent| {
                        self.checkpoints[&parent].children.iter().any(|&c| c > id)
                    })
            })
            .min_by_key(|(&id, node)| (node.last_use, id))
            .map(|(&id, _)| id)
    }

    /// The least recently used leaf no pin or GPU use retains.
    fn leaf_candidate(&self) -> Option<CheckpointId> {
        (self.checkpoints.iter())
            .filter(|(_, node)| node.children.is_empty() && !node.held())
            .min_by_key(|(&id, node)| (node.last_use, id))
            .map(|(&id, _)| id)
    }

    /// Folds a one-child ancestor into its child: the child's segment
    /// becomes the ancestor's pages then its own (physical order kept), its
    /// parent link bypasses the ancestor, and only the ancestor's row is
    /// retired. The removed prefix no longer matches lookups.
    fn remove_ancestor(&mut self, id: CheckpointId) {
        let node = self.checkpoints.remove(&id).expect("a live candidate");
        let [child_id] = node.children[..] else {
            unreachable!("a removable ancestor has exactly one child")
        };
        let child = self.node_mut(child_id);
        let mut segment = node.segment;
        segment.append(&mut child.segment);
        child.segment = segment;
        child.parent = node.parent;
        if let Some(parent) = node.parent {
            let siblings = &mut self.node_mut(parent).children;
            let at = siblings.iter().position(|&c| c == id).expect("linked");
            siblings[at] = child_id;
        }
        self.unindex(id, &node.key);
        self.rows.release(node.row);
        self.metrics.thinned += 1;
    }

    /// Retires a leaf with its row and returns its pages.
    fn evict_leaf(&mut self, id: CheckpointId) -> Vec<Page> {
        let node = self.checkpoints.remove(&id).expect("a live candidate");
        debug_assert!(node.children.is_empty() && !node.held());
        if let Some(parent) = node.parent {
            self.node_mut(parent).children.retain(|&c| c != id);
        }
        self.unindex(id, &node.key);
        self.rows.release(node.row);
        for page in &node.segment {
            self.cached_pages.remove(page);
        }
        self.metrics.evicted += 1;
        self.metrics.evicted_pages += node.segment.len() as u64;
        node.segment
    }
}
