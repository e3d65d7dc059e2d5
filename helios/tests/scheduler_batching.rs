//! Prefill chunks, decode batches and their capacities.

mod scheduler_support;

use helios::scheduler::{Operation, PrefillChunk, Slot};
use scheduler_support::{assert_clean, reference, run, spec, Setup};

#[test]
fn a_single_request_produces_the_reference_continuation() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    let request = spec(20, 30, 7);
    let id = scheduler.submit(request.clone()).unwrap();
    let transcript = run(&mut scheduler);
    let log = transcript.get(id);
    let expected = reference(&setup, &request);
    assert_eq!(log.tokens, expected.tokens);
    assert_eq!(log.finish, Some(expected.reason));
    assert_eq!(
        (log.admitted, log.terminal_events, log.protocol_errors),
        (1, 1, 0)
    );
    assert_clean(&scheduler);
}

#[test]
fn long_prompts_prefill_in_bounded_chunks_at_captured_capacities() {
    let setup = Setup::default(); // prefill capacities 32 and 64
    let mut scheduler = setup.scheduler();
    let request = spec(150, 3, 1);
    scheduler.submit(request.clone()).unwrap();
    run(&mut scheduler);
    let chunks: Vec<&PrefillChunk> = (scheduler.executor().log().iter())
        .filter_map(|launch| match &launch.operation {
            Operation::PrefillChunk(chunk) => Some(chunk),
            _ => None,
        })
        .collect();
    let shape: Vec<(usize, u32, bool)> = (chunks.iter())
        .map(|c| (c.tokens.len(), c.capacity, c.samples))
        .collect();
    assert_eq!(shape, [(64, 64, false), (64, 64, false), (22, 32, true)]);
    let prefilled: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.clone()).collect();
    assert_eq!(prefilled, request.prompt);
    assert!(chunks.iter().all(|c| c.slot == Slot(1)));
    assert_clean(&scheduler);
}

#[test]
fn one_prefill_chunk_runs_between_decode_batches() {
    let setup = Setup::default();
    let mut scheduler = setup.scheduler();
    let short = spec(10, 40, 1);
    let long = spec(300, 5, 2);
    let first = scheduler.submit(short.clone()).unwrap();
    scheduler.step().unwrap(); // the short request prefills and starts decoding
    let second = scheduler.submit(long.clone()).unwrap();
    let transcript = run(&mut scheduler);
    let kinds: Vec<&Operation> = (scheduler.executor().log().iter())
        .map(|launch| &launch.operation)
        .collect();
    let chunks_of_long = kinds
        .iter()
        .filter(|op| matches!(op, Operation::PrefillChunk(c) if c.slot == Slot(2)))
        .count();
    assert_eq!(chunks_of_long, 5); // 300 tokens in chunks of at most 64
    for pair in kinds.windows(2) {
        let both_chunks = pair
            .iter()
            .all(|op| matches!(op, Operation::PrefillChunk(_)));
        assert!(
            !both_chunks,
            "two prefill chunks without a decode between them"
        );
    }
    assert_eq!(
        transcript.get(first).tokens,
        reference(&setup, &short).tokens
    );
    assert_eq!(
        transcript.get(second).tokens,
        reference(&setup, &long).tokens
    );
    assert_clean(&scheduler);
}

#[test]
fn decode_steps_use_the_smallest_capacity_padded_with_the_null_slot() {
    let setup = Setup::default(); // decode capacities 1, 2, 4
    let mut scheduler = setup.scheduler();
    let requests: Vec<_> = (0..3).map(|i| spec(5, 10 + 5 * i, i.into())).collect();
    for request in &requests {
        scheduler.submit(request.clone()).unwrap();
    }
    let transcript = run(&mut scheduler);
    let mut capacities_seen = Vec::new();
    for launch in scheduler.executor().log() {
        let Operation::Decode(decode) = &launch.operation else {
            continue;
        };
        let live = decode.slots.iter().filter(|s| !s.is_null()).count() as u32;
        let expected = [1, 2, 4].into_iter().find(|&c| c >= live).unwrap();
        assert_eq!(decode.capacity, expected);
        assert_eq!(decode.slots.len(), decode.capacity as usize);
        let padding = &decode.slots[live as usize..];
        assert!(padding.iter().all(|s| s.is_null()), "{:?}", decode.slots);
        capacities_seen.push(decode.capacity);
    }
    for capacity in [1, 2, 4] {
        assert!(capacities_seen.contains(&capacity), "{capacities_seen:?}");
    }
    for (index, request) in requests.iter().enumerate() {
        let log = transcript.get(helios::scheduler::RequestId(index as u64));
        assert_eq!(log.tokens, reference(&setup, request).tokens);
    }
    assert_clean(&scheduler);
}

#[test]
fn a_prompt_that_fills_its_pages_exactly_grows_at_the_first_decode() {
    let setup = Setup::default(); // 16-token pages
    let mut scheduler = setup.scheduler();
    let request = spec(64, 40, 3);
    let id = scheduler.submit(request.clone()).unwrap();
    let transcript = run(&mut scheduler);
    assert_eq!(
        transcript.get(id).tokens,
        reference(&setup, &request).tokens
    );
    assert_clean(&scheduler);
}
