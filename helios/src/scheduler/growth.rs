//! Page growth ahead of decode, and preemption when a running request
//! cannot continue.
//!
//! Before each decode step a request must have the page its step writes in
//! its page table (mandatory), and it tries to hold one more page as a
//! reservation (one page ahead). When the mandatory page cannot come from
//! free pages: if pages of ended placements are about to be freed (their
//! launches are still in flight) the request skips this step; otherwise the
//! newest eligible decoder (possibly the request itself) is preempted, and
//! the request tries again.

use super::engine::Scheduler;
use super::executor::Executor;
use super::ids::RequestId;
use super::request::{len32, max_pages, Exit, Placement};

/// What growing a decoder's pages achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Growth {
    /// The page its next decode writes is in its page table.
    Ready,
    /// It waits a step for pages that launches in flight still reference.
    Stalled,
    /// It was preempted itself.
    Preempted,
}

impl<E: Executor> Scheduler<E> {
    /// Pages a live placement should hold before its next decode: the page
    /// it writes and one ahead, never more than it can ever use.
    fn target_pages(&self, placement: &Placement) -> u32 {
        let write = placement.submitted_consumed.max(placement.history);
        let ceiling = max_pages(&self.geometry, placement.history, placement.budget);
        (self.geometry.pages_for(write + 1) + 1).min(ceiling)
    }

    /// Pages live placements lack to be one page ahead.
    pub(super) fn growth_debt(&self) -> u32 {
        self.live_placements()
            .map(|placement| {
                self.target_pages(placement)
                    .saturating_sub(self.ledger.held(&placement.lease))
            })
            .sum()
    }

    fn live_placements(&self) -> impl Iterator<Item = &Placement> {
        (self.by_admission.values())
            .map(|id| &self.placed[id].placement)
            .filter(|placement| placement.exit().is_none())
    }

    /// Private pages of ended placements that wait for their launches in
    /// flight (or a terminal capture, which may keep their complete pages
    /// cached).
    fn releasing_pages(&self) -> u32 {
        (self.placed.values())
            .map(|placed| &placed.placement)
            .filter(|placement| placement.exit().is_some())
            .map(|placement| self.ledger.private(&placement.lease))
            .sum()
    }

    /// Makes the page of `id`'s next decode write available, preempting if
    /// nothing else can free one.
    pub(super) fn grow(&mut self, id: RequestId) -> Growth {
        loop {
            let placement = &self.placed[&id].placement;
            let lease = &placement.lease;
            let needed = self.geometry.pages_for(placement.submitted_consumed + 1);
            let missing = needed.saturating_sub(len32(self.ledger.pages(lease).len()));
            let from_pool = missing.saturating_sub(self.ledger.reserved_by(lease));
            if from_pool <= self.ledger.available() {
                let target = self.target_pages(placement);
                self.ledger.reserve(lease, from_pool);
                self.ledger.take(lease, needed);
                let held = self.ledger.held(lease);
                let ahead = target.saturating_sub(held).min(self.ledger.available());
                self.ledger.reserve(lease, ahead);
                return Growth::Ready;
            }
            if from_pool <= self.ledger.available() + self.releasing_pages() {
                return Growth::Stalled;
            }
            if self.reclaim_cache(from_pool - self.ledger.available()) > 0 {
                continue;
            }
            let victim = (self.by_admission.values().rev().copied())
                .find(|victim| self.placed[victim].placement.decodes())
                .expect("the growing request is an eligible decoder");
            self.preempt(victim);
            if victim == id {
                return Growth::Preempted;
            }
        }
    }

    /// Moves reserved pages into `id`'s page table until it has `upto`.
    pub(super) fn take_pages(&mut self, id: RequestId, upto: u32) {
        let placement = &self.placed[&id].placement;
        self.ledger.take(&placement.lease, upto);
    }

    /// Preempts a decoder: no further launches; once none in flight
    /// references its slot, its slot and pages are freed and it is queued
    /// again with its history and remaining budget.
    fn preempt(&mut self, id: RequestId) {
        self.end_placement(id, Exit::Preempted);
        self.preemptions += 1;
        let placement = &self.placed[&id].placement;
        // A terminal capture waits for the next submission boundary.
        if placement.refs == 0 && !self.wants_terminal(placement) {
            self.retire_one(id);
        }
    }
}
