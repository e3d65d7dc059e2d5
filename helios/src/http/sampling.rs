//! Sampling and limit fields shared by the generation endpoints, resolved
//! by the core's [`SamplingPolicy`] into the scheduler's [`SamplingParams`].

use serde::Deserialize;

use super::error::HttpError;
use crate::core::proto::{FloatRange, SamplingDefaults};
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

/// The sampling fields a generation request may carry; an omitted one
/// takes the core's declared default ([`SamplingPolicy`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    /// Softmax temperature; greater than 0 (the graphs always sample).
    pub temperature: Option<f32>,
    /// Nucleus threshold.
    pub top_p: Option<f32>,
    /// Keep the `top_k` most likely tokens; 0 or -1 disables.
    pub top_k: Option<i64>,
    /// Minimum probability relative to the most likely token.
    pub min_p: Option<f32>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
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

/// One parameter as the core declares it: its default and the inclusive
/// range a request may choose from (`None`: fixed at the default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Declared {
    /// The value of a request that omits the parameter.
    pub default: f32,
    /// The inclusive range of requested values; outside it they clamp.
    pub range: Option<(f32, f32)>,
}

impl Declared {
    fn new(default: f32, range: Option<&FloatRange>) -> Self {
        Self {
            default,
            range: range.map(|range| (range.min, range.max)),
        }
    }

    /// The value a request gets: its own clamped into the range, else the
    /// default.
    pub fn resolve(self, requested: Option<f32>) -> f32 {
        match (requested, self.range) {
            (Some(value), Some((low, high))) => value.clamp(low, high),
            _ => self.default,
        }
    }
}

/// The core's sampling policy (the manifest's `SamplingDefaults`): the one
/// place a request's sampling fields become the graphs' parameters.
///
/// - An omitted field takes the declared default.
/// - A value outside its declared range clamps to the nearest end.
/// - A parameter without a range is fixed at its default.
/// - Values that mean nothing are 400: a temperature of 0 or below (the
///   graphs always sample), a non-finite number, a `top_k` below -1.
/// - The seed is the request's.
///
/// The Python replay harness applies the same rules
/// (`ignition.replay.sampling_policy`); the shared fixture
/// `helios/tests/fixtures/sampling/policy.json` holds both to them.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingPolicy {
    /// Softmax temperature.
    pub temperature: Declared,
    /// Top-k (as a float: the manifest's ranges are floats).
    pub top_k: Declared,
    /// Top-p.
    pub top_p: Declared,
    /// Min-p.
    pub min_p: Declared,
    /// Repetition penalty.
    pub repetition_penalty: Declared,
    /// Presence penalty.
    pub presence_penalty: Declared,
    /// Frequency penalty.
    pub frequency_penalty: Declared,
}

impl SamplingPolicy {
    /// The policy a core declares.
    pub fn from_core(defaults: &SamplingDefaults) -> Self {
        Self {
            temperature: Declared::new(defaults.temperature, defaults.temperature_range.as_ref()),
            top_k: Declared::new(defaults.top_k as f32, defaults.top_k_range.as_ref()),
            top_p: Declared::new(defaults.top_p, defaults.top_p_range.as_ref()),
            min_p: Declared::new(defaults.min_p, defaults.min_p_range.as_ref()),
            repetition_penalty: Declared::new(
                defaults.repetition_penalty,
                defaults.repetition_penalty_range.as_ref(),
            ),
            presence_penalty: Declared::new(
                defaults.presence_penalty,
                defaults.presence_penalty_range.as_ref(),
            ),
            frequency_penalty: Declared::new(
                defaults.frequency_penalty,
                defaults.frequency_penalty_range.as_ref(),
            ),
        }
    }

    /// The graphs' parameters, seed and stops of a request's fields.
    pub fn resolve(&self, fields: SamplingFields) -> Result<Sampling, HttpError> {
        if fields
            .temperature
            .is_some_and(|t| !(t.is_finite() && t > 0.0))
        {
            return Err(invalid(
                "temperature",
                "must be a number greater than 0 (greedy decoding is not supported)",
            ));
        }
        let finite = |value: Option<f32>, param| match value {
            Some(value) if !value.is_finite() => Err(invalid(param, "must be a finite number")),
            _ => Ok(value),
        };
        let top_k = match fields.top_k {
            None => None,
            Some(-1 | 0) => Some(0.0),
            Some(k) if k > 0 => Some(k as f32),
            Some(_) => return Err(invalid("top_k", "must be -1, 0 or a positive integer")),
        };
        let top_p = finite(fields.top_p, "top_p")?;
        let min_p = finite(fields.min_p, "min_p")?;
        let repetition_penalty = finite(fields.repetition_penalty, "repetition_penalty")?;
        let presence_penalty = finite(fields.presence_penalty, "presence_penalty")?;
        let frequency_penalty = finite(fields.frequency_penalty, "frequency_penalty")?;
        Ok(Sampling {
            params: SamplingParams {
                temperature: self.temperature.resolve(fields.temperature),
                // Ranges of top_k hold integers: the clamped value is one.
                top_k: self.top_k.resolve(top_k).max(0.0) as u32,
                top_p: self.top_p.resolve(top_p),
                min_p: self.min_p.resolve(min_p),
                repetition_penalty: self.repetition_penalty.resolve(repetition_penalty),
                presence_penalty: self.presence_penalty.resolve(presence_penalty),
                frequency_penalty: self.frequency_penalty.resolve(frequency_penalty),
            },
            seed: fields.seed.unwrap_or_else(random_seed),
            stops: fields.stop.map(Stop::into_vec).unwrap_or_default(),
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
