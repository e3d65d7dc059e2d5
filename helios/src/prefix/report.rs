//! Counters and the two pressures, reported separately.
//!
//! The design: "Report page pressure and snapshot pressure separately.
//! Eviction may be necessary to recover either resource."

use std::collections::BTreeMap;

use super::ids::CheckpointId;
use super::store::CheckpointStore;

/// Counters since the store was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixMetrics {
    /// Lookups made for admissions ([`CheckpointStore::acquire`]).
    pub lookups: u64,
    /// Lookups that found a cached prefix.
    pub hits: u64,
    /// Prompt tokens those hits covered (not recomputed).
    pub hit_tokens: u64,
    /// Checkpoints published.
    pub published: u64,
    /// Publications of an endpoint already cached (reservation released).
    pub duplicate_publications: u64,
    /// Checkpoints published for extension only (an interior endpoint
    /// captured after the chunk that ran past it).
    pub extension_only: u64,
    /// Leaves evicted with their pages.
    pub evicted: u64,
    /// Of the evicted leaves, those evicted first under snapshot pressure
    /// because the conversation continued from their parent along another
    /// path (superseded).
    pub superseded: u64,
    /// Ancestors removed by thinning, their pages moved to their child.
    pub thinned: u64,
    /// Pages freed by evictions.
    pub evicted_pages: u64,
    /// Snapshot reservations that found no free row.
    pub snapshot_pressure: u64,
    /// Snapshot reservations refused: nothing could be retired.
    pub snapshot_refusals: u64,
    /// Page reclaims asked for.
    pub page_pressure: u64,
    /// Page reclaims that freed fewer pages than wanted.
    pub page_shortfalls: u64,
}

/// How the snapshot-row pool is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowUse {
    /// Rows in the pool.
    pub rows: u32,
    /// Rows free now.
    pub free: u32,
    /// Rows reserved by captures whose copy is in flight or unpublished.
    pub reserved: u32,
    /// Rows held by checkpoints.
    pub held: u32,
    /// Held rows that thinning or eviction could free with the present pins
    /// and uses: checkpoints neither pinned nor in use with at most one
    /// retained child subtree.
    pub reclaimable: u32,
}

/// How many KV pages the cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageUse {
    /// Pages held by checkpoint chains.
    pub held: u32,
    /// Held pages eviction could free with the present pins and uses: those
    /// of checkpoints with no pinned or in-use checkpoint in their subtree.
    pub reclaimable: u32,
}

/// Snapshot pressure and page pressure, side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// The snapshot-row pool.
    pub rows: RowUse,
    /// KV pages.
    pub pages: PageUse,
}

/// Handles lent out and not yet handed back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outstanding {
    /// Pins.
    pub pins: u32,
    /// GPU uses.
    pub uses: u32,
    /// Snapshot reservations.
    pub reservations: u32,
}

impl CheckpointStore {
    /// Both pressures now.
    pub fn pressure(&self) -> Pressure {
        let retained = self.retained_subtrees();
        let mut reclaimable_rows = 0;
        let mut reclaimable_pages = 0;
        for (id, node) in &self.checkpoints {
            if !retained[id] {
                reclaimable_pages += u32::try_from(node.segment.len()).expect("page counts");
            }
            let retained_children = node.children.iter().filter(|c| retained[c]).count();
            if !node.held() && retained_children <= 1 {
                reclaimable_rows += 1;
            }
        }
        let held_rows = u32::try_from(self.checkpoints.len()).expect("at most the rows");
        Pressure {
            rows: RowUse {
                rows: self.rows.rows(),
                free: self.rows.free_count(),
                reserved: self.rows.reserved_count(),
                held: held_rows,
                reclaimable: reclaimable_rows,
            },
            pages: PageUse {
                held: u32::try_from(self.cached_pages.len()).expect("page counts"),
                reclaimable: reclaimable_pages,
            },
        }
    }

    /// Pins, uses and reservations not yet handed back.
    pub fn outstanding(&self) -> Outstanding {
        Outstanding {
            pins: self.outstanding_pins,
            uses: self.outstanding_uses,
            reservations: self.rows.reserved_count(),
        }
    }

    /// Whether each checkpoint's subtree holds a pinned or in-use one.
    /// A parent is always older than its children (it existed when they
    /// were published; thinning only links to older ancestors), so one
    /// pass from the newest id settles every subtree.
    fn retained_subtrees(&self) -> BTreeMap<CheckpointId, bool> {
        let mut retained: BTreeMap<CheckpointId, bool> = (self.checkpoints.iter())
            .map(|(&id, node)| (id, node.held()))
            .collect();
        for (id, node) in self.checkpoints.iter().rev() {
            if retained[id] {
                if let Some(parent) = node.parent {
                    retained.insert(parent, true);
                }
            }
        }
        retained
    }
}
