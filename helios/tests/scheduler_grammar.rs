//! Constrained requests through the scheduler and the test executor, whose
//! sampler applies each launch's masks as the captured one will: a
//! constrained request's output is a word of its grammar, however it is
//! batched; two constrained requests in one batch each follow their own
//! grammar (masks are per lane, each computed after the lane's earlier
//! samples were applied, or its matcher would refuse a token); unconstrained
//! requests batched with them produce exactly what they produce alone; and
//! an executor that cannot apply masks refuses constrained requests.

mod scheduler_support;

use std::path::PathBuf;

use helios::frontend::Tokenizer;
use helios::grammar::token_bytes::vocabulary_bytes;
use helios::grammar::{GrammarEngine, GrammarSpec};
use helios::scheduler::test_executor::TestExecutor;
use helios::scheduler::{
    AdmissionError, Completion, ExecutionError, Executor, FinishReason, Grammar, Launch,
    RequestSpec, Scheduler, Ticket,
};
use scheduler_support::{run, spec, Setup, STOP};

/// The Qwen fixture tokenizer (its `<|im_end|>` is id 2, the test stop
/// token) and a setup whose vocabulary covers it.
fn qwen() -> (Tokenizer, String, Setup) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/qwen.tokenizer.json");
    let json = std::fs::read_to_string(path).unwrap();
    let tokenizer = Tokenizer::from_json(&json).unwrap();
    assert_eq!(tokenizer.token_to_id("<|im_end|>"), Some(STOP));
    let setup = Setup {
        vocab_size: tokenizer.vocab_size() as u32,
        ..Setup::default()
    };
    (tokenizer, json, setup)
}

fn constrained(engine: &GrammarEngine, regex: &str, seed: u64) -> RequestSpec {
    let constraint = engine
        .constraint(&GrammarSpec::Regex(regex.to_owned()))
        .unwrap();
    RequestSpec {
        grammar: Some(Grammar::new(constraint)),
        ..spec(12, 40, seed)
    }
}

/// A request's output as text, without its stop token.
fn text(bytes: &[Vec<u8>], tokens: &[u32]) -> String {
    let body: Vec<u8> = (tokens.iter())
        .filter(|&&t| t != STOP)
        .flat_map(|&t| bytes[t as usize].clone())
        .collect();
    String::from_utf8(body).unwrap()
}

#[test]
fn constrained_requests_follow_their_grammars_and_others_are_unchanged() {
    let (tokenizer, json, setup) = qwen();
    let bytes = vocabulary_bytes(&tokenizer, &json).unwrap();
    let engine =
        GrammarEngine::new(&tokenizer, &json, &[STOP], setup.vocab_size as usize, &[]).unwrap();
    // Alone, two unconstrained requests.
    let plain = [spec(20, 30, 7), spec(9, 30, 8)];
    let mut alone = setup.scheduler();
    let ids: Vec<_> = plain
        .iter()
        .map(|s| alone.submit(s.clone()).unwrap())
        .collect();
    let reference = run(&mut alone);
    // Batched with two constrained ones of different grammars.
    let mut mixed = setup.scheduler();
    let plain_ids: Vec<_> = plain
        .iter()
        .map(|s| mixed.submit(s.clone()).unwrap())
        .collect();
    let animals = mixed
        .submit(constrained(&engine, "(cat|dog)s?|bird", 1))
        .unwrap();
    let digits = mixed
        .submit(constrained(&engine, "[0-9]{3}-[0-9]{2}", 2))
        .unwrap();
    let transcript = run(&mut mixed);
    for (alone_id, mixed_id) in ids.iter().zip(&plain_ids) {
        assert_eq!(
            transcript.requests[mixed_id].tokens, reference.requests[alone_id].tokens,
            "an unconstrained request's output changed beside constrained ones"
        );
    }
    let animal = &transcript.requests[&animals];
    assert_eq!(animal.finish, Some(FinishReason::Stop), "{animal:?}");
    let word = text(&bytes, &animal.tokens);
    assert!(
        ["cat", "cats", "dog", "dogs", "bird"].contains(&word.as_str()),
        "{word:?}"
    );
    let number = &transcript.requests[&digits];
    assert_eq!(number.finish, Some(FinishReason::Stop), "{number:?}");
    let word = text(&bytes, &number.tokens);
    let shape: String = word
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_eq!(shape, "999-99", "{word:?}");
    // Every mask followed the lane's applied samples: a stale one would
    // have let the matcher refuse a token and fail the request.
    assert!(animal.failure.is_none() && number.failure.is_none());
    // One mask, timed, per constrained sample; none without constraints.
    let samples = animal.tokens.len() + number.tokens.len();
    assert_eq!(mixed.mask_time().count(), samples as u64);
    assert!(mixed.mask_time().sum() > 0.0);
    assert_eq!(alone.mask_time().count(), 0);
    scheduler_support::assert_clean(&mixed);
}

/// The test executor with mask support turned off, as an executor whose
/// graphs take no mask.
struct NoMasks(TestExecutor);

impl Executor for NoMasks {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        self.0.submit(launch)
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        self.0.poll(ticket)
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        self.0.wait(ticket)
    }
}

#[test]
fn an_executor_that_cannot_apply_masks_refuses_constrained_requests() {
    let (tokenizer, json, setup) = qwen();
    let engine =
        GrammarEngine::new(&tokenizer, &json, &[STOP], setup.vocab_size as usize, &[]).unwrap();
    let mut scheduler = Scheduler::new(
        setup.geometry(),
        setup.config.clone(),
        NoMasks(setup.executor()),
    )
    .unwrap();
    let error = scheduler
        .submit(constrained(&engine, "yes|no", 3))
        .unwrap_err();
    assert!(
        matches!(error, AdmissionError::GrammarUnsupported),
        "{error}"
    );
    assert!(scheduler.submit(spec(5, 4, 3)).is_ok());
}
