//! Shared setup of the scheduler tests: a small contract, the test executor
//! and a seeded generator.
#![allow(dead_code)] // each test crate uses a different part

use helios::core::proto::PreparedContract;
use helios::prefix::{Outstanding, RowLayout};
use helios::scheduler::test_executor::{
    FakeModel, Reference, RequestLog, TestExecutor, Transcript, Violation,
};
use helios::scheduler::{
    Geometry, Launch, Metrics, Operation, OperationKind, PrefixConfig, RequestId, RequestSpec,
    SamplingParams, Scheduler, SchedulerConfig,
};

/// The stop token of every test geometry.
pub const STOP: u32 = 2;

/// A contract and policy, changed one field at a time.
#[derive(Debug, Clone)]
pub struct Setup {
    pub page_size: u32,
    pub decode_capacities: Vec<u32>,
    pub prefill_capacities: Vec<u32>,
    pub context_limit: u32,
    pub kv_pages: u32,
    pub vocab_size: u32,
    pub stop_every: Option<u64>,
    pub config: SchedulerConfig,
    /// Snapshot rows of the test executor (the cache is enabled when the
    /// config's `prefix` names rows too).
    pub snapshot_rows: u32,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            page_size: 16,
            decode_capacities: vec![1, 2, 4],
            prefill_capacities: vec![32, 64],
            context_limit: 1024,
            kv_pages: 65,
            vocab_size: 64,
            stop_every: None,
            config: SchedulerConfig::default(),
            snapshot_rows: 0,
        }
    }
}

impl Setup {
    pub fn contract(&self) -> PreparedContract {
        PreparedContract {
            page_size: self.page_size,
            max_concurrency: *self.decode_capacities.last().unwrap(),
            context_limit: self.context_limit,
            prefill_chunk_size: *self.prefill_capacities.last().unwrap(),
            decode_capacities: self.decode_capacities.clone(),
            prefill_capacities: self.prefill_capacities.clone(),
            kv_pages: self.kv_pages,
            vocab_size: self.vocab_size,
            ..PreparedContract::default()
        }
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::from_contract(&self.contract(), &[STOP]).unwrap()
    }

    pub fn model(&self) -> FakeModel {
        FakeModel::new(&self.geometry(), self.stop_every)
    }

    pub fn executor(&self) -> TestExecutor {
        TestExecutor::with_snapshot_rows(&self.geometry(), self.model(), self.snapshot_rows)
    }

    /// This setup with the prefix cache over `rows` snapshot rows holding
    /// `layout`.
    pub fn with_cache(mut self, rows: u32, layout: RowLayout) -> Self {
        self.snapshot_rows = rows;
        self.config.prefix = Some(PrefixConfig {
            snapshot_rows: rows,
            layout,
            salt: b"test-core".to_vec(),
            positional_kv: false,
        });
        self
    }

    /// This setup with the prefix cache of [`Self::with_cache`] on a core
    /// whose continuation is positional KV alone: message endpoints are
    /// captured after the chunk that holds them.
    pub fn with_positional_kv_cache(self, rows: u32, layout: RowLayout) -> Self {
        let mut setup = self.with_cache(rows, layout);
        setup.config.prefix.as_mut().expect("a cache").positional_kv = true;
        setup
    }

    pub fn scheduler(&self) -> Scheduler<TestExecutor> {
        Scheduler::new(self.geometry(), self.config.clone(), self.executor()).unwrap()
    }
}

/// A prompt of `len` tokens derived from `seed`, avoiding the stop token.
pub fn prompt(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    (0..len).map(|_| 3 + rng.below(60) as u32).collect()
}

/// A request with a derived prompt.
pub fn spec(prompt_len: usize, max_new_tokens: u32, seed: u64) -> RequestSpec {
    RequestSpec {
        prompt: prompt(prompt_len, seed),
        max_new_tokens,
        sampling: SamplingParams::default(),
        seed,
        message_endpoints: Vec::new(),
        grammar: None,
    }
}

/// What `spec` must produce under `setup`'s model.
pub fn reference(setup: &Setup, spec: &RequestSpec) -> Reference {
    setup
        .model()
        .reference(&spec.prompt, spec.max_new_tokens, spec.seed)
}

/// What `spec` must produce under `setup`'s model, given the preemptions
/// its log reports (each readmission restarts the random stream).
pub fn reference_for(setup: &Setup, spec: &RequestSpec, log: &RequestLog) -> Reference {
    setup.model().reference_with_preemptions(
        &spec.prompt,
        spec.max_new_tokens,
        spec.seed,
        &log.preempted_at,
    )
}

/// Runs until idle and returns the transcript.
pub fn run(scheduler: &mut Scheduler<TestExecutor>) -> Transcript {
    let mut transcript = Transcript::default();
    transcript.run(scheduler, 100_000).unwrap();
    transcript
}

/// Steps once and records the events.
pub fn step(scheduler: &mut Scheduler<TestExecutor>, transcript: &mut Transcript) {
    scheduler.step().unwrap();
    transcript.record(scheduler.drain_events());
}

/// The order in which requests were first admitted.
pub fn admission_order(events: &[helios::scheduler::RequestEvent]) -> Vec<RequestId> {
    events
        .iter()
        .filter(|e| matches!(e.event, helios::scheduler::Event::Admitted { .. }))
        .map(|e| e.request)
        .collect()
}

/// The dense recipe's row: a tail page of 16-token pages and a hidden vector.
pub fn dense_row() -> RowLayout {
    RowLayout::new([("kv_tail", 16 * 2 * 64), ("hidden", 256)]).unwrap()
}

/// Nothing leaked and the executor saw no contract breach. Pages the prefix
/// cache holds are used; nothing else is, and the store lends nothing out.
pub fn assert_clean(scheduler: &Scheduler<TestExecutor>) {
    let violations: &[Violation] = scheduler.executor().violations();
    assert!(violations.is_empty(), "{violations:?}");
    let usable = scheduler.geometry().usable_pages();
    let metrics = scheduler.metrics();
    // The launch counters are the launches the executor accepted, by kind.
    let c = scheduler.executor().counts();
    let accepted = [
        c.admit, c.prefill, c.decode, c.resume, c.snapshot, c.restore,
    ];
    assert_eq!(metrics.launches, accepted);
    let cached = metrics.cache.map_or(0, |cache| cache.pages_held);
    if let Some(store) = scheduler.checkpoints() {
        store.verify().unwrap();
        assert_eq!(store.outstanding(), Outstanding::default());
        assert_eq!(metrics.cache.unwrap().pages_reclaimable, cached);
    }
    assert_eq!(
        metrics,
        Metrics {
            cache: metrics.cache,
            pages_used: cached,
            pages_free: usable - cached,
            preemptions: metrics.preemptions,
            prefilled_tokens: metrics.prefilled_tokens,
            finished_stop: metrics.finished_stop,
            finished_length: metrics.finished_length,
            cancelled: metrics.cancelled,
            failed: metrics.failed,
            launches: metrics.launches,
            ..Metrics::default()
        }
    );
}

#[path = "../rng/mod.rs"]
mod rng;
pub use rng::Rng;

/// Launches of `kind`.
pub fn count(launches: &[Launch], kind: OperationKind) -> usize {
    (launches.iter())
        .filter(|launch| launch.operation.kind() == kind)
        .count()
}

/// Prompt tokens the launches prefilled.
pub fn prefilled(launches: &[Launch]) -> usize {
    (launches.iter())
        .map(|launch| match &launch.operation {
            Operation::PrefillChunk(chunk) => chunk.tokens.len(),
            _ => 0,
        })
        .sum()
}

/// Runs one request alone and checks its output is the reference.
pub fn serve_checked(
    setup: &Setup,
    scheduler: &mut Scheduler<TestExecutor>,
    request: &RequestSpec,
) -> Vec<Launch> {
    let before = scheduler.executor().log().len();
    let id = scheduler.submit(request.clone()).unwrap();
    let transcript = run(scheduler);
    let log = transcript.get(id);
    assert_eq!(log.tokens, reference(setup, request).tokens);
    scheduler.executor().log()[before..].to_vec()
}

/// The generation header of the agent trace's turns.
pub const AGENT_HEADER: [u32; 3] = [7, 8, 9];

/// An agent's conversation as the HTTP layer submits it for the benchmark's
/// trace: each turn's prompt is the previous one (its generation header
/// included: ChatML renders the assistant's tool call right after it), a
/// fixed tool call that replaces the model's answer, its result, and the
/// header again; the message endpoints are the ends of the last few
/// messages. The terminal captures are never extended. Returns each turn's
/// prompt and the launches it caused.
pub fn agent_turns(
    setup: &Setup,
    scheduler: &mut Scheduler<TestExecutor>,
    turns: u64,
) -> (Vec<Vec<u32>>, Vec<Vec<Launch>>) {
    let mut history: Vec<u32> = prompt(200, 1);
    let mut ends: Vec<u32> = vec![40, 200];
    let (mut prompts, mut launched) = (Vec::new(), Vec::new());
    for turn in 0..turns {
        let mut tokens = history.clone();
        tokens.extend(AGENT_HEADER);
        let recent: Vec<u32> = ends.iter().rev().take(4).rev().copied().collect();
        let request = RequestSpec {
            prompt: tokens.clone(),
            message_endpoints: recent,
            ..spec(1, 16, turn)
        };
        launched.push(serve_checked(setup, scheduler, &request));
        prompts.push(tokens.clone());
        // The model's answer is not part of the trace: a fixed tool call
        // and its result follow the prompt.
        history = tokens;
        history.extend(prompt(20, 1000 + turn));
        ends.push(history.len() as u32);
        history.extend(prompt(150 + (turn as usize * 37) % 200, 2000 + turn));
        ends.push(history.len() as u32);
    }
    (prompts, launched)
}
