//! The end of a placement: cancellation, retirement of slots and pages, and
//! executor failure.
//!
//! A placement that finishes, fails, is cancelled or preempted stops taking
//! launches at once and gives back its unused reservation; its slot and
//! pages are freed only at a submission boundary where no launch in flight
//! references them.

use super::admission::AdmissionQueue;
use super::engine::Scheduler;
use super::error::ExecutionError;
use super::events::{Event, FinishReason};
use super::executor::Executor;
use super::ids::RequestId;
use super::request::{len32, Exit, Phase, Placed};

impl<E: Executor> Scheduler<E> {
    /// Cancellations are applied at submission boundaries only, so no
    /// launch is planned for a request cancelled halfway through planning.
    pub(super) fn apply_cancels(&mut self) {
        for id in std::mem::take(&mut self.cancels) {
            let output_tokens = if let Some(request) = self.queued.remove(&id) {
                self.queue.remove(request.arrival);
                len32(request.output.len())
            } else if let Some(placed) = (self.placed.get(&id))
                .filter(|placed| matches!(placed.placement.exit(), None | Some(Exit::Preempted)))
            {
                let output_tokens = len32(placed.request.output.len());
                self.end_placement(id, Exit::Cancelled);
                output_tokens
            } else {
                // Unknown, finished, failed or already cancelled.
                continue;
            };
            let reason = FinishReason::Cancelled;
            self.emit(
                id,
                Event::Finished {
                    reason,
                    output_tokens,
                },
            );
        }
    }

    /// Stops launches for a placement and gives back its untaken
    /// reservation; its slot and pages wait for [`Self::retire`].
    pub(super) fn end_placement(&mut self, id: RequestId, exit: Exit) {
        let placement = &mut self
            .placed
            .get_mut(&id)
            .expect("ending a placed request")
            .placement;
        placement.phase = Phase::Exiting(exit);
        self.ledger.unreserve(&placement.lease);
    }

    /// Frees the slot and pages of every ended placement no launch in
    /// flight references; preempted requests go back to the queue. A
    /// placement with a terminal capture to make is snapshotted first (one
    /// per iteration) and retired once the snapshot completed. Returns the
    /// launches submitted.
    pub(super) fn retire(&mut self) -> Result<usize, ExecutionError> {
        let ready: Vec<RequestId> = (self.by_admission.values().copied())
            .filter(|id| {
                let placement = &self.placed[id].placement;
                placement.exit().is_some() && placement.refs == 0
            })
            .collect();
        let mut submitted = 0;
        for id in ready {
            let placement = &self.placed[&id].placement;
            if self.wants_terminal(placement) {
                if submitted > 0 {
                    continue;
                }
                if self.capture_terminal(id)? {
                    submitted += 1;
                    continue;
                }
            }
            self.retire_one(id);
        }
        Ok(submitted)
    }

    /// Retires one ended placement with no launch in flight.
    pub(super) fn retire_one(&mut self, id: RequestId) {
        let Placed {
            request,
            mut placement,
        } = self.placed.remove(&id).expect("retiring a placed request");
        debug_assert_eq!(
            placement.refs, 0,
            "retiring a placement with launches in flight"
        );
        self.by_admission.remove(&placement.admission);
        self.release_prefix(&mut placement);
        let preempted = placement.exit() == Some(Exit::Preempted);
        self.ledger.release(placement.lease);
        if preempted {
            // Every launch of the placement has completed: its output is final
            // and the readmission derives its seed from this count.
            let generated = len32(request.output.len());
            self.queue.push(request.arrival, id);
            self.queued.insert(id, request);
            self.emit(id, Event::Preempted { generated });
        }
    }

    /// An executor failure: the device state is unknown, so every request
    /// fails and nothing is reused.
    pub(super) fn fail_everything(&mut self, error: &ExecutionError) {
        self.failure = Some(error.clone());
        let placed_live = (self.placed.iter())
            .filter(|(_, placed)| matches!(placed.placement.exit(), None | Some(Exit::Preempted)))
            .map(|(&id, _)| id);
        let mut live: Vec<RequestId> = self.queued.keys().copied().chain(placed_live).collect();
        live.sort_unstable();
        for id in live {
            self.emit(id, Event::Failed(error.clone()));
        }
        self.queued.clear();
        self.queue = AdmissionQueue::default();
        self.placed.clear();
        self.by_admission.clear();
        self.window.clear();
    }
}
