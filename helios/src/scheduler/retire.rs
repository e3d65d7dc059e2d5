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
use super::request::{len32, Exit, Phase, Placement};

impl<E: Executor> Scheduler<E> {
    /// Cancellations are applied at submission boundaries only, so no
    /// launch is planned for a request cancelled halfway through planning.
    pub(super) fn apply_cancels(&mut self) {
        for id in std::mem::take(&mut self.cancels) {
            let Some(request) = self.requests.get(&id) else {
                continue;
            };
            match &request.placement {
                None => {
                    self.queue.remove(request.arrival);
                    let output_tokens = len32(request.output.len());
                    self.requests.remove(&id);
                    self.emit(
                        id,
                        Event::Finished {
                            reason: FinishReason::Cancelled,
                            output_tokens,
                        },
                    );
                }
                Some(placement) if matches!(placement.exit(), None | Some(Exit::Preempted)) => {
                    self.end_placement(id, Exit::Cancelled);
                    let output_tokens = len32(self.requests[&id].output.len());
                    self.emit(
                        id,
                        Event::Finished {
                            reason: FinishReason::Cancelled,
                            output_tokens,
                        },
                    );
                }
                Some(_) => {}
            }
        }
    }

    /// Stops launches for a placement and gives back its untaken
    /// reservation; its slot and pages wait for [`Self::retire`].
    pub(super) fn end_placement(&mut self, id: RequestId, exit: Exit) {
        let placement = (self.requests.get_mut(&id))
            .and_then(|request| request.placement.as_mut())
            .expect("ending a placed request");
        placement.phase = Phase::Exiting(exit);
        self.ledger.unreserve(&placement.lease);
    }

    /// Frees the slot and pages of every ended placement no launch in
    /// flight references; preempted requests go back to the queue. A
    /// placement with a terminal capture to make is snapshotted first (one
    /// per iteration) and retired once the snapshot completed. Returns the
    /// launches submitted.
    pub(super) fn retire(&mut self) -> Result<usize, ExecutionError> {
        let ready: Vec<RequestId> = (self.placed.values().copied())
            .filter(|&id| {
                let placement = self.requests[&id].placement.as_ref();
                placement.is_some_and(|p| p.exit().is_some() && p.refs == 0)
            })
            .collect();
        let mut submitted = 0;
        for id in ready {
            let placement = self.requests[&id].placement.as_ref().expect("placed");
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
        let request = self
            .requests
            .get_mut(&id)
            .expect("retiring a known request");
        let mut placement = request.placement.take().expect("retiring a placed request");
        debug_assert_eq!(
            placement.refs, 0,
            "retiring a placement with launches in flight"
        );
        self.placed.remove(&placement.admission);
        self.release_prefix(&mut placement);
        let preempted = placement.exit() == Some(Exit::Preempted);
        self.ledger.release(placement.lease);
        let request = self
            .requests
            .get_mut(&id)
            .expect("retiring a known request");
        if preempted {
            // Every launch of the placement has completed: its output is final
            // and the readmission derives its seed from this count.
            let generated = len32(request.output.len());
            self.queue.push(request.arrival, id);
            self.emit(id, Event::Preempted { generated });
        } else {
            self.requests.remove(&id);
        }
    }

    /// An executor failure: the device state is unknown, so every request
    /// fails and nothing is reused.
    pub(super) fn fail_everything(&mut self, error: &ExecutionError) {
        self.failure = Some(error.clone());
        let live: Vec<RequestId> = (self.requests.iter())
            .filter(|(_, request)| {
                let exit = request.placement.as_ref().and_then(Placement::exit);
                matches!(exit, None | Some(Exit::Preempted))
            })
            .map(|(&id, _)| id)
            .collect();
        for id in live {
            self.emit(id, Event::Failed(error.clone()));
        }
        self.requests.clear();
        self.queue = AdmissionQueue::default();
        self.placed.clear();
        self.window.clear();
    }
}
