//! Sampling and limit fields shared by the generation endpoints, checked
//! and turned into the scheduler's [`SamplingParams`].

use serde::Deserialize;

use super::error::HttpError;
use crate::scheduler::SamplingParams;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop sequence.
    One(String),
    /// Several stop sequences.
    Many(Vec<String>),
}

impl Stop {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(stop) => vec![stop],
            Self::Many(stops) => stops,
        }
    }
}

/// The sampling fields a generation request may carry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    /// Softmax temperature; greater than 0 (the graphs always sample).
    pub temperature: Option<f32>,
    /// Nucleus threshold in (0, 1].
    pub top_p: Option<f32>,
    /// Keep the `top_k` most likely tokens; 0 or -1 disables.
    pub top_k: Option<i64>,
    /// Minimum probability relative to the most likely token, in [0, 1].
    pub min_p: Option<f32>,
    /// Repetition penalty, greater than 0.
    pub repetition_penalty: Option<f32>,
    /// Presence penalty, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// Frequency penalty, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// The request's random seed; drawn at random when absent.
    pub seed: Option<u64>,
    /// Stop sequences.
    pub stop: Option<Stop>,
}

/// Checked sampling: the scheduler's parameters, seed and stop sequences.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// Parameters for the graphs.
    pub params: SamplingParams,
    /// The Philox key.
    pub seed: u64,
    /// Stop sequences, in the request's order.
    pub stops: Vec<String>,
}

fn invalid(param: &'static str, reason: &'static str) -> HttpError {
    HttpError::InvalidParameter { param, reason }
}

fn in_range(
    value: Option<f32>,
    param: &'static str,
    default: f32,
    ok: impl Fn(f32) -> bool,
    reason: &'static str,
) -> Result<f32, HttpError> {
    match value {
        None => Ok(default),
        Some(value) if value.is_finite() && ok(value) => Ok(value),
        Some(_) => Err(invalid(param, reason)),
    }
}

impl SamplingFields {
    /// Checks every field, naming the first one out of range.
    pub fn check(self) -> Result<Sampling, HttpError> {
        let temperature = in_range(
            self.temperature,
            "temperature",
            1.0,
            |t| t > 0.0,
            "must be greater than 0 (greedy decoding is not supported)",
        )?;
        let top_p = in_range(
            self.top_p,
            "top_p",
            1.0,
            |p| p > 0.0 && p <= 1.0,
            "must be in (0, 1]",
        )?;
        let min_p = in_range(
            self.min_p,
            "min_p",
            0.0,
            |p| (0.0..=1.0).contains(&p),
            "must be in [0, 1]",
        )?;
        let repetition_penalty = in_range(
            self.repetition_penalty,
            "repetition_penalty",
            1.0,
            |p| p > 0.0,
            "must be greater than 0",
        )?;
        let presence_penalty = in_range(
            self.presence_penalty,
            "presence_penalty",
            0.0,
            |p| (-2.0..=2.0).contains(&p),
            "must be in [-2, 2]",
        )?;
        let frequency_penalty = in_range(
            self.frequency_penalty,
            "frequency_penalty",
            0.0,
            |p| (-2.0..=2.0).contains(&p),
            "must be in [-2, 2]",
        )?;
        let top_k = match self.top_k {
            None | Some(-1) => 0,
            Some(k) => u32::try_from(k)
                .map_err(|_| invalid("top_k", "must be -1, 0 or a positive integer"))?,
        };
        let seed = self.seed.unwrap_or_else(random_seed);
        Ok(Sampling {
            params: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                presence_penalty,
                frequency_penalty,
            },
            seed,
            stops: self.stop.map(Stop::into_vec).unwrap_or_default(),
        })
    }
}

/// A seed for a request that did not choose one.
fn random_seed() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// The output limit: the request's, or what the context leaves after the
/// prompt (at least 1, so an overlong prompt is refused by admission with
/// the context error).
pub fn output_limit(
    requested: Option<u32>,
    prompt_tokens: usize,
    context_limit: u32,
) -> Result<u32, HttpError> {
    match requested {
        Some(0) => Err(invalid("max_tokens", "must be at least 1")),
        Some(limit) => Ok(limit),
        None => {
            let prompt = u32::try_from(prompt_tokens).unwrap_or(u32::MAX);
            Ok(context_limit.saturating_sub(prompt).max(1))
        }
    }
}
