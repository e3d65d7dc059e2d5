//! Collects a scheduler's events per request and checks the event protocol.

use std::collections::BTreeMap;

use crate::scheduler::engine::Scheduler;
use crate::scheduler::error::{ExecutionError, SchedulerError};
use crate::scheduler::events::{Event, FinishReason, RequestEvent};
use crate::scheduler::executor::Executor;
use crate::scheduler::ids::RequestId;

/// Why [`Transcript::run`] stopped before the scheduler was idle.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A step failed.
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// The scheduler was still busy after `steps` steps.
    #[error("the scheduler is not idle after {steps} steps")]
    NotIdle {
        /// Steps run.
        steps: usize,
    },
}

/// Everything one request was told.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    /// `Admitted` events.
    pub admitted: u32,
    /// Output tokens, in index order.
    pub tokens: Vec<u32>,
    /// Output tokens generated before each preemption, in order.
    pub preempted_at: Vec<u32>,
    /// The finish reason, when it finished.
    pub finish: Option<FinishReason>,
    /// The failure, when it failed.
    pub failure: Option<ExecutionError>,
    /// Terminal events (exactly one when the protocol holds).
    pub terminal_events: u32,
    /// Events that broke the protocol: a token range that does not start
    /// where the previous one ended, an event after the terminal one, a
    /// second `Admitted`, or a `Finished` count that differs from the
    /// tokens delivered.
    pub protocol_errors: u32,
}

/// Events of many requests, by request.
#[derive(Debug, Clone, Default)]
pub struct Transcript {
    /// Per request, what it was told.
    pub requests: BTreeMap<RequestId, RequestLog>,
}

impl Transcript {
    /// Adds events, in order.
    pub fn record(&mut self, events: Vec<RequestEvent>) {
        for RequestEvent { request, event } in events {
            let log = self.requests.entry(request).or_default();
            if log.terminal_events > 0 {
                log.protocol_errors += 1;
            }
            match event {
                Event::Admitted { .. } => {
                    log.admitted += 1;
                    if log.admitted > 1 {
                        log.protocol_errors += 1;
                    }
                }
                Event::Preempted { generated } => {
                    if generated as usize != log.tokens.len() {
                        log.protocol_errors += 1;
                    }
                    log.preempted_at.push(generated);
                }
                Event::Tokens { first, tokens } => {
                    if first as usize != log.tokens.len() {
                        log.protocol_errors += 1;
                    }
                    log.tokens.extend(tokens);
                }
                Event::Finished {
                    reason,
                    output_tokens,
                } => {
                    log.terminal_events += 1;
                    log.finish = Some(reason);
                    if output_tokens as usize != log.tokens.len() {
                        log.protocol_errors += 1;
                    }
                }
                Event::Failed(error) => {
                    log.terminal_events += 1;
                    log.failure = Some(error);
                }
            }
        }
    }

    /// The log of `id` (empty when it got no event).
    pub fn get(&self, id: RequestId) -> RequestLog {
        self.requests.get(&id).cloned().unwrap_or_default()
    }

    /// Steps `scheduler` until it is idle, recording every event; fails when
    /// it is not idle after `max_steps` steps. Returns the steps run.
    pub fn run<E: Executor>(
        &mut self,
        scheduler: &mut Scheduler<E>,
        max_steps: usize,
    ) -> Result<usize, RunError> {
        let mut steps = 0;
        while !scheduler.is_idle() {
            if steps == max_steps {
                return Err(RunError::NotIdle { steps });
            }
            let result = scheduler.step();
            self.record(scheduler.drain_events());
            result?;
            steps += 1;
        }
        self.record(scheduler.drain_events());
        Ok(steps)
    }
}
