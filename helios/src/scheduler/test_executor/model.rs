//! The fake model: the next token is a pure function of the request's seed,
//! its draw counter, its token history and its penalty histogram, so a
//! recompute after preemption continues exactly where the request stopped.

use std::sync::Arc;

use crate::scheduler::events::FinishReason;
use crate::scheduler::geometry::Geometry;
use crate::scheduler::rng::readmission_seed;

/// What the fake model conditions on: a digest of the token sequence (order
/// matters, as for attention) and of the token counts (order does not, as
/// for the penalty histogram).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct History {
    sequence: u64,
    histogram: u64,
}

impl History {
    /// The digest of `tokens`, in order.
    pub fn of(tokens: &[u32]) -> Self {
        let mut history = Self::default();
        for &token in tokens {
            history.push(token);
        }
        history
    }

    /// Appends one token to the sequence.
    pub fn push(&mut self, token: u32) {
        self.sequence = mix(self.sequence ^ u64::from(token).wrapping_add(0x9e37));
        self.count(token);
    }

    /// Counts one token in the histogram only (the device increments the
    /// histogram when it samples, before the token is consumed).
    pub fn count(&mut self, token: u32) {
        self.histogram = self.histogram.wrapping_add(mix(u64::from(token) + 1));
    }

    /// The histogram digest.
    pub fn histogram(&self) -> u64 {
        self.histogram
    }

    /// This sequence digest with another histogram digest.
    pub fn with_histogram(self, histogram: u64) -> Self {
        Self { histogram, ..self }
    }
}

/// Whether packed `mask` allows `token`.
fn allows(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|word| word >> (token % 32) & 1 == 1)
}

/// SplitMix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Output a test writes instead of the fake model's draws: client tests
/// that need a model to call tools script what it says.
pub trait Script: Send + Sync + std::fmt::Debug {
    /// The token draw `counter` of an admission samples after `history`
    /// (the prompt, then the `counter` tokens drawn so far).
    fn next_token(&self, history: &[u32], counter: u64) -> u32;
}

/// The deterministic model behind the test executor.
#[derive(Debug, Clone)]
pub struct FakeModel {
    stop_token: u32,
    ordinary: Vec<u32>,
    stop_every: Option<u64>,
    script: Option<Arc<dyn Script>>,
}

impl PartialEq for FakeModel {
    fn eq(&self, other: &Self) -> bool {
        let same_script = match (&self.script, &other.script) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_script
            && (self.stop_token, &self.ordinary, self.stop_every)
                == (other.stop_token, &other.ordinary, other.stop_every)
    }
}

impl Eq for FakeModel {}

/// A request's output when nothing interferes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Output tokens.
    pub tokens: Vec<u32>,
    /// Stop or length.
    pub reason: FinishReason,
}

impl FakeModel {
    /// A model over the geometry's vocabulary that samples its first stop
    /// token about once every `stop_every` draws (never when `None`).
    pub fn new(geometry: &Geometry, stop_every: Option<u64>) -> Self {
        let ordinary = (0..geometry.vocab_size())
            .filter(|&token| !geometry.is_stop(token))
            .collect();
        Self {
            stop_token: geometry.stop_tokens()[0],
            ordinary,
            stop_every: stop_every.filter(|&every| every > 0),
            script: None,
        }
    }

    /// This model with its output written by `script` (the reference
    /// functions below describe the unscripted model only).
    pub fn with_script(self, script: Arc<dyn Script>) -> Self {
        Self {
            script: Some(script),
            ..self
        }
    }

    /// What the device samples: the script's token when there is one, the
    /// hashed draw otherwise; under a mask, that token when the mask allows
    /// it, else the stop token when allowed (so constrained output ends as
    /// soon as it may), else one of the allowed tokens picked by the same
    /// hash (the stop token when the mask allows nothing).
    pub fn sample(
        &self,
        seed: u64,
        counter: u64,
        history: History,
        tokens: &[u32],
        mask: Option<&[u32]>,
    ) -> u32 {
        let token = match &self.script {
            Some(script) => script.next_token(tokens, counter),
            None => self.next_token(seed, counter, history),
        };
        let Some(mask) = mask else {
            return token;
        };
        if allows(mask, token) {
            return token;
        }
        // A model that would say something else ends as soon as it may.
        if allows(mask, self.stop_token) {
            return self.stop_token;
        }
        let allowed: Vec<u32> = (0..mask.len() as u32 * 32)
            .filter(|&id| allows(mask, id))
            .collect();
        if allowed.is_empty() {
            return self.stop_token;
        }
        let x = mix(seed ^ mix(counter ^ mix(history.sequence ^ mix(history.histogram))));
        allowed[usize::try_from(x % allowed.len() as u64).expect("index fits")]
    }

    /// The token draw `counter` of a request with `seed` samples after
    /// `history`.
    pub fn next_token(&self, seed: u64, counter: u64, history: History) -> u32 {
        let x = mix(seed ^ mix(counter ^ mix(history.sequence ^ mix(history.histogram))));
        if self.stop_every.is_some_and(|every| x.is_multiple_of(every)) || self.ordinary.is_empty()
        {
            return self.stop_token;
        }
        let len = self.ordinary.len() as u64;
        self.ordinary[usize::try_from((x >> 16) % len).expect("index fits")]
    }

    /// The output of `prompt` with an output limit of `max_new_tokens`,
    /// drawn sequentially: the continuation every schedule must reproduce.
    /// What a request must produce when it was preempted after each count
    /// of output tokens in `preempted_at` (ascending): each readmission
    /// continues the history under [`readmission_seed`] with a fresh counter.
    pub fn reference_with_preemptions(
        &self,
        prompt: &[u32],
        max_new_tokens: u32,
        seed: u64,
        preempted_at: &[u32],
    ) -> Reference {
        let mut history = prompt.to_vec();
        let mut tokens: Vec<u32> = Vec::new();
        for &point in preempted_at.iter().chain(std::iter::once(&max_new_tokens)) {
            let generated = tokens.len() as u32;
            let budget = max_new_tokens - generated;
            let segment_seed = readmission_seed(seed, u64::from(generated));
            let segment = self.reference(&history, budget, segment_seed);
            let take = (point.saturating_sub(generated) as usize).min(segment.tokens.len());
            let ended = take == segment.tokens.len();
            tokens.extend(&segment.tokens[..take]);
            history.extend(&segment.tokens[..take]);
            if ended
                && (segment.reason == FinishReason::Stop || tokens.len() as u32 >= max_new_tokens)
            {
                return Reference {
                    tokens,
                    reason: segment.reason,
                };
            }
        }
        Reference {
            tokens,
            reason: FinishReason::Length,
        }
    }

    /// What a request must produce when it is never preempted.
    pub fn reference(&self, prompt: &[u32], max_new_tokens: u32, seed: u64) -> Reference {
        let mut history = History::of(prompt);
        let mut tokens = Vec::new();
        for counter in 0.. {
            let token = self.next_token(seed, counter, history);
            tokens.push(token);
            history.push(token);
            if token == self.stop_token {
                return Reference {
                    tokens,
                    reason: FinishReason::Stop,
                };
            }
            if tokens.len() >= max_new_tokens as usize {
                break;
            }
        }
        Reference {
            tokens,
            reason: FinishReason::Length,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::proto::PreparedContract;

    fn model(stop_every: Option<u64>) -> FakeModel {
        let contract = PreparedContract {
            page_size: 16,
            max_concurrency: 1,
            context_limit: 256,
            prefill_chunk_size: 32,
            decode_capacities: vec![1],
            prefill_capacities: vec![32],
            kv_pages: 9,
            vocab_size: 50,
            ..PreparedContract::default()
        };
        FakeModel::new(
            &Geometry::from_contract(&contract, &[0, 1]).unwrap(),
            stop_every,
        )
    }

    #[test]
    fn the_reference_continues_from_any_prefix_of_itself() {
        let model = model(None);
        let prompt = [7, 8, 9];
        let full = model.reference(&prompt, 30, 5);
        assert_eq!((full.tokens.len(), full.reason), (30, FinishReason::Length));
        // Recompute from prompt + 12 outputs with the counter at 12.
        let mut history = History::of(&prompt);
        for &token in &full.tokens[..12] {
            history.push(token);
        }
        assert_eq!(model.next_token(5, 12, history), full.tokens[12]);
        assert!(full.tokens.iter().all(|t| (2..50).contains(t)));
    }

    #[test]
    fn the_seed_the_counter_and_the_histogram_all_matter() {
        let model = model(None);
        let history = History::of(&[3, 4, 5]);
        let base = model.next_token(1, 0, history);
        let differs = |token| token != base;
        let draws: Vec<u32> = (1..20)
            .map(|seed| model.next_token(seed, 0, history))
            .collect();
        assert!(draws.into_iter().any(differs));
        let draws: Vec<u32> = (1..20)
            .map(|counter| model.next_token(1, counter, history))
            .collect();
        assert!(draws.into_iter().any(differs));
        let histograms: Vec<u32> = (0..20)
            .map(|h| model.next_token(1, 0, history.with_histogram(h)))
            .collect();
        assert!(histograms.into_iter().any(differs));
    }

    #[test]
    fn stop_tokens_end_the_reference() {
        let model = model(Some(5));
        let reference = model.reference(&[3], 1000, 2);
        assert_eq!(reference.reason, FinishReason::Stop);
        assert_eq!(reference.tokens.last(), Some(&0));
        assert!(reference.tokens.len() < 1000);
    }
}
