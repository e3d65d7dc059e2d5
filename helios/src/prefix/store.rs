//! The checkpoint store: content-addressed checkpoints over parent-linked
//! page chains, their rows, pins and GPU uses.
//!
//! One owner (the model thread) holds the store; it lends [`Pin`]s,
//! [`GpuUse`]s and [`SnapshotReservation`]s that are handed back once each.
//! Publication is in `publication.rs`, eviction and thinning in
//! `eviction.rs`, reports in `report.rs`, the invariants in `verify.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::scheduler::Page;

use super::checkpoint::{Checkpoint, CheckpointInfo};
use super::error::PrefixError;
use super::geometry::PageGeometry;
use super::identity::{BlockKey, EndpointKey, PrefixChain};
use super::ids::{CheckpointId, GpuUse, Hit, Pin, SnapshotReservation, SnapshotRow};
use super::layout::RowLayout;
use super::report::PrefixMetrics;
use super::rows::RowPool;

/// What the store is built from: the model's declared geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Physical tokens per page.
    pub geometry: PageGeometry,
    /// Rows of the snapshot-row pool (the contract's `snapshot_rows`).
    pub rows: u32,
    /// What one row holds.
    pub layout: RowLayout,
}

/// A checkpoint's state as a restore needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// The row the restore graph reads.
    pub row: SnapshotRow,
    /// The consumed count the row holds (the restore's expected count).
    pub consumed: u32,
    /// Its complete pages in logical order: the first entries of the
    /// restored slot's page table, shared and never written.
    pub shared_pages: Vec<Page>,
    /// Tokens the restore copies into a private tail page at logical page
    /// `shared_pages.len()`; 0 at an aligned endpoint, where maintenance
    /// writes no page.
    pub tail_tokens: u32,
}

impl RestorePlan {
    /// Whether the restoring slot needs a private page for the tail.
    pub fn needs_private_tail(&self) -> bool {
        self.tail_tokens > 0
    }
}

/// Content-addressed checkpoints at exact endpoints. Equal endpoints share
/// one checkpoint.
#[derive(Debug)]
pub struct CheckpointStore {
    pub(super) geometry: PageGeometry,
    pub(super) layout: RowLayout,
    pub(super) rows: RowPool,
    pub(super) checkpoints: BTreeMap<CheckpointId, Checkpoint>,
    pub(super) by_key: HashMap<EndpointKey, CheckpointId>,
    /// Checkpoints by the chain key of their complete 64-token blocks.
    pub(super) by_anchor: HashMap<BlockKey, Vec<CheckpointId>>,
    /// Every page some checkpoint's segment holds.
    pub(super) cached_pages: HashSet<Page>,
    pub(super) next_id: u64,
    pub(super) clock: u64,
    pub(super) outstanding_pins: u32,
    pub(super) outstanding_uses: u32,
    pub(super) metrics: PrefixMetrics,
}

impl CheckpointStore {
    /// An empty store over `config.rows` snapshot rows.
    pub fn new(config: StoreConfig) -> Self {
        Self {
            geometry: config.geometry,
            layout: config.layout,
            rows: RowPool::new(config.rows),
            checkpoints: BTreeMap::new(),
            by_key: HashMap::new(),
            by_anchor: HashMap::new(),
            cached_pages: HashSet::new(),
            next_id: 1,
            clock: 0,
            outstanding_pins: 0,
            outstanding_uses: 0,
            metrics: PrefixMetrics::default(),
        }
    }

    /// The page geometry.
    pub fn geometry(&self) -> PageGeometry {
        self.geometry
    }

    /// The declared row layout.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// Live checkpoints.
    pub fn len(&self) -> usize {
        self.checkpoints.len()
    }

    /// Whether no checkpoint is cached.
    pub fn is_empty(&self) -> bool {
        self.checkpoints.is_empty()
    }

    /// Live checkpoint ids, oldest first.
    pub fn ids(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.checkpoints.keys().copied()
    }

    /// One checkpoint's bookkeeping.
    pub fn checkpoint(&self, id: CheckpointId) -> Option<CheckpointInfo> {
        self.checkpoints.get(&id).map(|node| node.info(id))
    }

    /// The checkpoint at exactly this endpoint, if cached.
    pub fn find(&self, key: &EndpointKey) -> Option<CheckpointId> {
        self.by_key.get(key).copied()
    }

    /// The longest cached prefix of `chain` of at most `limit` tokens, with
    /// no side effect (admission planning). A hit of exactly `limit` tokens
    /// resumes sampling from the row's hidden vector, so an extension-only
    /// checkpoint counts only below the limit.
    pub fn lookup(&self, chain: &PrefixChain, limit: u32) -> Option<Hit> {
        chain
            .longest_cached(limit, |anchor| {
                (self.by_anchor.get(anchor).into_iter().flatten())
                    .map(|id| (&self.checkpoints[id], *id))
                    .filter(|(node, _)| !node.extension_only || node.tokens() < limit)
                    .map(|(node, id)| (node.key, id))
            })
            .map(|(key, checkpoint)| Hit { checkpoint, key })
    }

    /// Looks up the longest cached prefix and pins it for a request that
    /// will restore it; counts the hit tokens. A whole-prompt hit
    /// (`tokens == limit`) resumes sampling from the row's hidden vector.
    pub fn acquire(&mut self, chain: &PrefixChain, limit: u32) -> Option<(Pin, Hit)> {
        let hit = self.lookup(chain, limit);
        self.note_lookup(hit.as_ref());
        let hit = hit?;
        let pin = self
            .pin(hit.checkpoint)
            .expect("a hit is a live checkpoint");
        Some((pin, hit))
    }

    /// Counts one admission's lookup and the tokens its hit covered, for a
    /// caller that looked up and pinned in separate steps (the scheduler
    /// pins a hit before it knows whether the request fits, and counts it
    /// once it is admitted).
    pub fn note_lookup(&mut self, hit: Option<&Hit>) {
        self.metrics.lookups += 1;
        if let Some(hit) = hit {
            self.metrics.hits += 1;
            self.metrics.hit_tokens += u64::from(hit.tokens());
        }
    }

    /// Pins a live checkpoint: it keeps its snapshot and pages until the
    /// pin is handed back.
    pub fn pin(&mut self, id: CheckpointId) -> Result<Pin, PrefixError> {
        let now = self.tick();
        let node = (self.checkpoints.get_mut(&id)).ok_or(PrefixError::UnknownCheckpoint(id))?;
        node.pins += 1;
        node.last_use = now;
        self.outstanding_pins += 1;
        Ok(Pin { id })
    }

    /// Ends a logical reference. GPU work still reading the checkpoint must
    /// hold a [`GpuUse`] (taken before unpinning) until it completes.
    pub fn unpin(&mut self, pin: Pin) {
        let now = self.tick();
        let node = self.node_mut(pin.id);
        node.pins -= 1;
        node.last_use = now;
        self.outstanding_pins -= 1;
    }

    /// Starts a GPU operation reading the pinned checkpoint's row or pages
    /// (a restore, or launches that outlive the pin). Until it ends the
    /// checkpoint cannot be retired, even unpinned.
    pub fn begin_use(&mut self, pin: &Pin) -> GpuUse {
        self.node_mut(pin.id).uses += 1;
        self.outstanding_uses += 1;
        GpuUse { id: pin.id }
    }

    /// The GPU operation completed.
    pub fn end_use(&mut self, gpu_use: GpuUse) {
        self.node_mut(gpu_use.id).uses -= 1;
        self.outstanding_uses -= 1;
    }

    /// What restoring the pinned checkpoint into a slot involves.
    pub fn restore_plan(&self, pin: &Pin) -> RestorePlan {
        let node = &self.checkpoints[&pin.id];
        RestorePlan {
            checkpoint: pin.id,
            row: node.row,
            consumed: node.tokens(),
            shared_pages: self.chain_pages(pin.id),
            tail_tokens: self.geometry.tail_tokens(node.tokens()),
        }
    }

    /// The complete pages of a checkpoint's chain in logical order.
    ///
    /// # Panics
    /// When `id` is not live.
    pub fn chain_pages(&self, id: CheckpointId) -> Vec<Page> {
        let mut segments = Vec::new();
        let mut at = Some(id);
        while let Some(id) = at {
            let node = &self.checkpoints[&id];
            segments.push(&node.segment);
            at = node.parent;
        }
        segments.into_iter().rev().flatten().copied().collect()
    }

    /// Counters since the store was built.
    pub fn metrics(&self) -> PrefixMetrics {
        self.metrics
    }

    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub(super) fn node_mut(&mut self, id: CheckpointId) -> &mut Checkpoint {
        self.checkpoints
            .get_mut(&id)
            .expect("a pinned or used checkpoint is live")
    }

    pub(super) fn index(&mut self, id: CheckpointId) {
        let key = self.checkpoints[&id].key;
        self.by_key.insert(key, id);
        self.by_anchor.entry(key.anchor()).or_default().push(id);
    }

    pub(super) fn unindex(&mut self, id: CheckpointId, key: &EndpointKey) {
        self.by_key.remove(key);
        let anchored = (self.by_anchor.get_mut(&key.anchor())).expect("indexed by its anchor");
        anchored.retain(|&other| other != id);
        if anchored.is_empty() {
            self.by_anchor.remove(&key.anchor());
        }
    }

    /// Hands back a reservation no copy can still write (cancelled capture,
    /// shutdown).
    pub fn release_reservation(&mut self, reservation: SnapshotReservation) {
        self.rows.unreserve(reservation.row);
    }
}
