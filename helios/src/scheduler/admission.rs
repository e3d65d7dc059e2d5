//! FIFO admission subject to slot and page reservations.
//!
//! Fairness rule: the queue is scanned in arrival order (a preempted request
//! keeps its original arrival, so it is reconsidered before everything that
//! arrived after it). A request whose reservation does not fit is skipped and
//! smaller requests behind it may be admitted, but each admission past it
//! counts as one bypass; once a request has been bypassed `max_bypass` times
//! it blocks the queue, so nothing behind it is admitted until it is. Its
//! reservation never exceeds the pool (checked at submission), and running
//! requests finish or are preempted, so it is admitted within bounded time:
//! no request starves.
//!
//! With the prefix cache, a request reserves only the pages past its longest
//! cached prefix's complete pages (the hit is pinned while admission
//! decides), and a reservation that does not fit first evicts least
//! recently used unpinned checkpoints.

use std::collections::BTreeMap;

use super::engine::Scheduler;
use super::events::{Event, FinishReason};
use super::executor::Executor;
use super::ids::RequestId;
use super::request::{admission_pages, len32, Placed, Placement};
use crate::prefix::{Hit, Pin};

/// Requests waiting for admission, by arrival.
#[derive(Debug, Default)]
pub(super) struct AdmissionQueue {
    entries: BTreeMap<u64, Waiting>,
}

#[derive(Debug)]
struct Waiting {
    id: RequestId,
    /// Requests admitted ahead of this one while it did not fit.
    bypassed: u32,
}

impl AdmissionQueue {
    pub(super) fn push(&mut self, arrival: u64, id: RequestId) {
        self.entries.insert(arrival, Waiting { id, bypassed: 0 });
    }

    pub(super) fn remove(&mut self, arrival: u64) {
        self.entries.remove(&arrival);
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn order(&self) -> Vec<(u64, RequestId)> {
        (self.entries.iter())
            .map(|(&arrival, waiting)| (arrival, waiting.id))
            .collect()
    }

    fn bypassed(&self, arrival: u64) -> u32 {
        self.entries
            .get(&arrival)
            .map_or(0, |waiting| waiting.bypassed)
    }

    fn bypass(&mut self, arrival: u64) {
        if let Some(waiting) = self.entries.get_mut(&arrival) {
            waiting.bypassed += 1;
        }
    }
}

impl<E: Executor> Scheduler<E> {
    /// Admits queued requests in arrival order under the fairness rule.
    pub(super) fn admit_queued(&mut self) {
        let mut skipped = Vec::new();
        for (arrival, id) in self.queue.order() {
            if !self.ledger.has_free_slot() {
                break;
            }
            let request = &self.queued[&id];
            let (history, budget) = (request.history_len(), request.remaining_budget());
            let required = admission_pages(&self.geometry, history, budget);
            if budget == 0 || required > self.geometry.usable_pages() {
                // Only a readmission gets here: its history outgrew the pool,
                // so it ends at the length it reached.
                self.queue.remove(arrival);
                let output_tokens = len32(request.output.len());
                self.queued.remove(&id);
                let reason = FinishReason::Length;
                self.emit(
                    id,
                    Event::Finished {
                        reason,
                        output_tokens,
                    },
                );
                continue;
            }
            let reuse = self.pin_reuse(id);
            let shared =
                reuse.as_ref().map_or(0, |(_, hit)| hit.tokens()) / self.geometry.page_size();
            let required = required - shared;
            let room = self.admission_room();
            if required > room && !self.reclaim_for_admission(required - room) {
                if let Some((pin, _)) = reuse {
                    self.unpin(pin);
                }
                if self.queue.bypassed(arrival) >= self.config.max_bypass {
                    break;
                }
                skipped.push(arrival);
                continue;
            }
            self.queue.remove(arrival);
            self.place(id, history, budget, required, reuse);
            for &earlier in &skipped {
                self.queue.bypass(earlier);
            }
            let limit = self.config.max_bypass;
            if skipped
                .iter()
                .any(|&earlier| self.queue.bypassed(earlier) >= limit)
            {
                break;
            }
        }
    }

    /// Free pages admission may reserve: what running requests still need
    /// to stay one page ahead is kept back, so admission waits while pages
    /// are short instead of forcing a preemption.
    fn admission_room(&self) -> u32 {
        self.ledger.available().saturating_sub(self.growth_debt())
    }

    /// Gives a queued request a slot, its reservation and its prefix hit.
    fn place(
        &mut self,
        id: RequestId,
        history: u32,
        budget: u32,
        reserved: u32,
        reuse: Option<(Pin, Hit)>,
    ) {
        let lease = self.ledger.lease(reserved);
        let admission = self.next_admission;
        self.next_admission += 1;
        let mut request = self.queued.remove(&id).expect("admitting a queued request");
        let placement = Placement::new(lease, admission, history, budget);
        let first = !std::mem::replace(&mut request.admitted, true);
        self.placed.insert(id, Placed { request, placement });
        self.by_admission.insert(admission, id);
        let cached_tokens = reuse.as_ref().map_or(0, |(_, hit)| hit.tokens());
        self.plan_prefix(id, reuse);
        if first {
            self.emit(id, Event::Admitted { cached_tokens });
        }
    }
}
