//! Exact prefix checkpoints in the scheduler: lookup and restore at
//! admission, captures at the selected endpoints, publication once the copy
//! completed, release at retirement, and cache pages given back under page
//! pressure. The bookkeeping itself lives in [`crate::prefix`]; this module
//! decides when the maintenance graphs run.
//!
//! The design's rules, each enforced here:
//! - a whole-prompt hit "restores the row and runs the resume-sampling
//!   graph": admit (with the restored consumed count, so the penalty
//!   histogram is rebuilt from the whole prompt and sampling starts fresh),
//!   restore, resume; nothing already consumed is recomputed. A partial hit
//!   restores and prefills the rest;
//! - a restore installs the row into a private slot whose page table maps
//!   the checkpoint's shared complete pages and, for an unaligned endpoint,
//!   one private tail page; every later page is private;
//! - "at each required prefill endpoint, the scheduler drains submitted
//!   work, snapshots the exact live state, and publishes only after the copy
//!   fence completes": a prefill chunk ends exactly at each selected
//!   endpoint, the snapshot follows it on the stream before anything else of
//!   the request, and publication happens when its completion (status 1) is
//!   retrieved and the chunk's record confirmed the endpoint;
//! - the terminal capture freezes the consumed prefix of a finished or
//!   preempted request (its pending sampled token excluded) before its slot
//!   and pages are retired; a preempted request is readmitted from it;
//! - the request's pin moves to each checkpoint it publishes; its pages up
//!   to that endpoint become the checkpoint's and are never freed by it;
//! - under page pressure, admission and growth evict least recently used
//!   unpinned checkpoints before waiting or preempting.
//!
//! Decided here where the design is open:
//! - at most one terminal capture is submitted per iteration, so launches in
//!   flight stay within [`super::MAX_IN_FLIGHT`]; other ended placements keep
//!   their slot until their turn;
//! - a cancelled or failed request captures nothing and publishes nothing
//!   in flight: its late records are not validated, so its device state is
//!   not known to be the endpoint's;
//! - on a core whose continuation is positional KV alone (the contract's
//!   `continuation`), message endpoints do not end chunks: the K/V rows
//!   before an endpoint are final once the chunk holding them completes.
//!   After that chunk, for each selected endpoint inside it, an admit sets
//!   the slot's consumed count back to the endpoint and the snapshot graph
//!   copies its partial page; an admit back to the chunk's end follows. The
//!   row's hidden vector belongs to the chunk's end, so the checkpoint is
//!   published for extension only and never resumed from (a chat prompt
//!   always continues past a message). When the chunk ends the prompt it
//!   does not sample: the resume graph samples from its hidden vector right
//!   after it, before the captures (the first token does not wait for
//!   them), and after the admit back a resample (the resume graph again, on
//!   the same hidden vector, seed and counter) gives the decode the sampled
//!   state back; its record must repeat the sample. The prompt end and the
//!   terminal boundary stay exact.
//!   Cores with recurrent or selector state stop at every endpoint;
//! - a capture whose endpoint is already cached, or not past the request's
//!   pinned checkpoint, is skipped before any row is taken;
//! - prefill chunks end at the selected endpoints, so a request's chunk
//!   partition (and with it the low bits of its prefill) depends on its
//!   captures and hits; a restored prefix is bitwise the state its capture
//!   froze.

use std::collections::VecDeque;

use crate::prefix::{
    capture_budget, select_captures, CaptureRequest, CheckpointStore, Eviction, Hit, PageGeometry,
    Pin, PrefixChain, PrefixMetrics, Publication, Published, RestorePlan, RowLayout,
    SnapshotReservation, StoreConfig,
};

use super::engine::{Row, Scheduler};
use super::error::{ExecutionError, GeometryError, InvalidRecord, SchedulerError};
use super::executor::{Executor, Operation, Restore, Snapshot};
use super::geometry::Geometry;
use super::ids::RequestId;
use super::request::{len32, Exit, Phase, Placed, Placement};
use crate::core::proto::{BufferRole, ContinuationState};
use crate::core::ValidCore;

/// Prefix checkpoints as the core declares them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixConfig {
    /// Rows of the snapshot-row pool (the contract's `snapshot_rows`); 0
    /// disables the cache.
    pub snapshot_rows: u32,
    /// What one row holds, as the core's snapshot-row buffers declare it.
    pub layout: RowLayout,
    /// The conditioning identity that holds for the whole token stream
    /// (model, tokenizer, token layout): it salts every chain's root, so
    /// checkpoints of another core never match.
    pub salt: Vec<u8>,
    /// Whether a request's continuation state is positional KV alone, so
    /// message endpoints are captured after the chunk that holds them
    /// instead of ending chunks.
    pub positional_kv: bool,
}

impl PrefixConfig {
    /// The cache a validated core declares: its contract's snapshot rows,
    /// one row part per snapshot-row buffer (named after it, its bytes
    /// divided by the rows), salted with the core's identity (recipe,
    /// checkpoint, configuration and tokenizer fingerprints), capturing
    /// message endpoints inside chunks when its continuation is positional
    /// KV.
    pub fn from_core(core: &ValidCore) -> Result<Self, GeometryError> {
        let positional_kv = core.continuation() == ContinuationState::PositionalKv;
        let rows = core.contract().snapshot_rows;
        let invalid = |reason| GeometryError {
            field: "snapshot_rows",
            reason,
        };
        let identity = core.identity();
        let mut salt = Vec::new();
        for part in [
            &identity.recipe,
            &identity.checkpoint_fingerprint,
            &identity.config_fingerprint,
            &identity.tokenizer_fingerprint,
        ] {
            salt.extend_from_slice(&(part.len() as u64).to_le_bytes());
            salt.extend_from_slice(part.as_bytes());
        }
        if rows == 0 {
            let layout = RowLayout::new([("none", 1)]).expect("a valid placeholder");
            return Ok(Self {
                snapshot_rows: 0,
                layout,
                salt,
                positional_kv,
            });
        }
        let parts: Vec<(String, u64)> = (core.buffers().iter())
            .filter(|buffer| buffer.role == BufferRole::SnapshotRows as i32)
            .map(|buffer| {
                if buffer.shape.first() != Some(&u64::from(rows))
                    || buffer.size_bytes % u64::from(rows) != 0
                {
                    return Err(invalid(
                        "disagrees with a snapshot-row buffer's leading dimension",
                    ));
                }
                Ok((buffer.name.clone(), buffer.size_bytes / u64::from(rows)))
            })
            .collect::<Result<_, _>>()?;
        let layout = RowLayout::new(parts)
            .map_err(|_| invalid("needs snapshot-row buffers of nonzero, distinct rows"))?;
        Ok(Self {
            snapshot_rows: rows,
            layout,
            salt,
            positional_kv,
        })
    }
}

/// The scheduler's checkpoint store and its per-request capture budget.
#[derive(Debug)]
pub(super) struct Cache {
    pub(super) store: CheckpointStore,
    salt: Vec<u8>,
    budget: u32,
    positional_kv: bool,
}

impl Cache {
    /// The cache `config` declares over `geometry`'s pages; `None` when the
    /// core has no snapshot row.
    pub(super) fn new(
        config: &PrefixConfig,
        geometry: &Geometry,
    ) -> Result<Option<Self>, SchedulerError> {
        if config.snapshot_rows == 0 {
            return Ok(None);
        }
        let page = PageGeometry::new(geometry.page_size()).map_err(|_| SchedulerError::Config {
            field: "page_size",
            reason: "is 0",
        })?;
        let store = CheckpointStore::new(StoreConfig {
            geometry: page,
            rows: config.snapshot_rows,
            layout: config.layout.clone(),
        });
        Ok(Some(Self {
            store,
            salt: config.salt.clone(),
            budget: capture_budget(config.snapshot_rows, geometry.max_concurrency()),
            positional_kv: config.positional_kv,
        }))
    }

    /// The chain of a new request's prompt.
    pub(super) fn chain(&self, prompt: &[u32]) -> PrefixChain {
        PrefixChain::new(&self.salt, prompt)
    }
}

/// Counters of the prefix cache, for [`super::Metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheMetrics {
    /// Live checkpoints.
    pub checkpoints: u32,
    /// KV pages checkpoint chains hold (page pressure).
    pub pages_held: u32,
    /// Of those, pages eviction could free now.
    pub pages_reclaimable: u32,
    /// Snapshot rows in the pool.
    pub rows: u32,
    /// Snapshot rows free now (snapshot pressure).
    pub rows_free: u32,
    /// The store's counters: lookups, hit tokens, published, duplicate,
    /// evicted and thinned checkpoints, both pressures.
    pub counters: PrefixMetrics,
}

/// A placement's part in the prefix cache.
#[derive(Debug, Default)]
pub(super) struct PlacementPrefix {
    /// The checkpoint whose complete pages lead the page table: the one
    /// restored, then each one the request publishes.
    pub(super) pin: Option<Pin>,
    /// The restore still to submit after the admit.
    pub(super) restore: Option<RestorePlan>,
    /// A whole-history hit: the resume graph samples the first token.
    pub(super) resume: bool,
    /// Prefill endpoints still to capture where a chunk ends, ascending.
    pub(super) stops: VecDeque<u32>,
    /// Message endpoints still to capture after the chunk that holds them
    /// (a positional-KV core), ascending.
    pub(super) folds: VecDeque<u32>,
    /// Whether the terminal consumed prefix is still to capture.
    pub(super) terminal: bool,
    /// The snapshots in flight, in submission order.
    pub(super) captures: VecDeque<Capture>,
}

/// A snapshot submitted and not yet published.
#[derive(Debug)]
pub(super) struct Capture {
    reservation: SnapshotReservation,
    endpoint: u32,
    /// Taken after the live state ran past the endpoint (admitted back to
    /// it): published for extension only.
    extension_only: bool,
}

/// What a maintenance launch was submitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Maintenance {
    /// A capture of the request's state.
    Snapshot(RequestId),
    /// A restore into the request's slot.
    Restore(RequestId),
}

impl<E: Executor> Scheduler<E> {
    /// The longest cached prefix of `id`'s history, pinned so page reclaim
    /// cannot evict it while admission decides.
    pub(super) fn pin_reuse(&mut self, id: RequestId) -> Option<(Pin, Hit)> {
        let cache = self.cache.as_mut()?;
        let request = self.queued.get_mut(&id).expect("a queued request");
        let history = request.history_len();
        let chain = request.chain_to(history);
        let hit = cache.store.lookup(chain, history)?;
        let pin = cache.store.pin(hit.checkpoint).expect("a hit is live");
        Some((pin, hit))
    }

    /// Hands back a pin admission took and did not use.
    pub(super) fn unpin(&mut self, pin: Pin) {
        self.cache
            .as_mut()
            .expect("pinned in the cache")
            .store
            .unpin(pin);
    }

    /// Evicts least recently used unpinned checkpoints until `wanted` pages
    /// went back to the pool, or none is left; returns the pages freed.
    pub(super) fn reclaim_cache(&mut self, wanted: u32) -> u32 {
        let Some(cache) = self.cache.as_mut() else {
            return 0;
        };
        let eviction = cache.store.reclaim_pages(wanted);
        self.free_evicted(eviction)
    }

    /// Evicts cache pages for an admission `wanted` pages short, only when
    /// eviction can cover the whole shortfall: a request that would not fit
    /// anyway leaves the cache alone (it is retried every iteration).
    pub(super) fn reclaim_for_admission(&mut self, wanted: u32) -> bool {
        let Some(cache) = self.cache.as_ref() else {
            return false;
        };
        if cache.store.pressure().pages.reclaimable < wanted {
            return false;
        }
        self.reclaim_cache(wanted) >= wanted
    }

    fn free_evicted(&mut self, eviction: Eviction) -> u32 {
        // Evicted checkpoints had no pin and no GPU use: no page table maps
        // their pages and no launch in flight reads them.
        self.ledger.free_evicted(&eviction.pages);
        len32(eviction.pages.len())
    }

    /// Sets up a new placement's restore and captures: its page table
    /// starts with the hit's shared pages (the update travels with the next
    /// launch, at the latest the admit; the slot was retired with no launch
    /// in flight referencing it), the device counts start at the restored
    /// endpoint, and the capture budget selects the endpoints to snapshot.
    pub(super) fn plan_prefix(&mut self, id: RequestId, reuse: Option<(Pin, Hit)>) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        cache.store.note_lookup(reuse.as_ref().map(|(_, hit)| hit));
        let budget = cache.budget;
        let restore = reuse.as_ref().map(|(pin, _)| cache.store.restore_plan(pin));
        let Placed { request, placement } = self.placed.get_mut(&id).expect("placed");
        let reused = restore.as_ref().map_or(0, |plan| plan.consumed);
        let prompt_tokens = len32(request.spec.prompt.len());
        let messages: Vec<u32> = (request.spec.message_endpoints.iter().copied())
            .filter(|&e| e < prompt_tokens)
            .collect();
        let plan = select_captures(&CaptureRequest {
            budget,
            reused,
            prompt_tokens: placement.history,
            max_new_tokens: placement.budget,
            message_endpoints: &messages,
        });
        let prefix = &mut placement.prefix;
        if cache.positional_kv {
            prefix.folds = plan.messages.iter().copied().collect();
            prefix.stops = (plan.prompt.then_some(placement.history))
                .into_iter()
                .collect();
        } else {
            prefix.stops = plan.prefill_stops(placement.history).into();
        }
        prefix.terminal = plan.terminal;
        if let (Some((pin, _)), Some(plan)) = (reuse, restore) {
            placement.submitted_consumed = plan.consumed;
            placement.confirmed.consumed = plan.consumed;
            prefix.resume = plan.consumed == placement.history;
            prefix.pin = Some(pin);
            self.ledger
                .share(&placement.lease, plan.shared_pages.clone());
            prefix.restore = Some(plan);
        }
    }

    /// Submits the restore a placement is waiting for (after its admit),
    /// then the resume of a whole-history hit; returns the launches.
    pub(super) fn submit_restore(&mut self, id: RequestId) -> Result<usize, ExecutionError> {
        let placement = &mut self.placed.get_mut(&id).expect("placed").placement;
        if placement.phase != Phase::Restoring {
            return Ok(0);
        }
        let plan = (placement.prefix.restore.take()).expect("a restoring placement has its plan");
        let slot = placement.lease.slot();
        if plan.needs_private_tail() {
            // The admission reservation covers the tail page.
            let tail = self.ledger.shared(&placement.lease) + 1;
            self.take_pages(id, tail);
        }
        let restore = Restore {
            slot,
            row: plan.row,
            expect: plan.consumed,
        };
        let maintenance = Some(Maintenance::Restore(id));
        self.launch(
            Operation::Restore(restore),
            Vec::new(),
            vec![id],
            maintenance,
        )?;
        let placement = self.placement_mut(id).expect("placed");
        if !std::mem::take(&mut placement.prefix.resume) {
            placement.phase = Phase::Prefilling;
            return Ok(1);
        }
        placement.phase = Phase::Decoding;
        placement.submitted_samples += 1;
        let mask = self.next_mask(id);
        Ok(1 + self.submit_resume(id, Row::Resume { id }, mask)?)
    }

    /// After a prefill chunk ending at `end`: snapshots the state there when
    /// `end` is a selected endpoint.
    pub(super) fn capture_at_stop(
        &mut self,
        id: RequestId,
        end: u32,
    ) -> Result<usize, ExecutionError> {
        let prefix = &mut self.placement_mut(id).expect("placed").prefix;
        if prefix.stops.front() != Some(&end) {
            return Ok(0);
        }
        prefix.stops.pop_front();
        self.capture(id, end, false)
    }

    /// The message endpoints to capture after a chunk `start..end`: those
    /// inside it, ascending (a positional-KV core; none otherwise).
    pub(super) fn folds_in(&self, id: RequestId, start: u32, end: u32) -> Vec<u32> {
        let prefix = &self.placed[&id].placement.prefix;
        (prefix.folds.iter().copied())
            .take_while(|&e| e <= end)
            .filter(|&e| e > start)
            .collect()
    }

    /// After a chunk ending at `end` (its record not yet retrieved), the
    /// captures of the message endpoints inside it: per endpoint an admit
    /// back to it and a snapshot (extension only), then the admit back to
    /// `end`; an endpoint at `end` itself is captured exactly. An endpoint
    /// already cached is skipped; when no row can be had, the rest of the
    /// chunk's endpoints are. Returns the launches submitted and whether
    /// the slot was admitted again (what it sampled is gone).
    pub(super) fn capture_folds(
        &mut self,
        id: RequestId,
        end: u32,
    ) -> Result<(usize, bool), ExecutionError> {
        let mut submitted = 0;
        // Whether the slot's consumed count was set back from `end`.
        let mut moved = false;
        // Whether it was admitted again at all.
        let mut readmitted = false;
        let folds = self.folds_in(id, 0, end);
        let prefix = &mut self.placement_mut(id).expect("placed").prefix;
        prefix.folds.drain(..folds.len());
        for endpoint in folds {
            if self.cached(id, endpoint) {
                continue;
            }
            if endpoint == end {
                if std::mem::take(&mut moved) {
                    submitted += self.admit_back(id, end)?;
                }
                submitted += self.capture(id, end, false)?;
            } else {
                let Some(grant) = self.reserve_row() else {
                    break;
                };
                submitted += self.admit_back(id, endpoint)?;
                submitted += self.submit_snapshot(id, grant, endpoint, true)?;
                (moved, readmitted) = (true, true);
            }
        }
        if moved {
            submitted += self.admit_back(id, end)?;
        }
        Ok((submitted, readmitted))
    }

    /// Admits `id` again with `consumed` tokens in its slot (a capture
    /// inside a chunk); one launch.
    fn admit_back(&mut self, id: RequestId, consumed: u32) -> Result<usize, ExecutionError> {
        let admit = Operation::Admit(self.admit_at(id, consumed));
        self.launch(admit, Vec::new(), vec![id], None)?;
        Ok(1)
    }

    /// Whether the endpoint of `id`'s history at `endpoint` is already
    /// cached (its capture would be a duplicate).
    fn cached(&mut self, id: RequestId, endpoint: u32) -> bool {
        let request = &mut self.placed.get_mut(&id).expect("placed").request;
        let key = request
            .chain_to(endpoint)
            .endpoint_key(endpoint)
            .expect("within the chain");
        let cache = self.cache.as_ref().expect("a capture needs the cache");
        cache.store.find(&key).is_some()
    }

    /// Whether a placement that ended still has its terminal capture to
    /// make (it is finished or preempted, so its counts are confirmed).
    pub(super) fn wants_terminal(&self, placement: &Placement) -> bool {
        self.cache.is_some()
            && placement.prefix.terminal
            && matches!(placement.exit(), Some(Exit::Finished | Exit::Preempted))
    }

    /// Submits the terminal capture of an ended placement with no launch in
    /// flight; false when there is nothing new to capture or no row.
    pub(super) fn capture_terminal(&mut self, id: RequestId) -> Result<bool, ExecutionError> {
        let Placed { request, placement } = self.placed.get_mut(&id).expect("placed");
        placement.prefix.terminal = false;
        let endpoint = placement.confirmed.consumed;
        let cache = self
            .cache
            .as_ref()
            .expect("a terminal capture needs the cache");
        let parent = (placement.prefix.pin.as_ref())
            .and_then(|pin| cache.store.checkpoint(pin.checkpoint()))
            .map_or(0, |info| info.tokens());
        if endpoint <= parent {
            return Ok(false);
        }
        let chain = request.chain_to(endpoint);
        let key = chain.endpoint_key(endpoint).expect("within the chain");
        if cache.store.find(&key).is_some() {
            return Ok(false);
        }
        Ok(self.capture(id, endpoint, false)? == 1)
    }

    /// Reserves a row, evicting or thinning under snapshot pressure; `None`
    /// when none can be had.
    fn reserve_row(&mut self) -> Option<SnapshotReservation> {
        let cache = self.cache.as_mut().expect("a capture needs the cache");
        let grant = cache.store.reserve_snapshot().ok()?;
        self.free_evicted(grant.eviction);
        Some(grant.reservation)
    }

    /// Reserves a row and submits the snapshot of `id`'s live state, at
    /// `endpoint`; 0 launches when no row can be had.
    fn capture(
        &mut self,
        id: RequestId,
        endpoint: u32,
        extension_only: bool,
    ) -> Result<usize, ExecutionError> {
        let Some(reservation) = self.reserve_row() else {
            return Ok(0);
        };
        self.submit_snapshot(id, reservation, endpoint, extension_only)
    }

    /// Submits the snapshot of `id`'s live state, at `endpoint`, into the
    /// reserved row.
    fn submit_snapshot(
        &mut self,
        id: RequestId,
        reservation: SnapshotReservation,
        endpoint: u32,
        extension_only: bool,
    ) -> Result<usize, ExecutionError> {
        let row = reservation.row();
        let placement = self.placement_mut(id).expect("placed");
        placement.prefix.captures.push_back(Capture {
            reservation,
            endpoint,
            extension_only,
        });
        let snapshot = Snapshot {
            slot: placement.lease.slot(),
            row,
        };
        let maintenance = Some(Maintenance::Snapshot(id));
        self.launch(
            Operation::Snapshot(snapshot),
            Vec::new(),
            vec![id],
            maintenance,
        )?;
        Ok(1)
    }

    /// Applies a completed snapshot or restore.
    pub(super) fn apply_maintenance(&mut self, maintenance: Maintenance, status: Option<i32>) {
        let failed = |operation| InvalidRecord::Maintenance { operation, status };
        match maintenance {
            Maintenance::Restore(id) => {
                if status != Some(1) {
                    self.fail(id, &failed("restore"));
                }
            }
            Maintenance::Snapshot(id) => {
                let capture = (self.placement_mut(id))
                    .and_then(|placement| placement.prefix.captures.pop_front())
                    .expect("a snapshot in flight has its capture");
                if status != Some(1) {
                    self.release_capture(capture);
                    self.fail(id, &failed("snapshot"));
                    return;
                }
                self.publish(id, capture);
            }
        }
    }

    fn release_capture(&mut self, capture: Capture) {
        let cache = self.cache.as_mut().expect("captured in the cache");
        cache.store.release_reservation(capture.reservation);
    }

    /// Publishes a completed capture when the request's confirmed progress
    /// is the captured endpoint, or for an extension-only capture has
    /// passed it (the chunk holding it completed); a cancelled or failed
    /// request's records are not trusted, so its capture is dropped.
    fn publish(&mut self, id: RequestId, capture: Capture) {
        let page_size = self.geometry.page_size();
        let Placed { request, placement } = self.placed.get_mut(&id).expect("placed");
        let trusted = matches!(
            placement.exit(),
            None | Some(Exit::Finished | Exit::Preempted)
        );
        let cache = self.cache.as_mut().expect("captured in the cache");
        let confirmed = placement.confirmed.consumed;
        let reached = if capture.extension_only {
            confirmed > capture.endpoint
        } else {
            confirmed == capture.endpoint
        };
        if !trusted || !reached {
            cache.store.release_reservation(capture.reservation);
            return;
        }
        let complete = capture.endpoint / page_size;
        let shared = self.ledger.shared(&placement.lease);
        let pages =
            self.ledger.pages(&placement.lease)[shared as usize..complete as usize].to_vec();
        let chain = request
            .chain
            .as_ref()
            .expect("a cached scheduler chains requests");
        let publication = Publication {
            reservation: capture.reservation,
            parent: placement.prefix.pin.take(),
            endpoint: capture.endpoint,
            extension_only: capture.extension_only,
            pages,
        };
        match cache.store.publish(chain, publication) {
            Ok(Published::New(pin)) => {
                placement.prefix.pin = Some(pin);
                self.ledger.mark_shared(&placement.lease, complete);
            }
            Ok(Published::Duplicate { parent, .. }) => placement.prefix.pin = parent,
            Err(rejected) => {
                debug_assert!(
                    false,
                    "the scheduler's publication was rejected: {rejected:?}"
                );
                let publication = rejected.publication;
                placement.prefix.pin = publication.parent;
                cache.store.release_reservation(publication.reservation);
            }
        }
    }

    /// A retiring placement's cache handles go back: its pin, and a capture
    /// that never completed (its pages go back through the ledger).
    pub(super) fn release_prefix(&mut self, placement: &mut Placement) {
        let prefix = std::mem::take(&mut placement.prefix);
        if let Some(cache) = self.cache.as_mut() {
            if let Some(pin) = prefix.pin {
                cache.store.unpin(pin);
            }
            for capture in prefix.captures {
                cache.store.release_reservation(capture.reservation);
            }
        }
    }

    /// The cache's counters, when it is enabled.
    pub(super) fn cache_metrics(&self) -> Option<CacheMetrics> {
        let store = &self.cache.as_ref()?.store;
        let pressure = store.pressure();
        Some(CacheMetrics {
            checkpoints: len32(store.len()),
            pages_held: pressure.pages.held,
            pages_reclaimable: pressure.pages.reclaimable,
            rows: pressure.rows.rows,
            rows_free: pressure.rows.free,
            counters: store.metrics(),
        })
    }

    /// The store, for inspection (tests, reports).
    pub fn checkpoints(&self) -> Option<&CheckpointStore> {
        self.cache.as_ref().map(|cache| &cache.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::sample::tiny_core;

    #[test]
    fn the_cache_follows_the_cores_snapshot_row_buffers_and_identity() {
        let core = tiny_core();
        let rows_buffer = (core.buffers.iter())
            .find(|b| b.role == BufferRole::SnapshotRows as i32)
            .unwrap()
            .clone();
        let config = PrefixConfig::from_core(&ValidCore::new(core.clone()).unwrap()).unwrap();
        assert_eq!(config.snapshot_rows, 2);
        let parts: Vec<(&str, u64)> = (config.layout.parts().iter())
            .map(|part| (part.name.as_str(), part.bytes))
            .collect();
        assert_eq!(
            parts,
            [(rows_buffer.name.as_str(), rows_buffer.size_bytes / 2)]
        );

        let mut other = core.clone();
        other
            .identity
            .as_mut()
            .unwrap()
            .tokenizer_fingerprint
            .push('x');
        let other = PrefixConfig::from_core(&ValidCore::new(other).unwrap()).unwrap();
        assert_ne!(other.salt, config.salt);

        let mut disagreeing = core.clone();
        disagreeing.contract.as_mut().unwrap().snapshot_rows = 3;
        // Core validation does not relate the rows to the buffers; the
        // cache does.
        let valid = ValidCore::new(disagreeing).unwrap();
        let error = PrefixConfig::from_core(&valid).unwrap_err();
        assert_eq!(error.field, "snapshot_rows");

        let mut none = core;
        none.contract.as_mut().unwrap().snapshot_rows = 0;
        let none = PrefixConfig::from_core(&ValidCore::new(none).unwrap()).unwrap();
        assert_eq!(none.snapshot_rows, 0);
    }
}
