//! A request as the scheduler holds it, and its placement on a slot.

use std::time::Instant;

use super::checkpoints::PlacementPrefix;
use super::error::AdmissionError;
use super::executor::SamplingParams;
use super::geometry::Geometry;
use super::grammar::Grammar;
use super::ledger::SlotLease;
use crate::prefix::PrefixChain;

/// What a request asks for, in tokens: the frontend has already rendered,
/// tokenized and clamped it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output limit.
    pub max_new_tokens: u32,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// The request's Philox key.
    pub seed: u64,
    /// Exact token endpoints of complete messages inside the prompt
    /// (strictly ascending, each in `1..prompt.len()`), from the renderer's
    /// marks and the exact-cut rule; the prefix cache may capture them.
    /// Empty when the prompt is not a rendered conversation.
    pub message_endpoints: Vec<u32>,
    /// The grammar its output follows, if any (see [`Grammar`]).
    pub grammar: Option<Grammar>,
}

impl RequestSpec {
    /// Checks the request against the contract: tokens in the vocabulary,
    /// prompt plus output within the context limit, an admission
    /// reservation no larger than the whole page pool.
    pub fn check(&self, geometry: &Geometry) -> Result<(), AdmissionError> {
        if self.prompt.is_empty() {
            return Err(AdmissionError::EmptyPrompt);
        }
        if self.max_new_tokens == 0 {
            return Err(AdmissionError::ZeroOutputBudget);
        }
        let vocab_size = geometry.vocab_size();
        if let Some((position, &token)) =
            (self.prompt.iter().enumerate()).find(|(_, &token)| token >= vocab_size)
        {
            return Err(AdmissionError::TokenOutsideVocabulary {
                position,
                token,
                vocab_size,
            });
        }
        let prompt_len = self.prompt.len();
        let mut previous = 0;
        for &endpoint in &self.message_endpoints {
            if endpoint <= previous || endpoint as usize >= prompt_len {
                return Err(AdmissionError::MessageEndpoint {
                    endpoint,
                    prompt_tokens: u32::try_from(prompt_len).unwrap_or(u32::MAX),
                });
            }
            previous = endpoint;
        }
        let temperature = self.sampling.temperature;
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(AdmissionError::InvalidSampling {
                field: "temperature",
                reason: "must be finite and greater than 0",
            });
        }
        let too_long = AdmissionError::ExceedsContext {
            prompt_tokens: u32::try_from(self.prompt.len()).unwrap_or(u32::MAX),
            max_new_tokens: self.max_new_tokens,
            context_limit: geometry.context_limit(),
        };
        let prompt = u32::try_from(self.prompt.len()).map_err(|_| too_long.clone())?;
        match prompt.checked_add(self.max_new_tokens) {
            Some(total) if total <= geometry.context_limit() => {}
            _ => return Err(too_long),
        }
        let required_pages = admission_pages(geometry, prompt, self.max_new_tokens);
        if required_pages > geometry.usable_pages() {
            return Err(AdmissionError::ExceedsPool {
                required_pages,
                usable_pages: geometry.usable_pages(),
            });
        }
        Ok(())
    }
}

/// The admission reservation: the history plus one page of output, but never
/// more than the request can ever write (`history + budget - 1` tokens: the
/// last sample is never consumed).
pub(super) fn admission_pages(geometry: &Geometry, history: u32, budget: u32) -> u32 {
    (geometry.pages_for(history) + 1).min(max_pages(geometry, history, budget))
}

/// Pages a placement can ever need.
pub(super) fn max_pages(geometry: &Geometry, history: u32, budget: u32) -> u32 {
    geometry.pages_for(history + budget.saturating_sub(1))
}

/// A request the scheduler owns: queued on its own, placed with its
/// [`Placement`] ([`Placed`]).
#[derive(Debug)]
pub(super) struct Request {
    pub(super) spec: RequestSpec,
    /// The prefix chain of its token stream (prompt, then output as
    /// captures need it), when the prefix cache is enabled.
    pub(super) chain: Option<PrefixChain>,
    /// Arrival order; a preempted request re-enters the queue at it.
    pub(super) arrival: u64,
    /// Every output token delivered so far, across admissions.
    pub(super) output: Vec<u32>,
    /// Whether `Admitted` was sent.
    pub(super) admitted: bool,
    /// When it was submitted, and when its first launch was (the first
    /// token's two parts, [`super::latency::FirstTokenSplit`]).
    pub(super) submitted: Instant,
    pub(super) first_launch: Option<Instant>,
    /// When the first launch that samples for it was submitted (before its
    /// first token; never changed after).
    pub(super) sampling_launch: Option<Instant>,
}

/// A request holding a slot for one admission.
#[derive(Debug)]
pub(super) struct Placed {
    pub(super) request: Request,
    pub(super) placement: Placement,
}

impl Request {
    /// Tokens the next admission starts from: prompt then output.
    pub(super) fn history_len(&self) -> u32 {
        len32(self.spec.prompt.len() + self.output.len())
    }

    /// Output tokens the next admission may still sample.
    pub(super) fn remaining_budget(&self) -> u32 {
        self.spec
            .max_new_tokens
            .saturating_sub(len32(self.output.len()))
    }

    /// The prefix chain extended with the history up to `end` tokens (output
    /// tokens join it as captures and readmissions need them).
    ///
    /// # Panics
    /// When the prefix cache is off (no chain).
    pub(super) fn chain_to(&mut self, end: u32) -> &PrefixChain {
        let chained = (self.chain.as_ref())
            .expect("a cached scheduler chains requests")
            .len();
        if chained < end {
            let tokens = self.history(chained, end);
            (self.chain.as_mut()).expect("chained").extend(&tokens);
        }
        self.chain.as_ref().expect("chained")
    }

    /// History tokens `range` of the current placement.
    pub(super) fn history(&self, start: u32, end: u32) -> Vec<u32> {
        let prompt = &self.spec.prompt;
        (start as usize..end as usize)
            .map(|i| {
                prompt
                    .get(i)
                    .copied()
                    .unwrap_or_else(|| self.output[i - prompt.len()])
            })
            .collect()
    }
}

/// Lengths are bounded by the context limit, a `u32`.
pub(super) fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("lengths are bounded by the u32 context limit")
}

/// Why a placement stopped taking new launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exit {
    /// The device finished it (its terminal event was sent).
    Finished,
    /// It was cancelled (terminal event sent); late records are ignored.
    Cancelled,
    /// A record of it failed validation (terminal event sent); late records
    /// are ignored.
    Failed,
    /// Preempted: readmitted with its history once its slot is retired.
    Preempted,
}

/// Device progress as validated completion records reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Confirmed {
    pub(super) consumed: u32,
    pub(super) generated: u32,
    pub(super) done: i32,
}

/// A request placed on a slot for one admission.
#[derive(Debug)]
pub(super) struct Placement {
    /// Its slot, and through the ledger the slot's page table and
    /// reservation.
    pub(super) lease: SlotLease,
    /// Admission order: the newest placement has the largest.
    pub(super) admission: u64,
    /// Tokens this admission prefills (prompt and earlier output).
    pub(super) history: u32,
    /// Output tokens this admission may sample (the device's `max_new`).
    pub(super) budget: u32,
    /// Where it is in its admission.
    pub(super) phase: Phase,
    /// Tokens consumed once every submitted launch ran.
    pub(super) submitted_consumed: u32,
    /// Samples every submitted launch may draw.
    pub(super) submitted_samples: u32,
    /// What validated records reported.
    pub(super) confirmed: Confirmed,
    /// Launches in flight that reference the slot.
    pub(super) refs: u32,
    /// Its checkpoint pin, restore and captures.
    pub(super) prefix: PlacementPrefix,
}

/// Where a placement is in one admission. Submitted launches move it
/// forward, in this order; a prefix hit passes through `Restoring`, a
/// whole-history hit goes from there straight to `Decoding` (its resume
/// sampled the first token). `Exiting` is final: no launch is planned for it
/// again, and its slot is retired once none in flight references it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Its admit launch is still to submit.
    Admitting,
    /// Admitted; its prefix restore (and a whole-history hit's resume) is
    /// still to submit.
    Restoring,
    /// Prompt tokens are still to submit for prefill.
    Prefilling,
    /// Every prompt token was submitted: it decodes until it ends.
    Decoding,
    /// It stopped taking launches, and why.
    Exiting(Exit),
}

impl Placement {
    /// A fresh placement on `lease`: nothing submitted yet.
    pub(super) fn new(lease: SlotLease, admission: u64, history: u32, budget: u32) -> Self {
        Self {
            lease,
            admission,
            history,
            budget,
            phase: Phase::Admitting,
            submitted_consumed: 0,
            submitted_samples: 0,
            confirmed: Confirmed::default(),
            refs: 0,
            prefix: PlacementPrefix::default(),
        }
    }

    /// Why it stopped taking launches, once it did.
    pub(super) fn exit(&self) -> Option<Exit> {
        match self.phase {
            Phase::Exiting(exit) => Some(exit),
            _ => None,
        }
    }

    /// Whether it is live with prompt tokens (or its admit or restore)
    /// still to submit.
    pub(super) fn prefills(&self) -> bool {
        matches!(
            self.phase,
            Phase::Admitting | Phase::Restoring | Phase::Prefilling
        )
    }

    /// Whether the next decode step should include it: decoding, and its
    /// submitted samples leave budget.
    pub(super) fn decodes(&self) -> bool {
        self.phase == Phase::Decoding && self.submitted_samples < self.budget
    }
}
