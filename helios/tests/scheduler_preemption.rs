//! Preemption under page pressure and readmission by recompute.

mod scheduler_support;

use helios::scheduler::test_executor::{TestExecutor, Transcript};
use helios::scheduler::{
    readmission_seed, Admit, FinishReason, Operation, RequestId, RequestSpec, Scheduler,
};
use scheduler_support::{assert_clean, reference, reference_for, run, spec, Setup};

/// Four requests that cannot all grow to their output limit in the pool.
fn pressure(delay: u32, stop_every: Option<u64>, max_new: u32, kv_pages: u32) {
    let setup = Setup {
        kv_pages,
        stop_every,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(delay);
    let requests: Vec<_> = (0..4).map(|seed| spec(20, max_new, seed)).collect();
    for request in &requests {
        scheduler.submit(request.clone()).unwrap();
    }
    let transcript = run(&mut scheduler);
    assert!(
        scheduler.metrics().preemptions > 0,
        "no preemption happened"
    );
    let mut preempted = 0;
    for (index, request) in requests.iter().enumerate() {
        let log = transcript.get(RequestId(index as u64));
        let expected = reference_for(&setup, request, &log);
        if log.tokens.len() < expected.tokens.len() {
            // Its history outgrew the pool: the readmission after its last
            // preemption could not fit, and it ended at that length.
            assert_eq!(log.preempted_at.last(), Some(&(log.tokens.len() as u32)));
            assert_eq!(log.finish, Some(FinishReason::Length));
            assert_eq!(
                log.tokens,
                expected.tokens[..log.tokens.len()],
                "request {index}"
            );
        } else {
            assert_eq!(log.tokens, expected.tokens, "request {index}");
            assert_eq!(log.finish, Some(expected.reason));
        }
        assert_eq!((log.admitted, log.protocol_errors), (1, 0));
        // Up to its first preemption a request matches the unpreempted run.
        let first = log
            .preempted_at
            .first()
            .map_or(log.tokens.len(), |&p| p as usize);
        assert_eq!(
            log.tokens[..first],
            reference(&setup, request).tokens[..first]
        );
        preempted += log.preempted_at.len();
    }
    assert_eq!(preempted as u64, scheduler.metrics().preemptions);
    // Each request's first token is split once, at its first admission, however
    // often it was readmitted.
    let split = scheduler.first_token();
    assert_eq!(split.to_first_launch.count(), requests.len() as u64);
    assert_eq!(split.to_first_record.count(), requests.len() as u64);
    assert_eq!(split.to_sampling_launch.count(), requests.len() as u64);
    assert_eq!(split.sampling_to_record.count(), requests.len() as u64);
    assert_clean(&scheduler);
}

#[test]
fn recompute_after_preemption_continues_under_the_readmission_seed() {
    pressure(0, None, 60, 13);
    pressure(0, Some(60), 200, 13);
}

#[test]
fn preemption_waits_for_launches_in_flight() {
    pressure(1, None, 60, 13);
    pressure(3, None, 60, 13);
}

/// Every readmission's admit launch, with the request it belongs to.
fn readmissions(
    log: &[helios::scheduler::Launch],
    requests: &[helios::scheduler::RequestSpec],
) -> Vec<(usize, Admit)> {
    let mut found = Vec::new();
    for launch in log {
        let Operation::Admit(admit) = &launch.operation else {
            continue;
        };
        let readmitted = |r: &&helios::scheduler::RequestSpec| {
            admit.prompt.len() > r.prompt.len() && admit.prompt.starts_with(&r.prompt)
        };
        if let Some(index) = requests.iter().position(|r| readmitted(&r)) {
            found.push((index, admit.clone()));
        }
    }
    found
}

/// Four requests of 20 + 60 tokens over 13 pages, run to the end: too few
/// pages for all, so decoders are preempted.
fn four_requests_in_thirteen_pages(
) -> (Setup, Scheduler<TestExecutor>, Vec<RequestSpec>, Transcript) {
    let setup = Setup {
        kv_pages: 13,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let requests: Vec<_> = (0..4).map(|seed| spec(20, 60, seed)).collect();
    for request in &requests {
        scheduler.submit(request.clone()).unwrap();
    }
    let transcript = run(&mut scheduler);
    (setup, scheduler, requests, transcript)
}

#[test]
fn readmission_carries_history_remaining_budget_and_a_derived_seed() {
    let (setup, scheduler, requests, transcript) = four_requests_in_thirteen_pages();
    let found = readmissions(scheduler.executor().log(), &requests);
    assert!(!found.is_empty());
    for (index, admit) in found {
        let request = &requests[index];
        let log = transcript.get(RequestId(index as u64));
        let output = reference_for(&setup, request, &log).tokens;
        let generated = admit.prompt.len() - request.prompt.len();
        assert!(log.preempted_at.contains(&(generated as u32)));
        let mut history = request.prompt.clone();
        history.extend(&output[..generated]);
        assert_eq!(admit.prompt, history);
        assert_eq!(admit.max_new_tokens as usize, 60 - generated);
        assert_eq!(admit.seed, readmission_seed(request.seed, generated as u64));
        assert_ne!(admit.seed, request.seed);
        assert_eq!(admit.consumed, 0);
    }
}

#[test]
fn the_newest_decoder_is_preempted() {
    let (_, scheduler, _, _) = four_requests_in_thirteen_pages();
    // Nothing finishes before the first preemption, so the first page-table
    // clear is the first victim's retirement.
    let mut seeds = std::collections::BTreeMap::new();
    let mut victim = None;
    'launches: for launch in scheduler.executor().log() {
        for update in &launch.page_updates {
            if update.pages.iter().all(|page| page.is_null()) {
                victim = seeds.get(&update.slot).copied();
                break 'launches;
            }
        }
        if let Operation::Admit(admit) = &launch.operation {
            seeds.insert(admit.slot, admit.seed);
        }
    }
    // The last admitted of the four is the first victim.
    assert_eq!(victim, Some(3));
}

#[test]
fn a_history_that_outgrows_the_pool_ends_at_that_length() {
    let setup = Setup {
        kv_pages: 5, // 4 pages: 64 tokens
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let request = spec(20, 200, 0);
    let id = scheduler.submit(request.clone()).unwrap();
    let transcript = run(&mut scheduler);
    let log = transcript.get(id);
    // 64 consumed tokens fill the pool; the 65th (the pending one) cannot
    // be consumed, so the request ends with 20 + 45 tokens of history.
    assert_eq!(log.tokens.len(), 45);
    assert_eq!(log.tokens, reference(&setup, &request).tokens[..45]);
    assert_eq!(log.finish, Some(FinishReason::Length));
    assert_eq!(scheduler.metrics().preemptions, 1);
    assert_clean(&scheduler);
}

#[test]
fn a_prefilling_request_keeps_its_reservation_under_pressure() {
    // A decoder that needs a page while a long prompt holds the rest of the
    // pool preempts itself: prompts being prefilled are not decoders.
    let setup = Setup {
        kv_pages: 45,
        prefill_capacities: vec![16],
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let decoder = spec(10, 150, 0);
    let long = spec(600, 20, 1); // 38 chunks, 38 + 1 pages
    let mut transcript = Transcript::default();
    let first = scheduler.submit(decoder.clone()).unwrap();
    while transcript.get(first).tokens.len() < 38 && !scheduler.is_idle() {
        scheduler.step().unwrap();
        transcript.record(scheduler.drain_events());
    }
    let second = scheduler.submit(long.clone()).unwrap();
    for _ in 0..100 {
        if scheduler.metrics().preemptions > 0 {
            break;
        }
        scheduler.step().unwrap();
        transcript.record(scheduler.drain_events());
    }
    assert_eq!(scheduler.metrics().preemptions, 1);
    assert!(transcript.get(second).tokens.is_empty(), "still prefilling");
    transcript.run(&mut scheduler, 10_000).unwrap();
    assert_eq!(
        transcript.get(second).tokens,
        reference(&setup, &long).tokens
    );
    assert_eq!(
        transcript.get(first).tokens,
        reference_for(&setup, &decoder, &transcript.get(first)).tokens
    );
    assert_eq!(scheduler.metrics().preemptions, 1);
    assert_clean(&scheduler);
}
