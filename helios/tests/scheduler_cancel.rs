//! Cancellation at submission boundaries, and slot and page reuse only after
//! every launch that references them completed.

mod scheduler_support;

use helios::scheduler::test_executor::Transcript;
use helios::scheduler::{FinishReason, Operation, RequestId, Slot};
use scheduler_support::{assert_clean, reference, run, spec, step, Setup};

#[test]
fn a_cancelled_queued_request_finishes_without_admission() {
    let setup = Setup {
        kv_pages: 9,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let running = scheduler.submit(spec(100, 20, 0)).unwrap(); // the whole pool
    let queued = scheduler.submit(spec(10, 20, 1)).unwrap();
    let mut transcript = Transcript::default();
    step(&mut scheduler, &mut transcript);
    scheduler.cancel(queued);
    assert_eq!(
        scheduler.metrics().queue_depth,
        1,
        "applied at the boundary"
    );
    step(&mut scheduler, &mut transcript);
    let log = transcript.get(queued);
    assert_eq!(log.finish, Some(FinishReason::Cancelled));
    assert_eq!((log.admitted, log.terminal_events), (0, 1));
    assert!(log.tokens.is_empty());
    transcript.run(&mut scheduler, 10_000).unwrap();
    assert_eq!(transcript.get(running).terminal_events, 1);
    assert_clean(&scheduler);
}

#[test]
fn a_cancelled_running_request_keeps_its_slot_until_its_launches_complete() {
    let setup = Setup {
        decode_capacities: vec![1], // one slot
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(4);
    let first = scheduler.submit(spec(5, 100, 0)).unwrap();
    let mut transcript = Transcript::default();
    while transcript.get(first).tokens.len() < 5 {
        step(&mut scheduler, &mut transcript);
    }
    scheduler.cancel(first);
    let second_spec = spec(5, 10, 1);
    let second = scheduler.submit(second_spec.clone()).unwrap();
    step(&mut scheduler, &mut transcript);
    let log = transcript.get(first);
    assert_eq!(log.finish, Some(FinishReason::Cancelled));
    // The cancelled request's launches were in flight at the boundary, so
    // its slot and pages are still taken and the next request waits; the
    // test executor flags any admit into a slot an unfinished launch uses.
    let metrics = scheduler.metrics();
    assert_eq!((metrics.running, metrics.queue_depth), (0, 1));
    assert!(metrics.pages_used > 0);
    assert_eq!(transcript.get(second).admitted, 0);
    transcript.run(&mut scheduler, 10_000).unwrap();
    // Tokens of launches still in flight at cancellation are dropped: no
    // event follows the terminal one.
    let log = transcript.get(first);
    let expected = reference(&setup, &spec(5, 100, 0)).tokens;
    assert_eq!(log.tokens, expected[..log.tokens.len()]);
    assert_eq!((log.terminal_events, log.protocol_errors), (1, 0));
    assert_eq!(
        transcript.get(second).tokens,
        reference(&setup, &second_spec).tokens
    );
    let reused = scheduler.executor().log().iter().any(|launch| {
        matches!(&launch.operation, Operation::Admit(admit) if admit.seed == 1 && admit.slot == Slot(1))
    });
    assert!(reused);
    assert_clean(&scheduler);
}

#[test]
fn cancelling_a_finished_or_unknown_request_changes_nothing() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    let request = spec(5, 3, 0);
    let id = scheduler.submit(request.clone()).unwrap();
    let mut transcript = run(&mut scheduler);
    scheduler.cancel(id);
    scheduler.cancel(RequestId(77));
    scheduler.step().unwrap();
    transcript.record(scheduler.drain_events());
    let log = transcript.get(id);
    assert_eq!(log.finish, Some(FinishReason::Length));
    assert_eq!(log.terminal_events, 1);
    assert_eq!(log.tokens, reference(&setup, &request).tokens);
    assert_clean(&scheduler);
}

#[test]
fn cancelling_a_prefilling_request_stops_its_chunks() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    let id = scheduler.submit(spec(500, 10, 0)).unwrap();
    let mut transcript = Transcript::default();
    step(&mut scheduler, &mut transcript);
    step(&mut scheduler, &mut transcript);
    scheduler.cancel(id);
    transcript.run(&mut scheduler, 10_000).unwrap();
    let chunks = scheduler.executor().counts().prefill;
    assert!(chunks < 8, "{chunks} chunks of a 500-token prompt");
    assert_eq!(transcript.get(id).finish, Some(FinishReason::Cancelled));
    assert_clean(&scheduler);
}

#[test]
fn cancelling_a_preempted_request_ends_it_once() {
    let setup = Setup {
        kv_pages: 13,
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let ids: Vec<_> = (0..4)
        .map(|seed| scheduler.submit(spec(20, 60, seed)).unwrap())
        .collect();
    let mut transcript = Transcript::default();
    while scheduler.metrics().preemptions == 0 && !scheduler.is_idle() {
        step(&mut scheduler, &mut transcript);
    }
    for &id in &ids {
        scheduler.cancel(id);
    }
    transcript.run(&mut scheduler, 10_000).unwrap();
    for id in ids {
        let log = transcript.get(id);
        assert_eq!((log.terminal_events, log.protocol_errors), (1, 0));
        assert_eq!(log.finish, Some(FinishReason::Cancelled));
    }
    assert_clean(&scheduler);
}
