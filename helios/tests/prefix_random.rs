//! Seeded randomized invariant test: long random sequences of admissions
//! (fresh prompts, tool-result appends, branches, readmissions), prefill to
//! selected endpoints, captures whose copies complete later, restores whose
//! GPU use ends later, cancellations, preemption on page shortage and page
//! reclaims. After every operation: the store's invariants, every cached
//! chain's pages and row hold exactly its tokens (descendants included,
//! after any ancestor removal), every live request's state is exact, and
//! every page is free, cached or private to exactly one request. At the end
//! nothing is lent, held or leaked.

mod prefix_support;

use std::collections::VecDeque;

use helios::prefix::{
    capture_budget, select_captures, CaptureRequest, GpuUse, SnapshotReservation,
};
use prefix_support::{tokens, Harness, Recipe, Request, Rng, GEOMETRIES};

const CONCURRENCY: u32 = 4;
const MAX_STREAM: usize = 1200;

/// What a request waits for.
enum Phase {
    Ready,
    /// Its restore copy is in flight.
    Restoring,
    /// Its snapshot copy is in flight.
    Snapshotting,
}

struct Agent {
    request: Request,
    /// The tokens its admission treated as prompt.
    prompt: u32,
    /// Endpoints still to capture, ascending.
    stops: VecDeque<u32>,
    phase: Phase,
    cancelled: bool,
}

enum InFlight {
    Restore(usize, GpuUse),
    Snapshot(usize, SnapshotReservation),
    /// Launches of an ended request still reading its chain.
    Drain(GpuUse),
}

struct World {
    h: Harness,
    rng: Rng,
    budget: u32,
    agents: Vec<Option<Agent>>,
    in_flight: Vec<InFlight>,
    histories: Vec<Vec<u32>>,
    /// Preempted streams waiting for readmission, with their history.
    readmit: VecDeque<(Vec<u32>, u32)>,
    seed_counter: u64,
    finished: u64,
    preempted: u64,
}

impl World {
    fn new(recipe: Recipe, page_tokens: u32, rows: u32, seed: u64) -> Self {
        // One request alone always fits; four long ones do not.
        let kv_pages = 2 + 2 * (MAX_STREAM as u32).div_ceil(page_tokens);
        Self {
            h: Harness::new(recipe, page_tokens, rows, kv_pages),
            rng: Rng::new(seed),
            budget: capture_budget(rows, CONCURRENCY),
            agents: Vec::new(),
            in_flight: Vec::new(),
            histories: Vec::new(),
            readmit: VecDeque::new(),
            seed_counter: seed << 20,
            finished: 0,
            preempted: 0,
        }
    }

    fn fresh(&mut self, len: u64) -> Vec<u32> {
        self.seed_counter += 1;
        tokens(len as usize, self.seed_counter)
    }

    /// A new stream: a fresh prompt, a history with a tool result appended,
    /// a branch of a history, or the twin of a live request's stream (both
    /// compute and capture the same endpoints); then its output.
    fn new_stream(&mut self) -> (Vec<u32>, u32) {
        let pick = self.rng.below(20);
        let twins: Vec<&Agent> = self.agents.iter().flatten().collect();
        if pick == 0 && !twins.is_empty() {
            let twin = twins[self.rng.below(twins.len() as u64) as usize];
            return (twin.request.stream.clone(), twin.prompt);
        }
        let mut prompt = if self.histories.is_empty() || pick < 5 {
            let len = self.rng.range(1, 500);
            self.fresh(len)
        } else {
            // Conversations continue: mostly one of the latest histories.
            let recent = self.histories.len().min(6) as u64;
            let i = self.histories.len() - 1 - self.rng.below(recent) as usize;
            let mut base = self.histories[i].clone();
            if pick >= 15 {
                base.truncate(self.rng.range(1, base.len() as u64) as usize);
            }
            let extra = self.rng.range(1, 300);
            base.extend(self.fresh(extra));
            base
        };
        prompt.truncate(MAX_STREAM - 100);
        let prompt_tokens = prompt.len() as u32;
        let output = self.rng.range(1, 80);
        prompt.extend(self.fresh(output));
        (prompt, prompt_tokens)
    }

    fn admit(&mut self) {
        let slot = self.agents.iter().position(Option::is_none);
        let live = self.agents.iter().filter(|a| a.is_some()).count() as u32;
        if live >= CONCURRENCY {
            return;
        }
        let (stream, limit, readmitted) = match self.readmit.pop_front() {
            Some((stream, history)) => (stream, history, true),
            None => {
                let (stream, prompt) = self.new_stream();
                (stream, prompt, false)
            }
        };
        let Ok((request, restore)) = self.h.admit_async(&stream, limit) else {
            return;
        };
        let marks: Vec<u32> = (0..self.rng.below(6))
            .map(|_| self.rng.range(1, u64::from(limit)) as u32)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let output = stream.len() as u32 - limit;
        let plan = select_captures(&CaptureRequest {
            budget: self.budget,
            reused: request.reused,
            prompt_tokens: limit,
            max_new_tokens: output,
            message_endpoints: if readmitted { &[] } else { &marks },
        });
        let mut stops: VecDeque<u32> = plan.prefill_stops(limit).into();
        if plan.terminal {
            stops.push_back(stream.len() as u32 - 1);
        }
        let agent = Agent {
            request,
            prompt: limit,
            stops,
            phase: Phase::Ready,
            cancelled: false,
        };
        let index = match slot {
            Some(i) => {
                self.agents[i] = Some(agent);
                i
            }
            None => {
                self.agents.push(Some(agent));
                self.agents.len() - 1
            }
        };
        if let Some(gpu_use) = restore {
            self.agents[index].as_mut().unwrap().phase = Phase::Restoring;
            self.in_flight.push(InFlight::Restore(index, gpu_use));
        }
    }

    /// One prefill chunk or decode step, a capture at a reached endpoint,
    /// or the end of the request.
    fn advance(&mut self, index: usize) {
        let agent = self.agents[index].as_mut().unwrap();
        if !matches!(agent.phase, Phase::Ready) {
            return;
        }
        let end = agent.request.stream.len() as u32 - 1;
        let consumed = agent.request.consumed();
        while agent.stops.front().is_some_and(|&s| s < consumed) {
            agent.stops.pop_front();
        }
        let target = agent.stops.front().copied().unwrap_or(end);
        if consumed == target {
            if agent.stops.is_empty() {
                return self.end(index, true);
            }
            match self.h.launch_snapshot(&agent.request) {
                Some(reservation) => {
                    agent.phase = Phase::Snapshotting;
                    self.in_flight.push(InFlight::Snapshot(index, reservation));
                }
                // No row: inference continues without this checkpoint.
                None => {
                    agent.stops.pop_front();
                }
            }
            return;
        }
        let chunk = self.rng.range(1, 300) as u32;
        let upto = target.min(consumed + chunk);
        if self.h.consume(&mut agent.request, upto).is_err() {
            self.preempt(index);
        }
    }

    /// Out of pages: publish the terminal checkpoint when a row allows, give
    /// everything back and queue the history for readmission.
    fn preempt(&mut self, index: usize) {
        self.preempted += 1;
        let mut agent = self.agents[index].take().unwrap();
        let history = agent.request.consumed();
        if history > agent.request.reused {
            self.h.capture(&mut agent.request);
        }
        let stream = agent.request.stream.clone();
        self.h.finish(agent.request);
        if history > 0 {
            self.readmit.push_back((stream, history));
        }
    }

    /// Ends a request; its launches may still read its chain for a while.
    fn end(&mut self, index: usize, completed: bool) {
        let agent = self.agents[index].take().unwrap();
        if let Some(pin) = &agent.request.pin {
            if self.rng.chance(50) {
                let gpu_use = self.h.store.begin_use(pin);
                self.in_flight.push(InFlight::Drain(gpu_use));
            }
        }
        if completed {
            self.finished += 1;
            let consumed = agent.request.consumed() as usize;
            self.histories
                .push(agent.request.stream[..=consumed].to_vec());
        }
        self.h.finish(agent.request);
    }

    fn complete_one(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let i = self.rng.below(self.in_flight.len() as u64) as usize;
        match self.in_flight.swap_remove(i) {
            InFlight::Drain(gpu_use) => self.h.store.end_use(gpu_use),
            InFlight::Restore(index, gpu_use) => {
                self.h.store.end_use(gpu_use);
                let agent = self.agents[index].as_mut().unwrap();
                agent.phase = Phase::Ready;
                if agent.cancelled {
                    self.end(index, false);
                }
            }
            InFlight::Snapshot(index, reservation) => {
                let agent = self.agents[index].as_mut().unwrap();
                agent.phase = Phase::Ready;
                if agent.cancelled {
                    self.h.store.release_reservation(reservation);
                    self.end(index, false);
                } else {
                    self.h.complete_snapshot(&mut agent.request, reservation);
                    agent.stops.pop_front();
                }
            }
        }
    }

    fn cancel(&mut self, index: usize) {
        let agent = self.agents[index].as_mut().unwrap();
        if matches!(agent.phase, Phase::Ready) {
            self.end(index, false);
        } else {
            agent.cancelled = true;
        }
    }

    fn live_indices(&self) -> Vec<usize> {
        (self.agents.iter().enumerate())
            .filter(|(_, a)| a.as_ref().is_some_and(|a| !a.cancelled))
            .map(|(i, _)| i)
            .collect()
    }

    fn step(&mut self) {
        let live = self.live_indices();
        let roll = self.rng.below(100);
        match roll {
            0..=14 => self.admit(),
            15..=64 if !live.is_empty() => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.advance(i);
            }
            65..=89 => self.complete_one(),
            90..=93 if !live.is_empty() => {
                let i = live[self.rng.below(live.len() as u64) as usize];
                self.cancel(i);
            }
            94..=96 => {
                let wanted = self.rng.range(1, 8) as u32;
                let eviction = self.h.store.reclaim_pages(wanted);
                self.h.apply(eviction);
            }
            _ => self.complete_one(),
        }
    }

    fn check(&self) {
        let live: Vec<&Request> = self.agents.iter().flatten().map(|a| &a.request).collect();
        self.h.check(&live);
        let outstanding = self.h.store.outstanding();
        let pins = live.iter().filter(|r| r.pin.is_some()).count() as u32;
        let drains = (self.in_flight.iter()).filter(|f| !matches!(f, InFlight::Snapshot(..)));
        let snapshots = self.in_flight.len() - drains.clone().count();
        assert_eq!(outstanding.pins, pins, "pins lent = pins held by requests");
        assert_eq!(
            outstanding.uses as usize,
            drains.count(),
            "uses = restores + drains in flight"
        );
        assert_eq!(
            outstanding.reservations as usize, snapshots,
            "reservations = snapshots in flight"
        );
    }

    /// Completes everything in flight, ends every request, empties the cache.
    fn drain(mut self) {
        while !self.in_flight.is_empty() {
            self.complete_one();
        }
        let live: Vec<usize> = (0..self.agents.len())
            .filter(|&i| self.agents[i].is_some())
            .collect();
        for i in live {
            self.end(i, false);
        }
        // Ending requests may leave launches in flight.
        while !self.in_flight.is_empty() {
            self.complete_one();
        }
        self.h.drain(Vec::new());
    }
}

fn run(recipe: Recipe, page_tokens: u32, rows: u32, seed: u64, ops: usize) {
    let mut world = World::new(recipe, page_tokens, rows, seed);
    for op in 0..ops {
        world.step();
        world.check();
        assert!(op < ops);
    }
    let metrics = world.h.store.metrics();
    // The sequence exercised what it is meant to.
    let context = format!("{recipe:?}, page {page_tokens}, {rows} rows: {metrics:?}");
    assert!(world.finished > 10 && world.preempted > 0, "{context}");
    assert!(
        metrics.hits > 10 && metrics.duplicate_publications > 0,
        "{context}"
    );
    assert!(metrics.evicted > 0 && metrics.thinned > 0, "{context}");
    world.drain();
}

#[test]
fn random_operation_sequences_keep_every_invariant() {
    for (r, recipe) in Recipe::ALL.into_iter().enumerate() {
        for page_tokens in GEOMETRIES {
            for rows in [4, 12] {
                let seed = (r as u64) << 32 | u64::from(rows) << 16 | u64::from(page_tokens);
                run(recipe, page_tokens, rows, seed, 2500);
            }
        }
    }
}

#[test]
fn a_tight_snapshot_pool_under_heavy_page_pressure() {
    run(Recipe::Recurrent, 64, 2, 77, 5000);
}
