//! Shared setup of the scheduler tests: a small contract, the test executor
//! and a seeded generator.
#![allow(dead_code)] // each test crate uses a different part

use helios::core::proto::PreparedContract;
use helios::scheduler::test_executor::{
    FakeModel, Reference, RequestLog, TestExecutor, Transcript, Violation,
};
use helios::scheduler::{
    Geometry, Metrics, RequestId, RequestSpec, SamplingParams, Scheduler, SchedulerConfig,
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
        TestExecutor::new(&self.geometry(), self.model())
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
        .filter(|e| matches!(e.event, helios::scheduler::Event::Admitted))
        .map(|e| e.request)
        .collect()
}

/// Nothing leaked and the executor saw no contract breach.
pub fn assert_clean(scheduler: &Scheduler<TestExecutor>) {
    let violations: &[Violation] = scheduler.executor().violations();
    assert!(violations.is_empty(), "{violations:?}");
    let usable = scheduler.geometry().usable_pages();
    let metrics = scheduler.metrics();
    assert_eq!(
        metrics,
        Metrics {
            pages_free: usable,
            preemptions: metrics.preemptions,
            finished_stop: metrics.finished_stop,
            finished_length: metrics.finished_length,
            cancelled: metrics.cancelled,
            failed: metrics.failed,
            ..Metrics::default()
        }
    );
}

#[path = "../rng/mod.rs"]
mod rng;
pub use rng::Rng;
