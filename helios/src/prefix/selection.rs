//! The snapshot budget of one request and the endpoints it captures.
//!
//! The design, at admission: "the scheduler budgets newly captured cache
//! snapshots from the loaded snapshot capacity divided by configured maximum
//! concurrency, rounded down and capped at eight. A nonempty pool permits at
//! least one capture per request; an empty pool permits none. The budget
//! reserves a terminal capture and, when generation can continue beyond the
//! prompt and the budget permits, a prompt capture. A single output token
//! shares the prompt and terminal endpoint."
//!
//! "The remaining budget selects message checkpoints within the uncached
//! prompt suffix. If all eligible boundaries fit, retain them all. Otherwise,
//! place token targets at equal intervals between the reused prefix and the
//! prompt end, choose the nearest eligible message boundary to each target,
//! and deduplicate the results. Equal-distance ties choose the earlier
//! boundary."
//!
//! `n` targets at equal intervals divide `[reused, prompt]` into `n + 1`
//! equal parts (the prompt end is captured on its own). The budget limits
//! new captures only: existing checkpoints and the reused prefix cost
//! nothing. Only the selected endpoints interrupt prefill.

/// Most new captures one request may make.
pub const MAX_CAPTURES_PER_REQUEST: u32 = 8;

/// New captures each request may make: the snapshot rows shared by the
/// configured concurrency, at most [`MAX_CAPTURES_PER_REQUEST`], at least
/// one when there is a row at all.
pub fn capture_budget(snapshot_rows: u32, max_concurrency: u32) -> u32 {
    if snapshot_rows == 0 {
        return 0;
    }
    (snapshot_rows / max_concurrency.max(1)).clamp(1, MAX_CAPTURES_PER_REQUEST)
}

/// What admission knows when it selects a request's captures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRequest<'a> {
    /// New captures the request may make ([`capture_budget`]).
    pub budget: u32,
    /// Prompt tokens covered by the checkpoint the request restores from.
    pub reused: u32,
    /// Tokens in the prompt.
    pub prompt_tokens: u32,
    /// The request's output limit.
    pub max_new_tokens: u32,
    /// The prompt's exact message endpoints, sorted.
    pub message_endpoints: &'a [u32],
}

/// The endpoints a request captures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapturePlan {
    /// Message endpoints to capture, sorted, each inside the uncached
    /// prompt suffix.
    pub messages: Vec<u32>,
    /// Whether to capture the final prompt endpoint as its own checkpoint.
    pub prompt: bool,
    /// Whether to capture the terminal consumed prefix. With one output
    /// token it is the prompt endpoint.
    pub terminal: bool,
}

impl CapturePlan {
    /// Captures the plan may make.
    pub fn captures(&self) -> u32 {
        let messages = u32::try_from(self.messages.len()).expect("at most the budget");
        messages + u32::from(self.prompt) + u32::from(self.terminal)
    }

    /// The endpoints where prefill must stop for a capture, in order.
    pub fn prefill_stops(&self, prompt_tokens: u32) -> Vec<u32> {
        let mut stops = self.messages.clone();
        if self.prompt {
            stops.push(prompt_tokens);
        }
        stops
    }
}

/// Selects a request's captures within its budget.
pub fn select_captures(request: &CaptureRequest<'_>) -> CapturePlan {
    let mut plan = CapturePlan::default();
    let Some(mut remaining) = request.budget.checked_sub(1) else {
        return plan;
    };
    plan.terminal = true;
    let uncached = request.reused < request.prompt_tokens;
    if request.max_new_tokens > 1 && uncached && remaining > 0 {
        plan.prompt = true;
        remaining -= 1;
    }
    let eligible: Vec<u32> = (request.message_endpoints.iter().copied())
        .filter(|&e| e > request.reused && e < request.prompt_tokens)
        .collect();
    if eligible.len() <= remaining as usize {
        plan.messages = eligible;
        return plan;
    }
    let span = u64::from(request.prompt_tokens - request.reused);
    for j in 1..=u64::from(remaining) {
        let target = u64::from(request.reused) + span * j / (u64::from(remaining) + 1);
        let nearest = (eligible.iter().copied())
            .min_by_key(|&e| (u64::from(e).abs_diff(target), e))
            .expect("more eligible boundaries than targets");
        plan.messages.push(nearest);
    }
    plan.messages.sort_unstable();
    plan.messages.dedup();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_shares_the_pool_caps_at_eight_and_keeps_one() {
        assert_eq!(capture_budget(0, 4), 0);
        assert_eq!(capture_budget(3, 4), 1);
        assert_eq!(capture_budget(9, 4), 2);
        assert_eq!(capture_budget(36, 4), 8);
        assert_eq!(capture_budget(100, 1), 8);
    }

    fn plan(budget: u32, reused: u32, prompt: u32, max_new: u32, marks: &[u32]) -> CapturePlan {
        select_captures(&CaptureRequest {
            budget,
            reused,
            prompt_tokens: prompt,
            max_new_tokens: max_new,
            message_endpoints: marks,
        })
    }

    #[test]
    fn terminal_first_then_prompt_then_messages() {
        assert_eq!(plan(0, 0, 100, 10, &[50]), CapturePlan::default());
        let one = plan(1, 0, 100, 10, &[50]);
        assert_eq!(
            (one.terminal, one.prompt, one.messages.len()),
            (true, false, 0)
        );
        let two = plan(2, 0, 100, 10, &[50]);
        assert_eq!(
            (two.terminal, two.prompt, two.messages.len()),
            (true, true, 0)
        );
        let three = plan(3, 0, 100, 10, &[50]);
        assert_eq!(three.messages, vec![50]);
        assert_eq!(three.captures(), 3);
        assert_eq!(three.prefill_stops(100), vec![50, 100]);
    }

    #[test]
    fn one_output_token_shares_prompt_and_terminal() {
        let p = plan(3, 0, 100, 1, &[20, 50]);
        assert!(p.terminal && !p.prompt);
        assert_eq!(p.messages, vec![20, 50]);
    }

    #[test]
    fn a_cached_prompt_needs_no_prompt_capture() {
        let p = plan(3, 100, 100, 10, &[20, 50]);
        assert!(p.terminal && !p.prompt && p.messages.is_empty());
    }

    #[test]
    fn only_the_uncached_suffix_is_eligible() {
        let p = plan(8, 40, 100, 10, &[10, 40, 60, 99]);
        assert_eq!(p.messages, vec![60, 99]);
    }

    #[test]
    fn too_many_boundaries_are_spread_by_equal_targets() {
        // Two message captures over [0, 300]: targets 100 and 200.
        let marks = [10, 90, 110, 150, 190, 290];
        let p = plan(4, 0, 300, 10, &marks);
        assert_eq!(p.messages, vec![90, 190]);
        // Equal distance to 90 and 110 from target 100: the earlier wins.
        let p = plan(3, 0, 200, 10, &[90, 110, 150]);
        assert_eq!(p.messages, vec![90]);
        // Targets nearest the same boundary deduplicate.
        let p = plan(5, 0, 400, 10, &[5, 6, 7, 390]);
        assert_eq!(p.messages, vec![7, 390]);
        // Targets start from the reused prefix.
        let p = plan(3, 100, 300, 10, &[110, 190, 210, 290]);
        assert_eq!(p.messages, vec![190]);
    }
}
