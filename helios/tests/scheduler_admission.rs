//! Admission: FIFO order, reservations, skip-ahead, the fairness bound and
//! typed rejections.

mod scheduler_support;

use helios::scheduler::{AdmissionError, ErrorClass, RequestId, SamplingParams, SchedulerConfig};
use scheduler_support::step;
use scheduler_support::{admission_order, assert_clean, reference, run, spec, Setup};

use helios::scheduler::test_executor::Transcript;

fn ids(values: &[u64]) -> Vec<RequestId> {
    values.iter().copied().map(RequestId).collect()
}

#[test]
fn admission_is_fifo_and_reserves_the_prompt_plus_one_page() {
    let setup = Setup::default(); // 16-token pages, 64 usable
    let mut scheduler = setup.scheduler();
    for (len, seed) in [(20, 0), (40, 1), (5, 2)] {
        scheduler.submit(spec(len, 50, seed)).unwrap();
    }
    scheduler.step().unwrap();
    let events = scheduler.drain_events();
    assert_eq!(admission_order(&events), ids(&[0, 1, 2]));
    // 20 tokens: 2 pages + 1; 40 tokens: 3 + 1; 5 tokens: 1 + 1.
    let metrics = scheduler.metrics();
    assert_eq!(metrics.pages_used + metrics.pages_reserved, 3 + 4 + 2);
    assert_eq!(metrics.running, 3);
    run(&mut scheduler);
    assert_clean(&scheduler);
}

#[test]
fn the_reservation_never_exceeds_what_the_request_can_write() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    // 16 prompt tokens and one output token: the sample is never consumed,
    // so one page is all it can ever use.
    scheduler.submit(spec(16, 1, 0)).unwrap();
    scheduler.step().unwrap();
    let metrics = scheduler.metrics();
    assert_eq!(metrics.pages_used + metrics.pages_reserved, 1);
    run(&mut scheduler);
    assert_clean(&scheduler);
}

#[test]
fn a_request_that_does_not_fit_waits_until_pages_are_freed() {
    let setup = Setup {
        kv_pages: 9, // 8 usable pages
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let big = spec(100, 10, 0); // 7 pages + 1
    let small = spec(10, 10, 1);
    scheduler.submit(big.clone()).unwrap();
    scheduler.submit(small.clone()).unwrap();
    let mut transcript = Transcript::default();
    step(&mut scheduler, &mut transcript);
    assert_eq!(transcript.get(RequestId(0)).admitted, 1);
    assert_eq!(transcript.get(RequestId(1)).admitted, 0);
    assert_eq!(scheduler.metrics().queue_depth, 1);
    transcript.run(&mut scheduler, 10_000).unwrap();
    assert_eq!(
        transcript.get(RequestId(1)).tokens,
        reference(&setup, &small).tokens
    );
    assert_eq!(
        transcript.get(RequestId(0)).tokens,
        reference(&setup, &big).tokens
    );
    assert_clean(&scheduler);
}

/// A running request holding 6 of 12 pages, a blocked 6-page request and
/// two 2-page requests behind it; returns the order of first admissions.
fn blocked_queue(max_bypass: u32) -> Vec<RequestId> {
    let setup = Setup {
        kv_pages: 13,
        config: SchedulerConfig {
            max_bypass,
            ..SchedulerConfig::default()
        },
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    scheduler.submit(spec(80, 30, 0)).unwrap(); // 5 + 1 pages
    scheduler.submit(spec(80, 30, 1)).unwrap(); // blocked behind it
    scheduler.submit(spec(10, 30, 2)).unwrap(); // 1 + 1 pages
    scheduler.submit(spec(10, 30, 3)).unwrap(); // 1 + 1 pages
    let mut transcript = Transcript::default();
    let mut order = Vec::new();
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
        let events = scheduler.drain_events();
        order.extend(admission_order(&events));
        transcript.record(events);
    }
    assert_clean(&scheduler);
    for id in 0..4 {
        let log = transcript.get(RequestId(id));
        assert_eq!((log.terminal_events, log.protocol_errors), (1, 0));
    }
    order
}

#[test]
fn smaller_requests_pass_a_blocked_reservation() {
    assert_eq!(blocked_queue(8), ids(&[0, 2, 3, 1]));
}

#[test]
fn a_request_bypassed_max_bypass_times_blocks_the_queue() {
    assert_eq!(blocked_queue(1), ids(&[0, 2, 1, 3]));
    assert_eq!(blocked_queue(0), ids(&[0, 1, 2, 3]));
}

#[test]
fn a_request_larger_than_the_pool_fails_admission() {
    let setup = Setup {
        kv_pages: 9,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    // 120 tokens: 8 pages, plus one page of output.
    let error = scheduler.submit(spec(120, 10, 0)).unwrap_err();
    assert_eq!(
        error,
        AdmissionError::ExceedsPool {
            required_pages: 9,
            usable_pages: 8
        }
    );
    assert_eq!(error.class(), ErrorClass::Unavailable);
    // Exactly the pool fits: 112 tokens, 7 pages + 1.
    scheduler.submit(spec(112, 10, 0)).unwrap();
    run(&mut scheduler);
    assert_clean(&scheduler);
}

#[test]
fn the_admission_queue_is_bounded() {
    let setup = Setup {
        config: SchedulerConfig {
            queue_capacity: 2,
            ..SchedulerConfig::default()
        },
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    scheduler.submit(spec(5, 5, 0)).unwrap();
    scheduler.submit(spec(5, 5, 1)).unwrap();
    assert_eq!(
        scheduler.submit(spec(5, 5, 2)),
        Err(AdmissionError::QueueFull { capacity: 2 })
    );
    scheduler.step().unwrap(); // both admitted: the queue is empty again
    scheduler.submit(spec(5, 5, 2)).unwrap();
    run(&mut scheduler);
    assert_clean(&scheduler);
}

#[test]
fn requests_outside_the_contract_are_rejected_with_typed_errors() {
    let setup = Setup::default(); // vocabulary 64, context limit 1024
    let mut scheduler = setup.scheduler();
    let mut empty = spec(1, 5, 0);
    empty.prompt.clear();
    let mut outside = spec(4, 5, 0);
    outside.prompt[2] = 64;
    let mut cold = spec(4, 5, 0);
    cold.sampling = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let cases = [
        (empty, AdmissionError::EmptyPrompt),
        (spec(4, 0, 0), AdmissionError::ZeroOutputBudget),
        (
            outside,
            AdmissionError::TokenOutsideVocabulary {
                position: 2,
                token: 64,
                vocab_size: 64,
            },
        ),
        (
            spec(1000, 25, 0),
            AdmissionError::ExceedsContext {
                prompt_tokens: 1000,
                max_new_tokens: 25,
                context_limit: 1024,
            },
        ),
        (
            cold,
            AdmissionError::InvalidSampling {
                field: "temperature",
                reason: "must be finite and greater than 0",
            },
        ),
    ];
    for (request, expected) in cases {
        let error = scheduler.submit(request).unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(error.class(), ErrorClass::InvalidRequest);
    }
    assert!(scheduler.is_idle());
    assert!(scheduler.drain_events().is_empty());
}

#[test]
fn admitted_is_sent_once_even_across_readmissions() {
    let setup = Setup {
        kv_pages: 7,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    for seed in 0..3 {
        scheduler.submit(spec(20, 60, seed)).unwrap();
    }
    let transcript = run(&mut scheduler);
    assert!(scheduler.metrics().preemptions > 0);
    for log in transcript.requests.values() {
        assert_eq!((log.admitted, log.protocol_errors), (1, 0));
    }
    let admitted = (transcript.requests.values())
        .filter(|log| log.admitted == 1)
        .count();
    assert_eq!(admitted, 3);
    assert_clean(&scheduler);
}
