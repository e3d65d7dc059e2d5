//! Stop tokens and output limits, enforced from device state.

mod scheduler_support;

use helios::scheduler::FinishReason;
use scheduler_support::{assert_clean, reference, run, spec, Setup, STOP};

#[test]
fn a_stop_token_finishes_the_request_with_reason_stop() {
    let setup = Setup {
        stop_every: Some(7),
        ..Setup::default()
    };
    let mut scheduler = setup.scheduler();
    let requests: Vec<_> = (0..6).map(|seed| spec(8, 500, seed)).collect();
    let ids: Vec<_> = (requests.iter())
        .map(|r| scheduler.submit(r.clone()).unwrap())
        .collect();
    let transcript = run(&mut scheduler);
    for (id, request) in ids.into_iter().zip(&requests) {
        let log = transcript.get(id);
        let expected = reference(&setup, request);
        assert_eq!(expected.reason, FinishReason::Stop);
        assert_eq!(log.finish, Some(FinishReason::Stop));
        assert_eq!(log.tokens, expected.tokens);
        assert_eq!(log.tokens.last(), Some(&STOP));
        assert_eq!(log.tokens.iter().filter(|&&t| t == STOP).count(), 1);
    }
    assert_clean(&scheduler);
}

#[test]
fn the_output_limit_finishes_the_request_with_reason_length() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    let request = spec(8, 5, 0);
    let id = scheduler.submit(request.clone()).unwrap();
    let transcript = run(&mut scheduler);
    let log = transcript.get(id);
    assert_eq!(log.finish, Some(FinishReason::Length));
    assert_eq!(log.tokens, reference(&setup, &request).tokens);
    assert_eq!(log.tokens.len(), 5);
    // One sample from the prefill, four decode steps.
    assert_eq!(scheduler.executor().counts().decode, 4);
    assert_clean(&scheduler);
}

#[test]
fn a_single_token_budget_is_met_by_the_prefill_sample_alone() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(2);
    let id = scheduler.submit(spec(40, 1, 0)).unwrap();
    let transcript = run(&mut scheduler);
    assert_eq!(transcript.get(id).tokens.len(), 1);
    assert_eq!(transcript.get(id).finish, Some(FinishReason::Length));
    assert_eq!(scheduler.executor().counts().decode, 0);
    assert_clean(&scheduler);
}

#[test]
fn no_decode_row_is_submitted_past_the_output_limit() {
    // With two steps in flight the host still never submits a row that can
    // only exceed the limit: the limit is known, unlike a stop token.
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(3);
    let ids: Vec<_> = (0..4)
        .map(|seed| scheduler.submit(spec(6, 9, seed)).unwrap())
        .collect();
    let transcript = run(&mut scheduler);
    let rows: usize = (scheduler.executor().log().iter())
        .filter_map(|launch| match &launch.operation {
            helios::scheduler::Operation::Decode(decode) => {
                Some(decode.slots.iter().filter(|s| !s.is_null()).count())
            }
            _ => None,
        })
        .sum();
    assert_eq!(rows, 4 * 8);
    for id in ids {
        assert_eq!(transcript.get(id).tokens.len(), 9);
    }
    assert_clean(&scheduler);
}
