//! The store's invariants, checked whole (tests and debug builds of the
//! wiring call [`CheckpointStore::verify`] after each mutation they care
//! about).

use std::collections::{BTreeSet, HashSet};

use thiserror::Error;

use crate::scheduler::Page;

use super::ids::{CheckpointId, SnapshotRow};
use super::store::CheckpointStore;

/// An invariant the store broke.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Inconsistency {
    /// Parent and child links disagree, or a parent is not older.
    #[error("{checkpoint}: parent and child links disagree")]
    Link {
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// A checkpoint does not extend its parent.
    #[error("{checkpoint}: its endpoint does not extend its parent's")]
    Order {
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// A chain holds other than `endpoint / page` complete pages.
    #[error("{checkpoint}: its chain holds {held} pages, its endpoint completes {expected}")]
    ChainPages {
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// Complete pages of its endpoint.
        expected: u32,
        /// Pages its chain holds.
        held: u32,
    },
    /// A page in two segments, a null page, or the page set out of step.
    #[error("{page} is held twice, is null, or is missing from the page set")]
    Page {
        /// The page.
        page: Page,
    },
    /// The cached page set lists pages no segment holds.
    #[error("the cached page set lists {listed} pages, segments hold {held}")]
    PageSet {
        /// Pages listed.
        listed: usize,
        /// Pages held by segments.
        held: usize,
    },
    /// A row held twice, or held and also free or reserved.
    #[error("{row} is held twice or also free or reserved")]
    Row {
        /// The row.
        row: SnapshotRow,
    },
    /// Free, reserved and held rows do not add up to the pool.
    #[error("{free} free + {reserved} reserved + {held} held rows != {rows}")]
    RowCount {
        /// Free rows.
        free: u32,
        /// Reserved rows.
        reserved: u32,
        /// Held rows.
        held: u32,
        /// Rows in the pool.
        rows: u32,
    },
    /// The key indexes disagree with the checkpoints.
    #[error("{checkpoint}: the key indexes disagree")]
    Index {
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// Per-checkpoint pins or uses do not sum to the handles lent out.
    #[error("{what}: checkpoints count {counted}, handles lent {lent}")]
    Handles {
        /// `pins` or `uses`.
        what: &'static str,
        /// The sum over checkpoints.
        counted: u32,
        /// Handles lent out.
        lent: u32,
    },
}

impl CheckpointStore {
    /// Checks every invariant: links, page chains, rows, indexes, handles.
    pub fn verify(&self) -> Result<(), Inconsistency> {
        self.verify_links()?;
        self.verify_pages()?;
        self.verify_rows()?;
        self.verify_index()?;
        let pins = self.checkpoints.values().map(|n| n.pins).sum();
        if pins != self.outstanding_pins {
            return Err(Inconsistency::Handles {
                what: "pins",
                counted: pins,
                lent: self.outstanding_pins,
            });
        }
        let uses = self.checkpoints.values().map(|n| n.uses).sum();
        if uses != self.outstanding_uses {
            return Err(Inconsistency::Handles {
                what: "uses",
                counted: uses,
                lent: self.outstanding_uses,
            });
        }
        Ok(())
    }

    fn verify_links(&self) -> Result<(), Inconsistency> {
        for (&id, node) in &self.checkpoints {
            let link = Inconsistency::Link { checkpoint: id };
            if let Some(parent_id) = node.parent {
                let parent = self.checkpoints.get(&parent_id).ok_or(link.clone())?;
                let listed = parent.children.iter().filter(|&&c| c == id).count();
                if listed != 1 || parent_id >= id {
                    return Err(link);
                }
                if parent.tokens() >= node.tokens() {
                    return Err(Inconsistency::Order { checkpoint: id });
                }
            }
            for child in &node.children {
                let child = self.checkpoints.get(child).ok_or(link.clone())?;
                if child.parent != Some(id) {
                    return Err(link);
                }
            }
        }
        Ok(())
    }

    fn verify_pages(&self) -> Result<(), Inconsistency> {
        let mut seen = HashSet::new();
        for node in self.checkpoints.values() {
            for &page in &node.segment {
                if page.is_null() || !seen.insert(page) || !self.cached_pages.contains(&page) {
                    return Err(Inconsistency::Page { page });
                }
            }
        }
        if seen.len() != self.cached_pages.len() {
            return Err(Inconsistency::PageSet {
                listed: self.cached_pages.len(),
                held: seen.len(),
            });
        }
        for (&id, node) in &self.checkpoints {
            let held = u32::try_from(self.chain_pages(id).len()).expect("page counts");
            let expected = self.geometry.complete_pages(node.tokens());
            if held != expected {
                return Err(Inconsistency::ChainPages {
                    checkpoint: id,
                    expected,
                    held,
                });
            }
        }
        Ok(())
    }

    fn verify_rows(&self) -> Result<(), Inconsistency> {
        let mut seen: BTreeSet<SnapshotRow> = self.rows.free_rows().collect();
        seen.extend(self.rows.reserved_rows());
        let free = self.rows.free_count();
        let reserved = self.rows.reserved_count();
        if seen.len() != (free + reserved) as usize {
            let row = SnapshotRow(u32::MAX);
            return Err(Inconsistency::Row { row });
        }
        for node in self.checkpoints.values() {
            if node.row.0 >= self.rows.rows() || !seen.insert(node.row) {
                return Err(Inconsistency::Row { row: node.row });
            }
        }
        let held = u32::try_from(self.checkpoints.len()).expect("row counts");
        if free + reserved + held != self.rows.rows() {
            return Err(Inconsistency::RowCount {
                free,
                reserved,
                held,
                rows: self.rows.rows(),
            });
        }
        Ok(())
    }

    fn verify_index(&self) -> Result<(), Inconsistency> {
        let anchored: usize = self.by_anchor.values().map(Vec::len).sum();
        if self.by_key.len() != self.checkpoints.len() || anchored != self.checkpoints.len() {
            let checkpoint = self.ids().next().unwrap_or(CheckpointId(0));
            return Err(Inconsistency::Index { checkpoint });
        }
        for (&id, node) in &self.checkpoints {
            let keyed = self.by_key.get(&node.key) == Some(&id);
            let anchored =
                (self.by_anchor.get(&node.key.anchor())).is_some_and(|ids| ids.contains(&id));
            if !keyed || !anchored {
                return Err(Inconsistency::Index { checkpoint: id });
            }
        }
        Ok(())
    }
}
