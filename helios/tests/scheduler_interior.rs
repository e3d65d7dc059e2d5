//! Message checkpoints inside chunks, on a core whose continuation is
//! positional KV alone: chunks no longer stop at message endpoints; after
//! the chunk holding one, an admit back to the endpoint, a snapshot and an
//! admit back to the chunk's end capture it, published for extension only.
//! A chunk that ends the prompt samples through a resume before the
//! captures (its token is handed out without waiting for them) and a
//! resample after them gives the decode the sampled state back. Outputs stay
//! the fake model's references, and the test executor flags a resume from a
//! hidden vector that is not the slot's consumed count's, so a request
//! whose whole history an extension-only checkpoint covers must not resume
//! from it.

mod scheduler_support;

use helios::scheduler::test_executor::TestExecutor;
use helios::scheduler::{Launch, Operation, OperationKind, RequestSpec, Scheduler};
use scheduler_support::{
    agent_turns, assert_clean, count, dense_row, prefilled, prompt, serve_checked, spec, Setup,
    AGENT_HEADER,
};

/// 16-token pages, chunks of at most 128 tokens, 32 rows over 4 slots (8
/// captures a request), on a positional-KV core or not.
fn setup(positional_kv: bool) -> Setup {
    let setup = Setup {
        prefill_capacities: vec![64, 128],
        context_limit: 4096,
        kv_pages: 4096 / 16 * 4 + 1,
        ..Setup::default()
    };
    if positional_kv {
        setup.with_positional_kv_cache(32, dense_row())
    } else {
        setup.with_cache(32, dense_row())
    }
}

/// The launches' operations in order, as (kind, the admit's consumed count
/// or the chunk's length).
fn sequence(launches: &[Launch]) -> Vec<(OperationKind, usize)> {
    (launches.iter())
        .map(|launch| {
            let detail = match &launch.operation {
                Operation::Admit(admit) => admit.consumed as usize,
                Operation::PrefillChunk(chunk) => chunk.tokens.len(),
                _ => 0,
            };
            (launch.operation.kind(), detail)
        })
        .collect()
}

/// The cached checkpoints as (tokens, extension only), ascending.
fn checkpoints(scheduler: &Scheduler<TestExecutor>) -> Vec<(u32, bool)> {
    let store = scheduler.checkpoints().unwrap();
    let mut all: Vec<(u32, bool)> = (store.ids())
        .map(|id| store.checkpoint(id).unwrap())
        .map(|info| (info.tokens(), info.extension_only))
        .collect();
    all.sort_unstable();
    all
}

fn conversation() -> RequestSpec {
    let mut request = spec(120, 4, 5);
    request.message_endpoints = vec![30, 70];
    request
}

#[test]
fn message_endpoints_are_captured_after_the_one_chunk_that_holds_them() {
    use OperationKind::{Admit, Decode, PrefillChunk as Prefill, Resume, Snapshot};
    let setup = setup(true);
    let mut scheduler = setup.scheduler();
    let launches = serve_checked(&setup, &mut scheduler, &conversation());
    let prefill_and_captures = [
        (Admit, 0),
        (Prefill, 120),
        (Resume, 0),
        (Admit, 30),
        (Snapshot, 0),
        (Admit, 70),
        (Snapshot, 0),
        (Admit, 120),
        (Resume, 0),
        (Snapshot, 0),
    ];
    let sequence = sequence(&launches);
    assert_eq!(sequence[..10], prefill_and_captures, "{sequence:?}");
    // Four output tokens: three decode steps, then the terminal capture.
    assert_eq!(
        sequence[10..],
        [(Decode, 0), (Decode, 0), (Decode, 0), (Snapshot, 0)]
    );
    let Operation::PrefillChunk(chunk) = &launches[1].operation else {
        unreachable!()
    };
    assert!(!chunk.samples, "a resume samples, before the captures");
    // The first token's split places the resume as its sampling launch, once,
    // however many resamples follow the captures.
    let split = scheduler.first_token();
    assert_eq!(split.to_sampling_launch.count(), 1);
    assert_eq!(split.sampling_to_record.count(), 1);
    // The message endpoints serve extensions only; the prompt and terminal
    // endpoints are exact.
    assert_eq!(
        checkpoints(&scheduler),
        [(30, true), (70, true), (120, false), (123, false)]
    );
    let counters = scheduler.metrics().cache.unwrap().counters;
    assert_eq!((counters.published, counters.extension_only), (4, 2));
    assert_clean(&scheduler);

    // A core with recurrent state stops its chunks at both endpoints.
    let setup = self::setup(false);
    let mut scheduler = setup.scheduler();
    let launches = serve_checked(&setup, &mut scheduler, &conversation());
    let chunks: Vec<usize> = (self::sequence(&launches).into_iter())
        .filter(|&(kind, _)| kind == Prefill)
        .map(|(_, len)| len)
        .collect();
    assert_eq!(chunks, [30, 40, 50]);
    assert_eq!(
        checkpoints(&scheduler),
        [(30, false), (70, false), (120, false), (123, false)]
    );
    assert_clean(&scheduler);
}

#[test]
fn the_first_token_is_handed_out_before_the_captures_inside_its_chunk() {
    // The captures after a chunk ending the prompt (an admit and a snapshot
    // per message endpoint, the admit back, the prompt end's snapshot) ran
    // before the resume that sampled the first token, and the iteration that
    // retrieved it waited for them before handing it out: on an H100,
    // SmolLM2's tool chats spent 2.03 ms on the model thread before their
    // first token, 1.61 ms once it came first.
    let setup = setup(true);
    let mut scheduler = setup.scheduler();
    scheduler.executor_mut().set_completion_delay(2);
    let request = conversation();
    let id = scheduler.submit(request.clone()).unwrap();
    let mut tokens = Vec::new();
    let mut steps = 0;
    while tokens.is_empty() {
        scheduler.step().unwrap();
        steps += 1;
        assert!(steps < 1_000, "no token came");
        for event in scheduler.drain_events() {
            if let helios::scheduler::Event::Tokens { tokens: new, .. } = event.event {
                assert_eq!(event.request, id);
                tokens.extend(new);
            }
        }
    }
    assert_eq!(tokens.len(), 1);
    assert_eq!(
        checkpoints(&scheduler),
        [],
        "the captures after the first token are still in flight"
    );
    // Still in flight: the four captures' launches, the admit back, the
    // resample, the prompt end's snapshot and the first decode step.
    assert_eq!(scheduler.metrics().in_flight, 8);
    // The rest of the request is the fake model's reference, and every
    // capture is published as when the token waited for them.
    let transcript = scheduler_support::run(&mut scheduler);
    let mut served = tokens;
    served.extend(&transcript.get(id).tokens);
    assert_eq!(
        served,
        scheduler_support::reference(&setup, &request).tokens
    );
    assert_eq!(
        checkpoints(&scheduler),
        [(30, true), (70, true), (120, false), (123, false)]
    );
    assert_clean(&scheduler);
}

#[test]
fn an_extension_only_checkpoint_is_extended_but_never_resumed_from() {
    let setup = setup(true);
    let mut scheduler = setup.scheduler();
    let first = conversation();
    serve_checked(&setup, &mut scheduler, &first);

    // The next turn extends the second message: it restores there and
    // prefills only what follows.
    let mut extended = first.prompt[..70].to_vec();
    extended.extend(prompt(50, 9));
    let next = RequestSpec {
        prompt: extended,
        ..spec(1, 4, 6)
    };
    let launches = serve_checked(&setup, &mut scheduler, &next);
    assert_eq!(prefilled(&launches), 50);
    assert_eq!(count(&launches, OperationKind::Restore), 1);

    // A prompt that is exactly the second message would resume from a
    // hidden vector of token 120: it restores the first message instead.
    // Its exact prompt capture is a duplicate: its row's tail over the
    // checkpoint's pages would mix two requests' computations.
    let exact = RequestSpec {
        prompt: first.prompt[..70].to_vec(),
        ..spec(1, 4, 7)
    };
    let duplicates = |scheduler: &Scheduler<TestExecutor>| {
        (scheduler.metrics().cache.unwrap().counters).duplicate_publications
    };
    let before = duplicates(&scheduler);
    for request in [exact.clone(), RequestSpec { seed: 8, ..exact }] {
        let launches = serve_checked(&setup, &mut scheduler, &request);
        assert_eq!(prefilled(&launches), 40);
        assert_eq!(count(&launches, OperationKind::Restore), 1);
        assert_eq!(count(&launches, OperationKind::Resume), 0);
    }
    assert!(duplicates(&scheduler) > before);
    assert!(checkpoints(&scheduler).contains(&(70, true)));
    // The executor saw no resume from a stale hidden vector.
    assert_clean(&scheduler);
}

/// The agent trace on a positional-KV core: every turn still prefills only
/// what it appended (the tool call, its result and the header), in as few
/// chunks as its length allows, where the core that stops at endpoints
/// needs more.
#[test]
fn an_agent_trace_prefills_each_turns_appends_in_the_fewest_chunks() {
    let chunks = |positional_kv: bool| {
        let setup = Setup {
            page_size: 64,
            prefill_capacities: vec![64, 128],
            context_limit: 16384,
            kv_pages: 16384 / 64 * 4 + 1,
            ..Setup::default()
        };
        let setup = if positional_kv {
            setup.with_positional_kv_cache(16, dense_row())
        } else {
            setup.with_cache(16, dense_row())
        };
        let mut scheduler = setup.scheduler();
        let (_, launched) = agent_turns(&setup, &mut scheduler, 20);
        let mut chunks = Vec::new();
        for (turn, launches) in launched.iter().enumerate().skip(1) {
            let appended = 20 + 150 + ((turn - 1) * 37) % 200 + AGENT_HEADER.len();
            assert_eq!(prefilled(launches), appended, "turn {turn}");
            chunks.push(count(launches, OperationKind::PrefillChunk));
        }
        assert_clean(&scheduler);
        chunks
    };
    let inside = chunks(true);
    let stopping = chunks(false);
    for (turn, (&inside, &stopping)) in inside.iter().zip(&stopping).enumerate() {
        let appended = 20 + 150 + (turn * 37) % 200 + AGENT_HEADER.len();
        assert_eq!(inside, appended.div_ceil(128), "turn {}", turn + 1);
        assert!(stopping > inside, "turn {}: {stopping} chunks", turn + 1);
    }
}
