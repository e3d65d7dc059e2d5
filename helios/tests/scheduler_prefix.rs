//! The scheduler with exact prefix checkpoints, over the test executor:
//! whole-prompt hits resume without prefill, appended tool results prefill
//! only their new tokens, branches share their ancestor's pages and write
//! only private ones, preempted requests readmit from their terminal
//! checkpoint, and eviction and thinning recover pages and rows. Every
//! output must equal the fake model's reference (a restore that copied the
//! wrong bytes, or a shared page that was written, changes the tokens or is
//! flagged by the executor), and nothing leaks.

mod scheduler_support;

use helios::prefix::RowLayout;
use helios::scheduler::test_executor::{Corruption, TestExecutor, Transcript};
use helios::scheduler::{
    Event, ExecutionError, InvalidRecord, Launch, Operation, OperationKind, RequestId, RequestSpec,
    Scheduler,
};
use scheduler_support::{
    agent_turns, assert_clean, count, dense_row, prefilled, prompt, reference, reference_for, run,
    serve_checked, spec, Setup, AGENT_HEADER,
};

/// The default setup with `page_size`-token pages, room for long prompts,
/// and the cache over `rows` rows.
fn setup(page_size: u32, rows: u32, layout: RowLayout) -> Setup {
    Setup {
        page_size,
        prefill_capacities: vec![64, 128],
        context_limit: 4096,
        kv_pages: 4096 / page_size * 6 + 1,
        ..Setup::default()
    }
    .with_cache(rows, layout)
}

/// Submits `request`, runs to idle, and returns its id and the launches it
/// caused.
fn serve(
    scheduler: &mut Scheduler<TestExecutor>,
    request: &RequestSpec,
) -> (RequestId, Vec<Launch>) {
    let before = scheduler.executor().log().len();
    let id = scheduler.submit(request.clone()).unwrap();
    let mut transcript = Transcript::default();
    transcript.run(scheduler, 100_000).unwrap();
    let log = transcript.get(id);
    assert!(log.failure.is_none(), "{log:?}");
    (id, scheduler.executor().log()[before..].to_vec())
}

fn with_seed(mut request: RequestSpec, seed: u64) -> RequestSpec {
    request.seed = seed;
    request
}

#[test]
fn a_repeated_prompt_restores_and_resumes_without_prefill() {
    for page_size in [64, 128, 256] {
        let setup = setup(page_size, 16, dense_row());
        let mut scheduler = setup.scheduler();
        // 300 tokens: unaligned for every page size, so the restore writes a
        // private tail page.
        let first = spec(300, 8, 1);
        let launches = serve_checked(&setup, &mut scheduler, &first);
        // Prompt and terminal captures.
        assert_eq!(
            count(&launches, OperationKind::Snapshot),
            2,
            "page {page_size}"
        );
        let again = with_seed(first.clone(), 2);
        let launches = serve_checked(&setup, &mut scheduler, &again);
        assert_eq!(prefilled(&launches), 0, "page {page_size}");
        assert_eq!(count(&launches, OperationKind::Restore), 1);
        assert_eq!(count(&launches, OperationKind::Resume), 1);
        let Operation::Admit(admit) = &launches[0].operation else {
            panic!("the admit comes first: {:?}", launches[0]);
        };
        // Fresh sampling state over the whole prompt's histogram.
        assert_eq!(
            (admit.consumed, admit.prompt.len(), admit.seed),
            (300, 300, 2)
        );
        let metrics = scheduler.metrics();
        assert_eq!(metrics.cache.unwrap().counters.hit_tokens, 300);
        // Only the first request prefilled its prompt.
        assert_eq!(metrics.prefilled_tokens, 300);
        assert_clean(&scheduler);
    }
}

#[test]
fn an_appended_tool_result_prefills_only_the_new_tokens() {
    for page_size in [64, 128, 256] {
        let setup = setup(page_size, 16, dense_row());
        let mut scheduler = setup.scheduler();
        let mut turn = spec(500, 24, 3);
        turn.message_endpoints = vec![100, 260];
        let (id, _) = serve(&mut scheduler, &turn);
        let _ = id;
        let output = reference(&setup, &turn).tokens;
        // The next turn: the whole assistant message, then a tool result.
        let mut next = turn.prompt.clone();
        next.extend(&output);
        next.extend(prompt(150, 9));
        let next = RequestSpec {
            prompt: next,
            message_endpoints: vec![100, 260, 500 + 24],
            ..spec(1, 16, 4)
        };
        let launches = serve_checked(&setup, &mut scheduler, &next);
        // The terminal checkpoint covers everything but the last output
        // token, which was never consumed.
        assert_eq!(prefilled(&launches), 1 + 150, "page {page_size}");
        assert_eq!(count(&launches, OperationKind::Restore), 1);
        assert_eq!(
            scheduler.metrics().cache.unwrap().counters.hit_tokens,
            500 + 24 - 1
        );
        assert_clean(&scheduler);
    }
}

#[test]
fn message_checkpoints_serve_a_conversation_that_diverges_after_them() {
    let setup = setup(64, 32, dense_row());
    let mut scheduler = setup.scheduler();
    let mut first = spec(700, 4, 5);
    first.message_endpoints = vec![130, 400, 650];
    let launches = serve_checked(&setup, &mut scheduler, &first);
    // Budget 8 per request: terminal, prompt and all three messages.
    assert_eq!(count(&launches, OperationKind::Snapshot), 5);
    // Chunks stop exactly at each captured endpoint.
    let mut consumed = 0;
    let mut snapshots_at = Vec::new();
    for launch in &launches {
        match &launch.operation {
            Operation::PrefillChunk(chunk) => consumed += chunk.tokens.len(),
            Operation::Snapshot(_) => snapshots_at.push(consumed),
            _ => {}
        }
    }
    assert_eq!(snapshots_at[..4], [130, 400, 650, 700]);
    // Same conversation up to token 400, different afterwards.
    let mut prompt_tokens = first.prompt[..400].to_vec();
    prompt_tokens.extend(prompt(90, 77));
    let branch = RequestSpec {
        prompt: prompt_tokens,
        ..spec(1, 6, 6)
    };
    let launches = serve_checked(&setup, &mut scheduler, &branch);
    assert_eq!(prefilled(&launches), 90);
    assert_clean(&scheduler);
}

#[test]
fn concurrent_branches_share_their_ancestor_and_write_only_private_pages() {
    for page_size in [16, 64] {
        let setup = Setup {
            page_size,
            context_limit: 2048,
            kv_pages: 2048 / page_size * 8 + 1,
            ..Setup::default()
        }
        .with_cache(16, dense_row());
        let mut scheduler = setup.scheduler();
        let mut root = spec(330, 2, 7);
        root.message_endpoints = vec![300];
        serve_checked(&setup, &mut scheduler, &root);
        let branches: Vec<RequestSpec> = (0..4)
            .map(|i| {
                let mut tokens = root.prompt[..300].to_vec();
                tokens.extend(prompt(20 + 7 * i, 100 + i as u64));
                RequestSpec {
                    prompt: tokens,
                    ..spec(1, 40, 20 + i as u64)
                }
            })
            .collect();
        let ids: Vec<RequestId> = (branches.iter())
            .map(|request| scheduler.submit(request.clone()).unwrap())
            .collect();
        let transcript = run(&mut scheduler);
        for (id, request) in ids.iter().zip(&branches) {
            assert_eq!(
                transcript.get(*id).tokens,
                reference(&setup, request).tokens
            );
        }
        let cache = scheduler.metrics().cache.unwrap();
        assert_eq!(cache.counters.hits, 4, "page {page_size}");
        assert_eq!(cache.counters.hit_tokens, 4 * 300);
        // The executor flags any write to a page two page tables map.
        assert_clean(&scheduler);
    }
}

#[test]
fn a_recurrent_row_layout_schedules_exactly_like_the_dense_one() {
    let recurrent = RowLayout::new([
        ("recurrent_state", 64 * 128 * 128 * 4),
        ("conv_history", 4096),
    ])
    .unwrap();
    let mut logs = Vec::new();
    for layout in [dense_row(), recurrent] {
        let setup = setup(64, 8, layout);
        let mut scheduler = setup.scheduler();
        let mut first = spec(200, 5, 1);
        first.message_endpoints = vec![70, 150];
        serve_checked(&setup, &mut scheduler, &first);
        serve_checked(&setup, &mut scheduler, &with_seed(first, 9));
        assert_clean(&scheduler);
        logs.push(scheduler.executor().log().to_vec());
    }
    assert_eq!(logs[0], logs[1]);
}

#[test]
fn preempted_requests_readmit_from_their_terminal_checkpoint() {
    // Pools tight enough to preempt; in the larger ones the terminal
    // checkpoint survives until the readmission, in the smaller ones page
    // pressure evicts it and the readmission restores the prompt's.
    let mut past_the_prompt = false;
    for (delay, kv_pages) in [(0, 17), (2, 17), (0, 19), (2, 19)] {
        let setup = Setup {
            kv_pages,
            ..Setup::default()
        }
        .with_cache(8, dense_row());
        let mut scheduler = setup.scheduler();
        scheduler.executor_mut().set_completion_delay(delay);
        let requests: Vec<_> = (0..4).map(|seed| spec(20, 60, seed)).collect();
        let ids: Vec<RequestId> = (requests.iter())
            .map(|request| scheduler.submit(request.clone()).unwrap())
            .collect();
        let transcript = run(&mut scheduler);
        assert!(scheduler.metrics().preemptions > 0);
        for (id, request) in ids.iter().zip(&requests) {
            let log = transcript.get(*id);
            let expected = reference_for(&setup, request, &log);
            let end = log.tokens.len();
            assert_eq!(log.tokens, expected.tokens[..end], "{id}: {log:?}");
        }
        let counts = scheduler.executor().counts();
        assert!(counts.restore > 0, "no readmission restored: {counts:?}");
        let hit_tokens = scheduler.metrics().cache.unwrap().counters.hit_tokens;
        assert!(hit_tokens > 0);
        past_the_prompt |= hit_tokens > 20 * counts.restore;
        assert_clean(&scheduler);
    }
    assert!(
        past_the_prompt,
        "no readmission restored a terminal checkpoint"
    );
}

#[test]
fn page_pressure_evicts_cold_checkpoints_before_waiting() {
    let setup = Setup {
        kv_pages: 40,
        ..Setup::default()
    }
    .with_cache(64, dense_row());
    let mut scheduler = setup.scheduler();
    for seed in 0..12 {
        let mut request = spec(150, 10, 100 + seed);
        request.message_endpoints = vec![50, 100];
        serve_checked(&setup, &mut scheduler, &request);
    }
    let cache = scheduler.metrics().cache.unwrap();
    assert!(cache.counters.evicted > 0, "{cache:?}");
    assert!(cache.counters.page_pressure > 0);
    assert!(cache.pages_held <= 39);
    assert_clean(&scheduler);
}

#[test]
fn snapshot_pressure_thins_chains_before_evicting_endpoints() {
    // One slot and three rows: each request may capture three endpoints.
    let setup = Setup {
        decode_capacities: vec![1],
        ..setup(64, 3, dense_row())
    }
    .with_cache(3, dense_row());
    let mut scheduler = setup.scheduler();
    let mut first = spec(900, 3, 1);
    first.message_endpoints = vec![100, 300, 500, 700];
    let launches = serve_checked(&setup, &mut scheduler, &first);
    // The message nearest the middle of the prompt, the prompt, the terminal.
    let store = scheduler.checkpoints().unwrap();
    let tokens = |store: &helios::prefix::CheckpointStore| -> Vec<u32> {
        let mut tokens: Vec<u32> = (store.ids())
            .map(|id| store.checkpoint(id).unwrap().tokens())
            .collect();
        tokens.sort_unstable();
        tokens
    };
    assert_eq!(tokens(store), [500, 900, 902]);
    assert_eq!(count(&launches, OperationKind::Snapshot), 3);
    let mut second = spec(400, 3, 2);
    second.message_endpoints = vec![200];
    serve_checked(&setup, &mut scheduler, &second);
    let store = scheduler.checkpoints().unwrap();
    // Each of the second request's captures found the pool full. The first
    // thinned the interior 900 (between 500 and 902); the next two found no
    // interior checkpoint and thinned the roots whose child is nearest, 500
    // into 902 and then 200 into 400. Nothing was evicted: every endpoint
    // still reaches its pages.
    assert_eq!(tokens(store), [400, 402, 902]);
    let counters = store.metrics();
    assert_eq!((counters.thinned, counters.evicted), (3, 0));
    assert_eq!(counters.snapshot_pressure, 3);
    assert_clean(&scheduler);
}

#[test]
fn a_restore_that_does_not_apply_fails_only_its_request() {
    let setup = setup(64, 16, dense_row());
    let mut scheduler = setup.scheduler();
    let first = spec(100, 4, 1);
    serve_checked(&setup, &mut scheduler, &first);
    scheduler
        .executor_mut()
        .corrupt_next(OperationKind::Restore, Corruption::Status(0));
    let id = scheduler.submit(with_seed(first.clone(), 2)).unwrap();
    let other = spec(80, 6, 3);
    let other_id = scheduler.submit(other.clone()).unwrap();
    let transcript = run(&mut scheduler);
    let log = transcript.get(id);
    assert!(
        matches!(
            log.failure,
            Some(ExecutionError::InvalidRecord(InvalidRecord::Maintenance {
                operation: "restore",
                status: Some(0)
            }))
        ),
        "{log:?}"
    );
    assert_eq!(
        transcript.get(other_id).tokens,
        reference(&setup, &other).tokens
    );
    assert_eq!(scheduler.metrics().failed, 1);
    assert_clean_except_failed(&scheduler);
}

/// [`assert_clean`] for a run with one failed request.
fn assert_clean_except_failed(scheduler: &Scheduler<TestExecutor>) {
    assert!(scheduler.executor().violations().is_empty());
    let store = scheduler.checkpoints().unwrap();
    store.verify().unwrap();
    assert_eq!(store.outstanding(), Default::default());
    let metrics = scheduler.metrics();
    let cached = metrics.cache.unwrap().pages_held;
    assert_eq!(metrics.pages_used, cached);
    assert_eq!(metrics.pages_reserved, 0);
}

#[test]
fn invalid_message_endpoints_are_rejected_at_submission() {
    let setup = setup(64, 16, dense_row());
    let mut scheduler = setup.scheduler();
    for endpoints in [vec![0], vec![50, 50], vec![60, 40], vec![100]] {
        let mut request = spec(100, 4, 1);
        request.message_endpoints = endpoints;
        assert!(scheduler.submit(request).is_err());
    }
    let events = scheduler.drain_events();
    assert!(events
        .iter()
        .all(|e| !matches!(e.event, Event::Admitted { .. })));
}

#[test]
fn cancelling_everything_while_snapshots_are_in_flight_leaks_nothing() {
    for delay in [0, 3] {
        let setup = setup(64, 16, dense_row());
        let mut scheduler = setup.scheduler();
        scheduler.executor_mut().set_completion_delay(delay);
        let mut ids = Vec::new();
        for seed in 0..4 {
            let mut request = spec(300, 40, seed);
            request.message_endpoints = vec![100, 200];
            ids.push(scheduler.submit(request).unwrap());
        }
        // Step until a snapshot is in flight, then cancel every request (what a
        // shutdown that cancels does).
        let mut transcript = Transcript::default();
        let mut steps = 0;
        loop {
            scheduler.step().unwrap();
            transcript.record(scheduler.drain_events());
            let log = scheduler.executor().log();
            let last = log.last().map(|launch| launch.operation.kind());
            if last == Some(OperationKind::Snapshot) && scheduler.executor().in_flight() > 0 {
                break;
            }
            steps += 1;
            assert!(steps < 1000, "no snapshot was ever in flight");
        }
        for &id in &ids {
            scheduler.cancel(id);
        }
        transcript.run(&mut scheduler, 10_000).unwrap();
        for &id in &ids {
            assert_eq!(transcript.get(id).terminal_events, 1);
        }
        // Captures whose request was cancelled before they completed are not
        // published: their rows went back.
        assert_clean(&scheduler);
    }
}

/// The benchmark agent trace's setup: 64-token pages, room for 16K-token
/// conversations, the cache over `rows` rows.
fn agent_setup(rows: u32) -> Setup {
    Setup {
        page_size: 64,
        prefill_capacities: vec![64, 128],
        context_limit: 16384,
        kv_pages: 16384 / 64 * 4 + 1,
        ..Setup::default()
    }
    .with_cache(rows, dense_row())
}

/// Over many turns, with the pool under snapshot pressure, every turn of the
/// agent trace must prefill only what it appended and the header.
#[test]
fn an_agent_trace_prefills_only_each_turns_new_messages() {
    for rows in [16, 8] {
        let setup = agent_setup(rows);
        let mut scheduler = setup.scheduler();
        let (_, launched) = agent_turns(&setup, &mut scheduler, 30);
        let turn_prefills: Vec<usize> = launched.iter().map(|l| prefilled(l)).collect();
        for (turn, &prefilled) in turn_prefills.iter().enumerate().skip(1) {
            let appended = 20 + 150 + ((turn - 1) * 37) % 200;
            assert!(
                prefilled <= appended + AGENT_HEADER.len(),
                "rows {rows}, turn {turn}: prefilled {prefilled} for {appended} appended: \
                 {turn_prefills:?}"
            );
        }
        assert_clean(&scheduler);
    }
}

/// A branch of the trace's middle turn (another tool call and result after
/// that turn's prompt), sent after 30 turns, restores the whole history it
/// shares when the pool holds the conversation's checkpoints (the prepared
/// default is 32 rows per concurrent request: 128 here). Each turn left a
/// terminal checkpoint the next prompt does not extend, so every prompt
/// checkpoint has two children and none can be thinned: under a small pool
/// the design's rules evict from the oldest turn on, and the branch would
/// find nothing.
#[test]
fn a_branch_of_an_earlier_turn_restores_the_history_it_shares() {
    let setup = agent_setup(128);
    let mut scheduler = setup.scheduler();
    let (prompts, _) = agent_turns(&setup, &mut scheduler, 30);
    let shared = &prompts[15];
    let mut branch = shared.clone();
    branch.extend(prompt(20, 5000));
    let call_end = branch.len() as u32;
    branch.extend(prompt(200, 6000));
    let result_end = branch.len() as u32;
    branch.extend(AGENT_HEADER);
    let request = RequestSpec {
        prompt: branch.clone(),
        message_endpoints: vec![call_end, result_end],
        ..spec(1, 16, 99)
    };
    let launches = serve_checked(&setup, &mut scheduler, &request);
    assert_eq!(prefilled(&launches), branch.len() - shared.len());
    assert_eq!(count(&launches, OperationKind::Restore), 1);
    assert_clean(&scheduler);
}

/// A queued request that would not fit even with every cached page evicted
/// leaves the cache alone while it waits (admission retries it every
/// iteration); once the running request ends it is admitted.
#[test]
fn a_request_that_cannot_fit_does_not_drain_the_cache_while_it_waits() {
    let setup = Setup {
        kv_pages: 41,
        ..Setup::default()
    }
    .with_cache(16, dense_row());
    let mut scheduler = setup.scheduler();
    serve_checked(&setup, &mut scheduler, &spec(100, 2, 1));
    let cached = scheduler.metrics().cache.unwrap().pages_held;
    assert!(cached > 0);
    let running = spec(200, 150, 2);
    let waiting = spec(400, 4, 3);
    let running_id = scheduler.submit(running.clone()).unwrap();
    let mut transcript = Transcript::default();
    for _ in 0..20 {
        scheduler.step().unwrap();
        transcript.record(scheduler.drain_events());
    }
    let waiting_id = scheduler.submit(waiting.clone()).unwrap();
    let mut waited = 0;
    while transcript.get(waiting_id).admitted == 0 {
        scheduler.step().unwrap();
        transcript.record(scheduler.drain_events());
        let metrics = scheduler.metrics();
        if metrics.queue_depth == 1 {
            waited += 1;
            assert_eq!(metrics.cache.unwrap().counters.evicted, 0, "{metrics:?}");
        }
        assert!(waited < 10_000);
    }
    assert!(waited > 10, "the request never had to wait");
    transcript.run(&mut scheduler, 100_000).unwrap();
    for (id, request) in [(running_id, &running), (waiting_id, &waiting)] {
        assert_eq!(transcript.get(id).tokens, reference(&setup, request).tokens);
    }
    assert_clean(&scheduler);
}
