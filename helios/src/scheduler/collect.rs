//! Retrieving completions, in submission order, and applying validated
//! records to requests.

use std::time::Instant;

use super::engine::{InFlight, Row, Scheduler};
use super::error::{ExecutionError, InvalidRecord};
use super::events::{Event, FinishReason};
use super::executor::{done, Executor};
use super::ids::RequestId;
use super::request::{len32, Exit, Placed};
use super::validate::{check_records, Expectation, Outcome, Verdict};

/// What a wait for completions did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waited {
    /// Completions retrieved and applied.
    pub(super) collected: usize,
    /// Whether the wait reached its goal; false when it stopped because an
    /// event waits to be handed out (the caller returns it first).
    pub(super) done: bool,
}

impl<E: Executor> Scheduler<E> {
    /// Applies every completion that is already available.
    pub(super) fn collect_ready(&mut self) -> Result<usize, ExecutionError> {
        let mut collected = 0;
        while self.collect_next(false)? {
            collected += 1;
        }
        Ok(collected)
    }

    /// Waits for and applies every launch in flight, unless an event waits
    /// to be handed out first (see [`Waited`]).
    pub(super) fn drain(&mut self) -> Result<Waited, ExecutionError> {
        self.wait_until(0)
    }

    /// Waits until fewer than `decode_depth` launches are in flight, so a
    /// decode step may join them (a prefill iteration drains first, then may
    /// submit a chunk, a resume and a decode step, each writing records into
    /// its own ring slot).
    ///
    /// While a constrained request decodes, the depth is one: its next mask
    /// needs the token its last launch samples. Stops early, like
    /// [`Self::drain`], when an event waits to be handed out.
    pub(super) fn wait_for_room(&mut self) -> Result<Waited, ExecutionError> {
        let constrained = (self.placed.values()).any(|placed| {
            placed.request.spec.grammar.is_some() && placed.placement.exit().is_none()
        });
        let depth = if constrained {
            1
        } else {
            self.config.decode_depth
        };
        self.wait_until(depth.saturating_sub(1))
    }

    /// Waits until at most `in_flight` launches are, applying each
    /// completion; stops early, before waiting, once an event waits to be
    /// handed out.
    fn wait_until(&mut self, in_flight: usize) -> Result<Waited, ExecutionError> {
        let mut collected = 0;
        while self.window.len() > in_flight {
            if !self.events.is_empty() {
                return Ok(Waited {
                    collected,
                    done: false,
                });
            }
            self.collect_next(true)?;
            collected += 1;
        }
        Ok(Waited {
            collected,
            done: true,
        })
    }

    /// Retrieves the oldest launch's completion (waiting for it when
    /// `wait`) and applies it; false when nothing was retrieved.
    pub(super) fn collect_next(&mut self, wait: bool) -> Result<bool, ExecutionError> {
        let Some(oldest) = self.window.front() else {
            return Ok(false);
        };
        let ticket = oldest.ticket;
        let completion = if wait {
            self.executor.wait(ticket)?
        } else {
            match self.executor.poll(ticket)? {
                Some(completion) => completion,
                None => return Ok(false),
            }
        };
        let mut launch = self.window.pop_front().expect("the oldest launch exists");
        let verdict = check_records(&launch.rows, &completion.records, &self.geometry, |id| {
            self.expectation(id)
        });
        if let Some(maintenance) = launch.maintenance.take() {
            self.apply_maintenance(maintenance, completion.status);
        }
        self.apply(launch, verdict);
        Ok(true)
    }

    fn expectation(&self, id: RequestId) -> Option<Expectation> {
        let Placed { request, placement } = self.placed.get(&id)?;
        Some(Expectation {
            slot: placement.lease.slot(),
            confirmed: placement.confirmed,
            budget: placement.budget,
            last_token: request.output.last().copied(),
            ignored: matches!(placement.exit(), Some(Exit::Cancelled | Exit::Failed)),
        })
    }

    /// Applies a validated completion; only now does request state change.
    fn apply(&mut self, launch: InFlight, verdict: Verdict) {
        match verdict {
            Err(invalid) => {
                for &id in &launch.refs {
                    self.fail(id, &invalid);
                }
            }
            Ok(outcomes) => {
                for (row, outcome) in launch.rows.iter().zip(outcomes) {
                    let id = match *row {
                        Row::Chunk { id, .. }
                        | Row::Decode { id }
                        | Row::Resume { id }
                        | Row::Resample { id } => id,
                        Row::Padding => continue,
                    };
                    match outcome {
                        Ok(outcome) => self.apply_outcome(id, outcome),
                        Err(invalid) => self.fail(id, &invalid),
                    }
                }
            }
        }
        for id in launch.refs {
            if let Some(placement) = self.placement_mut(id) {
                placement.refs -= 1;
            }
        }
    }

    fn apply_outcome(&mut self, id: RequestId, outcome: Outcome) {
        match outcome {
            Outcome::Ignored | Outcome::Inactive | Outcome::Resampled => {}
            Outcome::Prefilled { consumed } => {
                self.placement_mut(id).expect("placed").confirmed.consumed = consumed;
            }
            Outcome::Sampled {
                token,
                consumed,
                generated,
                done: flag,
            } => {
                let request = &self.placed.get(&id).expect("placed").request;
                if let Some(grammar) = &request.spec.grammar {
                    if let Err(error) = grammar.advance(token) {
                        let reason = error.to_string();
                        self.fail_with(id, ExecutionError::Grammar { reason });
                        return;
                    }
                }
                let Placed { request, placement } = self.placed.get_mut(&id).expect("placed");
                let confirmed = &mut placement.confirmed;
                confirmed.consumed = consumed;
                confirmed.generated = generated;
                confirmed.done = flag;
                let first = len32(request.output.len());
                if let (0, Some(launched)) = (first, request.first_launch) {
                    let now = Instant::now();
                    let split = &mut self.first_token;
                    let since = |then: Instant| now.saturating_duration_since(then).as_secs_f64();
                    split.to_first_record.observe(since(launched));
                    if let Some(sampling) = request.sampling_launch {
                        let before = sampling.saturating_duration_since(launched);
                        split.to_sampling_launch.observe(before.as_secs_f64());
                        split.sampling_to_record.observe(since(sampling));
                    }
                }
                request.output.push(token);
                let output_tokens = first + 1;
                self.emit(
                    id,
                    Event::Tokens {
                        first,
                        tokens: vec![token],
                    },
                );
                let reason = match flag {
                    done::STOP => FinishReason::Stop,
                    done::LENGTH => FinishReason::Length,
                    _ => return,
                };
                self.end_placement(id, Exit::Finished);
                self.emit(
                    id,
                    Event::Finished {
                        reason,
                        output_tokens,
                    },
                );
            }
        }
    }

    /// Fails a request whose record is invalid, unless it already ended.
    pub(super) fn fail(&mut self, id: RequestId, invalid: &InvalidRecord) {
        self.fail_with(id, ExecutionError::InvalidRecord(invalid.clone()));
    }

    /// Fails request `id` alone with `error` (once).
    pub(super) fn fail_with(&mut self, id: RequestId, error: ExecutionError) {
        let exit = self.placement_mut(id).map(|placement| placement.exit());
        if !matches!(exit, Some(None | Some(Exit::Preempted))) {
            return;
        }
        self.end_placement(id, Exit::Failed);
        self.emit(id, Event::Failed(error));
    }
}
