//! Seeded random workloads: random contracts, pool sizes, arrivals,
//! cancellations, stop tokens and completion delays. Every request ends
//! exactly once with the fake model's reference continuation (or a prefix
//! of it when cancelled), no page or slot is used twice or leaked, and with
//! `max_bypass` 0 admission is strictly FIFO. Two thirds of the workloads
//! run with the prefix cache over a random snapshot-row pool (half of them
//! on a positional-KV core, capturing message endpoints inside chunks), on
//! prompts that branch from a few shared conversations at random message
//! endpoints: outputs
//! stay the references, and the checkpoint store's invariants hold with no
//! pin, use or reservation left. `SCHEDULER_SEEDS=N` runs N workloads
//! instead of 40 (about 2,000 requests).

mod scheduler_support;

use std::collections::VecDeque;

use helios::scheduler::test_executor::Transcript;
use helios::scheduler::{
    AdmissionError, Event, FinishReason, RequestId, RequestSpec, SamplingParams, SchedulerConfig,
};
use scheduler_support::{assert_clean, dense_row, prompt, reference_for, Rng, Setup};

/// Totals over all workloads, to check that every path was exercised.
#[derive(Debug, Default)]
struct Totals {
    requests: usize,
    preemptions: u64,
    cancelled: usize,
    stopped: usize,
    length: usize,
    queue_full: usize,
    two_in_flight: usize,
    hit_tokens: u64,
    restores: u64,
    evicted: u64,
}

fn choose<T: Copy>(rng: &mut Rng, values: &[T]) -> T {
    values[rng.below(values.len() as u64) as usize]
}

fn random_setup(rng: &mut Rng, requests: &[RequestSpec]) -> (Setup, u32) {
    let page_size = choose(rng, &[8, 16, 32]);
    let max_concurrency = choose(rng, &[1, 2, 3, 4, 6, 8]);
    let mut decode_capacities: Vec<u32> = (0..)
        .map(|shift| 1 << shift)
        .take_while(|&capacity| capacity < max_concurrency)
        .collect();
    decode_capacities.push(max_concurrency);
    let chunk = page_size * choose(rng, &[1, 2, 4]);
    let mut prefill_capacities = vec![chunk];
    if chunk >= 2 * page_size && rng.chance(50) {
        prefill_capacities.insert(0, chunk / 2);
    }
    let geometry_pages = |tokens: u32| tokens.div_ceil(page_size);
    let largest = (requests.iter())
        .map(|r| geometry_pages(r.prompt.len() as u32 + r.max_new_tokens) + 1)
        .max()
        .unwrap();
    // Half the pools are tight: only the largest request fits alone, so
    // running requests grow into each other and preempt.
    let slack = if rng.chance(50) {
        4
    } else {
        u64::from(largest) * 3
    };
    let usable = largest + rng.below(slack) as u32;
    let setup = Setup {
        page_size,
        decode_capacities,
        prefill_capacities,
        context_limit: 1024,
        kv_pages: usable + 1,
        vocab_size: 64,
        stop_every: choose(rng, &[None, Some(11), Some(40)]),
        config: SchedulerConfig {
            queue_capacity: choose(rng, &[4, 16, 1000]),
            max_bypass: choose(rng, &[0, 1, 4, 8]),
            decode_depth: choose(rng, &[1, 2]),
            prefix: None,
            idle_spin: std::time::Duration::ZERO,
        },
        snapshot_rows: 0,
    };
    let rows = choose(rng, &[1, 2, 4, 8, 32]);
    let setup = match rng.below(3) {
        0 => setup.with_cache(rows, dense_row()),
        // Message endpoints captured inside chunks.
        1 => setup.with_positional_kv_cache(rows, dense_row()),
        _ => setup,
    };
    (setup, choose(rng, &[0, 1, 2, 5]))
}

fn random_requests(rng: &mut Rng) -> Vec<RequestSpec> {
    let count = rng.range(30, 80);
    let conversations: Vec<Vec<u32>> = (0..3).map(|_| prompt(400, rng.next())).collect();
    (0..count)
        .map(|index| {
            let long = rng.chance(10);
            let limit = choose(rng, &[20, 80, 150]);
            let len = if long {
                rng.range(100, 400)
            } else {
                rng.range(1, 100)
            };
            let mut tokens = prompt(len as usize, rng.next());
            if rng.chance(50) {
                // A branch of a shared conversation.
                let base = &conversations[rng.below(3) as usize];
                let shared = rng.range(1, 400) as usize;
                let tail = rng.below(len) as usize;
                tokens = [&base[..shared], &tokens[..tail]].concat();
            }
            let mut message_endpoints: Vec<u32> = (0..rng.below(6))
                .map(|_| 1 + rng.below(tokens.len() as u64) as u32)
                .filter(|&e| (e as usize) < tokens.len())
                .collect();
            message_endpoints.sort_unstable();
            message_endpoints.dedup();
            RequestSpec {
                prompt: tokens,
                max_new_tokens: rng.range(1, limit) as u32,
                sampling: SamplingParams::default(),
                seed: index,
                message_endpoints,
                grammar: None,
            }
        })
        .collect()
}

fn workload(seed: u64, totals: &mut Totals) {
    let mut rng = Rng::new(seed);
    let requests = random_requests(&mut rng);
    let (setup, delay) = random_setup(&mut rng, &requests);
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(delay);
    let usable = setup.geometry().usable_pages();
    let mut pending: VecDeque<&RequestSpec> = requests.iter().collect();
    let mut submitted: Vec<(RequestId, &RequestSpec)> = Vec::new();
    let mut transcript = Transcript::default();
    let mut admitted_order = Vec::new();
    let mut steps = 0;
    while !pending.is_empty() || !scheduler.is_idle() {
        for _ in 0..rng.below(4) {
            let Some(&spec) = pending.front() else { break };
            match scheduler.submit(spec.clone()) {
                Ok(id) => {
                    submitted.push((id, spec));
                    pending.pop_front();
                }
                Err(AdmissionError::QueueFull { .. }) => {
                    totals.queue_full += 1;
                    break;
                }
                Err(error) => panic!("seed {seed}: {error:?}"),
            }
        }
        if !submitted.is_empty() && rng.chance(4) {
            let (id, _) = submitted[rng.below(submitted.len() as u64) as usize];
            scheduler.cancel(id);
        }
        scheduler.step().unwrap();
        let events = scheduler.drain_events();
        admitted_order.extend(
            (events.iter())
                .filter(|e| matches!(e.event, Event::Admitted { .. }))
                .map(|e| e.request),
        );
        transcript.record(events);
        let metrics = scheduler.metrics();
        assert_eq!(
            metrics.pages_used + metrics.pages_reserved + metrics.pages_free,
            usable
        );
        assert!(metrics.running <= setup.geometry().max_concurrency() as usize);
        steps += 1;
        assert!(steps < 200_000, "seed {seed}: no progress");
    }
    assert_clean(&scheduler);
    if setup.config.max_bypass == 0 {
        assert!(
            admitted_order.windows(2).all(|pair| pair[0] < pair[1]),
            "seed {seed}: admission out of order: {admitted_order:?}"
        );
    }
    let mut finishes = [0u64; 3]; // stop, length, cancelled, from the logs
    for (id, _) in &submitted {
        match transcript.get(*id).finish {
            Some(FinishReason::Stop) => finishes[0] += 1,
            Some(FinishReason::Length) => finishes[1] += 1,
            Some(FinishReason::Cancelled) => finishes[2] += 1,
            None => {}
        }
    }
    let metrics = scheduler.metrics();
    assert_eq!(
        [
            metrics.finished_stop,
            metrics.finished_length,
            metrics.cancelled
        ],
        finishes,
        "seed {seed}: finish counters"
    );
    assert_eq!(metrics.failed, 0, "seed {seed}");
    for (id, spec) in &submitted {
        let log = transcript.get(*id);
        let expected = reference_for(&setup, spec, &log);
        let context = format!("seed {seed}, {id}: {log:?}");
        assert_eq!(log.terminal_events, 1, "{context}");
        assert_eq!(log.protocol_errors, 0, "{context}");
        assert!(log.admitted <= 1 && log.failure.is_none(), "{context}");
        match log.finish {
            Some(FinishReason::Cancelled) => {
                assert_eq!(log.tokens, expected.tokens[..log.tokens.len()], "{context}");
                totals.cancelled += 1;
            }
            Some(FinishReason::Length) if log.tokens.len() < expected.tokens.len() => {
                // The history outgrew the pool at its last readmission.
                let end = log.tokens.len();
                assert_eq!(log.preempted_at.last(), Some(&(end as u32)), "{context}");
                assert_eq!(log.tokens, expected.tokens[..end], "{context}");
                totals.length += 1;
            }
            reason => {
                assert_eq!(reason, Some(expected.reason), "{context}");
                assert_eq!(log.tokens, expected.tokens, "{context}");
                match expected.reason {
                    FinishReason::Stop => totals.stopped += 1,
                    _ => totals.length += 1,
                }
            }
        }
    }
    totals.requests += submitted.len();
    totals.preemptions += scheduler.metrics().preemptions;
    totals.two_in_flight += usize::from(scheduler.executor().max_decodes_in_flight() == 2);
    if let Some(cache) = scheduler.metrics().cache {
        totals.hit_tokens += cache.counters.hit_tokens;
        totals.evicted += cache.counters.evicted + cache.counters.thinned;
        totals.restores += scheduler.executor().counts().restore;
    }
}

#[test]
fn random_workloads_keep_every_invariant() {
    let mut totals = Totals::default();
    let seeds: u64 = std::env::var("SCHEDULER_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for seed in 0..seeds {
        workload(seed, &mut totals);
    }
    assert!(totals.requests >= 2000 || seeds < 40, "{totals:?}");
    assert!(totals.preemptions > 0, "{totals:?}");
    assert!(
        totals.cancelled > 0 && totals.stopped > 0 && totals.length > 0,
        "{totals:?}"
    );
    assert!(
        totals.queue_full > 0 && totals.two_in_flight > 0,
        "{totals:?}"
    );
    assert!(
        totals.hit_tokens > 0 && totals.restores > 0 && totals.evicted > 0 || seeds < 40,
        "{totals:?}"
    );
}
