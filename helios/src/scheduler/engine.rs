//! The scheduler: one owner for requests, slots, pages and launches in
//! flight, driven one iteration at a time by [`Scheduler::step`].
//!
//! An iteration:
//! 1. retrieves completions that are ready, then waits if it must: an
//!    iteration that will prefill drains every launch first (prefill, admit
//!    and resume are not pipelined), otherwise it waits until fewer than
//!    `decode_depth` launches are in flight; a wait that retrieves an event
//!    ends the iteration there, so the event is handed out at once;
//! 2. at this submission boundary applies cancellations, retires slots and
//!    pages no launch in flight references, and admits queued requests;
//! 3. submits at most one prefill chunk (preceded by its request's admit
//!    launch) when nothing is in flight, then one decode step over every
//!    runnable request, growing pages or preempting first;
//! 4. when it submitted nothing and has no event to hand out, waits for the
//!    oldest launch in flight.
//!
//! Nothing in flight depends on the host: a decode gathers each slot's
//! pending token on the device, and finished rows are masked there. Every
//! completion is validated against what was submitted before any state
//! changes (`validate.rs`).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::admission::AdmissionQueue;
use super::checkpoints::{Cache, Maintenance, PrefixConfig};
use super::error::{AdmissionError, ExecutionError, SchedulerError};
use super::events::{Event, FinishReason, Metrics, RequestEvent};
use super::executor::{Executor, Launch, Operation, OperationKind, Ticket};
use super::geometry::Geometry;
use super::ids::RequestId;
use super::latency::{FirstTokenSplit, Histogram, MASK_BUCKETS};
use super::ledger::PageLedger;
use super::request::{Placed, Placement, Request, RequestSpec};
use crate::prefix::PrefixChain;

/// Counts of terminal events since the scheduler started.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Finished {
    pub(super) stop: u64,
    pub(super) length: u64,
    pub(super) cancelled: u64,
    pub(super) failed: u64,
}

/// Scheduling policy within the contract's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Requests the admission queue holds; a submission beyond it fails with
    /// [`AdmissionError::QueueFull`].
    pub queue_capacity: usize,
    /// How many later requests may be admitted ahead of a queued request
    /// whose reservation does not fit, before it blocks the queue.
    pub max_bypass: u32,
    /// Launches in flight once a decode step is submitted: 2 lets a decode
    /// step run while the host reads the previous one's records; 1
    /// serializes. An iteration that prefills drains first, whatever this is.
    pub decode_depth: usize,
    /// Exact prefix checkpoints over the core's snapshot rows; `None` (or
    /// no row) disables the cache.
    pub prefix: Option<PrefixConfig>,
    /// How long the model thread ([`super::Worker`]) polls its inbox once
    /// idle before it sleeps on it: a request arriving within it skips the
    /// thread's wake-up. Zero sleeps at once.
    pub idle_spin: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 1024,
            max_bypass: 8,
            decode_depth: 2,
            prefix: None,
            idle_spin: Duration::ZERO,
        }
    }
}

/// A launch submitted and not yet retrieved.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) ticket: Ticket,
    /// What each completion record row stands for.
    pub(super) rows: Vec<Row>,
    /// Requests whose slot the launch references.
    pub(super) refs: Vec<RequestId>,
    /// What a snapshot or restore was submitted for.
    pub(super) maintenance: Option<Maintenance>,
}

/// What one completion record row was submitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Row {
    /// A decode row padded with the null slot.
    Padding,
    /// A prefill chunk of `len` tokens, sampling when it ends the prompt
    /// (and no capture inside it follows: a resume samples then).
    Chunk {
        id: RequestId,
        len: u32,
        samples: bool,
    },
    /// A decode row.
    Decode { id: RequestId },
    /// A resume after a whole-history restore, or after a chunk ending the
    /// prompt with captures inside it: it samples without consuming.
    Resume { id: RequestId },
    /// A resume that samples the token its request's last resume sampled
    /// again: the captures inside a chunk admitted the slot back after the
    /// first one, and the decode that follows needs the sampled state back.
    /// Its record must repeat the request's confirmed sample exactly.
    Resample { id: RequestId },
}

/// What one [`Scheduler::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepReport {
    /// Launches submitted.
    pub submitted: usize,
    /// Completions retrieved and applied.
    pub collected: usize,
}

/// The scheduler of one model: owned by one thread, driven by
/// [`Scheduler::step`].
pub struct Scheduler<E> {
    pub(super) geometry: Geometry,
    pub(super) config: SchedulerConfig,
    pub(super) executor: E,
    /// Requests waiting for admission (preempted ones included).
    pub(super) queued: BTreeMap<RequestId, Request>,
    /// Their admission order.
    pub(super) queue: AdmissionQueue,
    /// Requests holding a slot.
    pub(super) placed: BTreeMap<RequestId, Placed>,
    /// The placed requests by admission order (oldest first).
    pub(super) by_admission: BTreeMap<u64, RequestId>,
    /// Slots, pages, reservations and page tables.
    pub(super) ledger: PageLedger,
    pub(super) window: VecDeque<InFlight>,
    pub(super) cancels: Vec<RequestId>,
    pub(super) events: Vec<RequestEvent>,
    next_request: u64,
    next_arrival: u64,
    pub(super) next_admission: u64,
    pub(super) preemptions: u64,
    pub(super) prefilled_tokens: u64,
    /// Launches submitted, by [`OperationKind::index`], for [`Metrics`].
    launches: [u64; OperationKind::COUNT],
    /// Terminal events by kind, for [`Metrics`].
    pub(super) finished: Finished,
    pub(super) failure: Option<ExecutionError>,
    /// The prefix cache, when the core has snapshot rows.
    pub(super) cache: Option<Cache>,
    /// How long constrained requests' masks took, each.
    pub(super) mask_time: Histogram,
    /// Each request's first token in two parts, on this thread.
    pub(super) first_token: FirstTokenSplit,
}

impl<E: Executor> Scheduler<E> {
    /// A scheduler over `executor`, whose slots, pages and graphs are
    /// described by `geometry`.
    pub fn new(
        geometry: Geometry,
        config: SchedulerConfig,
        executor: E,
    ) -> Result<Self, SchedulerError> {
        let invalid = |field, reason| Err(SchedulerError::Config { field, reason });
        if config.queue_capacity == 0 {
            return invalid("queue_capacity", "is 0");
        }
        if !(1..=2).contains(&config.decode_depth) {
            return invalid("decode_depth", "must be 1 or 2");
        }
        let cache = match &config.prefix {
            Some(prefix) => Cache::new(prefix, &geometry)?,
            None => None,
        };
        Ok(Self {
            cache,
            mask_time: Histogram::new(&MASK_BUCKETS),
            first_token: FirstTokenSplit::default(),
            ledger: PageLedger::new(geometry.max_concurrency(), geometry.kv_pages()),
            geometry,
            config,
            executor,
            queued: BTreeMap::new(),
            queue: AdmissionQueue::default(),
            placed: BTreeMap::new(),
            by_admission: BTreeMap::new(),
            window: VecDeque::new(),
            cancels: Vec::new(),
            events: Vec::new(),
            next_request: 0,
            next_arrival: 0,
            next_admission: 0,
            preemptions: 0,
            prefilled_tokens: 0,
            launches: [0; OperationKind::COUNT],
            finished: Finished::default(),
            failure: None,
        })
    }

    /// Queues a request for admission.
    pub fn submit(&mut self, spec: RequestSpec) -> Result<RequestId, AdmissionError> {
        self.submit_chained(spec, None)
    }

    /// [`Self::submit`] with the prompt's prefix chain already hashed under
    /// the cache's salt (by the submitting thread, so the model thread does
    /// not hash long prompts); `None` hashes it here when the cache needs it.
    pub fn submit_chained(
        &mut self,
        spec: RequestSpec,
        chain: Option<PrefixChain>,
    ) -> Result<RequestId, AdmissionError> {
        if self.failure.is_some() {
            return Err(AdmissionError::Unavailable);
        }
        spec.check(&self.geometry)?;
        if spec.grammar.is_some() && !self.executor.applies_masks() {
            return Err(AdmissionError::GrammarUnsupported);
        }
        if self.queue.len() >= self.config.queue_capacity {
            return Err(AdmissionError::QueueFull {
                capacity: self.config.queue_capacity,
            });
        }
        let id = RequestId(self.next_request);
        self.next_request += 1;
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.queue.push(arrival, id);
        let chain = (self.cache.as_ref()).map(|cache| {
            chain
                .filter(|chain| chain.tokens() == spec.prompt.as_slice())
                .unwrap_or_else(|| cache.chain(&spec.prompt))
        });
        let request = Request {
            chain,
            spec,
            arrival,
            output: Vec::new(),
            admitted: false,
            submitted: Instant::now(),
            first_launch: None,
            sampling_launch: None,
        };
        self.queued.insert(id, request);
        Ok(id)
    }

    /// Asks to cancel a request; applied at the next submission boundary.
    /// Unknown or finished requests are ignored.
    pub fn cancel(&mut self, id: RequestId) {
        self.cancels.push(id);
    }

    /// Runs one iteration (see the module documentation).
    ///
    /// The caller takes the events ([`Self::drain_events`]) after each
    /// iteration: one that starts with events not taken never waits for a
    /// completion, so stepping without draining polls the executor (and
    /// submits nothing while more launches are in flight than it may add
    /// to).
    ///
    /// An executor failure fails every request, and this and every later
    /// call return [`SchedulerError::Execution`].
    pub fn step(&mut self) -> Result<StepReport, SchedulerError> {
        if let Some(error) = &self.failure {
            return Err(SchedulerError::Execution(error.clone()));
        }
        self.iterate().map_err(|error| {
            self.fail_everything(&error);
            SchedulerError::Execution(error)
        })
    }

    fn iterate(&mut self) -> Result<StepReport, ExecutionError> {
        let mut report = StepReport {
            collected: self.collect_ready()?,
            ..StepReport::default()
        };
        // The waits stop at the first completion that gives an event: the
        // iteration then returns it rather than hold it behind the launches
        // still in flight (a first token behind its request's captures), and
        // the next iteration waits on.
        let waited = if self.prefill_plan().is_some() {
            self.drain()?
        } else {
            self.wait_for_room()?
        };
        report.collected += waited.collected;
        if !waited.done {
            return Ok(report);
        }
        self.apply_cancels();
        report.submitted += self.retire()?;
        self.admit_queued();
        if self.window.is_empty() {
            if let Some(plan) = self.prefill_plan() {
                report.submitted += self.submit_prefill(plan)?;
            }
        }
        report.submitted += self.submit_decode()?;
        // With nothing submitted, wait for the next completion rather than
        // spin; but not while events wait to be handed out: the iteration
        // that retrieves a request's next-to-last token submits nothing (the
        // last is in flight) and would hold that token back a whole step.
        if report.submitted == 0 && self.events.is_empty() && self.collect_next(true)? {
            report.collected += 1;
        }
        Ok(report)
    }

    /// Whether nothing is queued, placed or in flight.
    pub fn is_idle(&self) -> bool {
        self.queued.is_empty() && self.placed.is_empty() && self.window.is_empty()
    }

    /// Events since the last call, in order.
    pub fn drain_events(&mut self) -> Vec<RequestEvent> {
        std::mem::take(&mut self.events)
    }

    /// How long each constrained request's next-token mask took.
    pub fn mask_time(&self) -> &Histogram {
        &self.mask_time
    }

    /// Each request's first token in two parts, split at its first launch.
    pub fn first_token(&self) -> &FirstTokenSplit {
        &self.first_token
    }

    /// Current counters.
    pub fn metrics(&self) -> Metrics {
        Metrics {
            queue_depth: self.queue.len(),
            running: (self.placed.values())
                .filter(|placed| placed.placement.exit().is_none())
                .count(),
            in_flight: self.window.len(),
            pages_used: self.ledger.used(),
            pages_reserved: self.ledger.reserved(),
            pages_free: self.ledger.available(),
            preemptions: self.preemptions,
            prefilled_tokens: self.prefilled_tokens,
            finished_stop: self.finished.stop,
            finished_length: self.finished.length,
            cancelled: self.finished.cancelled,
            failed: self.finished.failed,
            launches: self.launches,
            cache: self.cache_metrics(),
        }
    }

    /// The first executor failure, once the scheduler has stopped.
    pub fn failure(&self) -> Option<&ExecutionError> {
        self.failure.as_ref()
    }

    /// The contract geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The executor, for inspection.
    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// The executor, for configuration between steps.
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.executor
    }

    /// Submits `operation` with the pending page-table updates.
    pub(super) fn launch(
        &mut self,
        operation: Operation,
        rows: Vec<Row>,
        refs: Vec<RequestId>,
        maintenance: Option<Maintenance>,
    ) -> Result<(), ExecutionError> {
        let launch = Launch {
            page_updates: self.ledger.take_updates(),
            operation,
        };
        let ticket = self.executor.submit(&launch)?;
        self.launches[launch.operation.kind().index()] += 1;
        for id in &refs {
            if let Some(Placed { request, placement }) = self.placed.get_mut(id) {
                placement.refs += 1;
                // Read the clock once per request, not on every decode step.
                if request.first_launch.is_none() {
                    let now = Instant::now();
                    request.first_launch = Some(now);
                    let waited = now.saturating_duration_since(request.submitted);
                    self.first_token
                        .to_first_launch
                        .observe(waited.as_secs_f64());
                }
            }
        }
        for row in &rows {
            let sampling = match *row {
                // A request's first token comes from a chunk ending its
                // prompt or from a resume, never from a decode step.
                Row::Chunk {
                    id, samples: true, ..
                }
                | Row::Resume { id } => id,
                _ => continue,
            };
            if let Some(Placed { request, .. }) = self.placed.get_mut(&sampling) {
                if request.sampling_launch.is_none() && request.output.is_empty() {
                    request.sampling_launch = Some(Instant::now());
                }
            }
        }
        self.window.push_back(InFlight {
            ticket,
            rows,
            refs,
            maintenance,
        });
        Ok(())
    }

    pub(super) fn placement_mut(&mut self, id: RequestId) -> Option<&mut Placement> {
        Some(&mut self.placed.get_mut(&id)?.placement)
    }

    pub(super) fn emit(&mut self, request: RequestId, event: Event) {
        let counter = match &event {
            Event::Finished { reason, .. } => Some(match reason {
                FinishReason::Stop => &mut self.finished.stop,
                FinishReason::Length => &mut self.finished.length,
                FinishReason::Cancelled => &mut self.finished.cancelled,
            }),
            Event::Failed(_) => Some(&mut self.finished.failed),
            _ => None,
        };
        if let Some(counter) = counter {
            *counter += 1;
        }
        self.events.push(RequestEvent { request, event });
    }
}
