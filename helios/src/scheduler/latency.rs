//! Latency histograms the model thread keeps per request: time to first
//! token (from submission to the first output token's event) and the time
//! between successive output tokens, both as the HTTP layer sees them.

use std::collections::HashMap;
use std::time::Instant;

use super::events::{Event, RequestEvent};
use super::ids::RequestId;

/// Upper bounds (seconds) of the time-to-first-token buckets.
pub const TTFT_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Upper bounds (seconds) of the prompt preparation buckets (rendering,
/// tokenization and endpoint mapping, before submission).
pub const PREPARATION_BUCKETS: [f64; 10] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Upper bounds (seconds) of the inter-token latency buckets: quarter
/// milliseconds up to 1.5 ms, so that a small model's tail (steps of about
/// 0.7 ms) shows against its median, then as before.
pub const INTER_TOKEN_BUCKETS: [f64; 17] = [
    0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_25, 0.001_5, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Upper bounds (seconds) of the first token's two parts on the model
/// thread ([`FirstTokenSplit`]): tens of microseconds of scheduling, then
/// a small model's prefill of about a millisecond.
pub const FIRST_TOKEN_PART_BUCKETS: [f64; 14] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.005, 0.01,
    0.05, 0.25, 1.0,
];

/// Upper bounds (seconds) of the grammar mask buckets: one constrained
/// request's mask for its next sample, computed on the model thread.
pub const MASK_BUCKETS: [f64; 13] = [
    0.000_001, 0.000_002, 0.000_005, 0.000_01, 0.000_02, 0.000_05, 0.000_1, 0.000_2, 0.000_5,
    0.001, 0.002, 0.005, 0.01,
];

/// A fixed-bucket histogram in Prometheus' model: cumulative counts per
/// upper bound (the last, `+Inf`, is the total), a sum and a count.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); one more than `bounds`
    /// for the values above the last bound.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value in seconds.
    pub fn observe(&mut self, seconds: f64) {
        let bucket = self.bounds.partition_point(|&bound| bound < seconds);
        self.buckets[bucket] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per bound, then `(+Inf, count)`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        let mut out = Vec::with_capacity(self.buckets.len());
        for (index, &count) in self.buckets.iter().enumerate() {
            total += count;
            out.push((
                self.bounds.get(index).copied().unwrap_or(f64::INFINITY),
                total,
            ));
        }
        out
    }

    /// Sum of the observations, in seconds.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// The latency histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    /// Submission to first output token.
    pub time_to_first_token: Histogram,
    /// Between successive output tokens of a request.
    pub inter_token: Histogram,
    /// One constrained request's next-token mask (the scheduler's).
    pub grammar_mask: Histogram,
    /// The scheduler's part of the time to first token, split at the
    /// request's first launch.
    pub first_token: FirstTokenSplit,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            time_to_first_token: Histogram::new(&TTFT_BUCKETS),
            inter_token: Histogram::new(&INTER_TOKEN_BUCKETS),
            grammar_mask: Histogram::new(&MASK_BUCKETS),
            first_token: FirstTokenSplit::default(),
        }
    }
}

/// The time to first token on the model thread in parts, so a loss can be
/// placed: from submission to the request's first launch (admission,
/// queueing behind other requests' launches, the prefix lookup and planning),
/// and from that launch to the retrieval of the record holding its first
/// token (the device's work in between, what was queued ahead of it, and the
/// wait). The second is split again at the submission of the first launch
/// that samples for the request (a chunk ending the prompt, or a resume):
/// what was launched before it (admission, restores, chunks that do not
/// sample), then its own way through the device and back. Each request is
/// observed once: its first launch is its first admission's, and its first
/// token may come after a readmission.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstTokenSplit {
    /// Submission to the first launch.
    pub to_first_launch: Histogram,
    /// The first launch to the first token's record.
    pub to_first_record: Histogram,
    /// The first launch to the submission of the first sampling launch.
    pub to_sampling_launch: Histogram,
    /// The first sampling launch's submission to the first token's record.
    pub sampling_to_record: Histogram,
}

impl Default for FirstTokenSplit {
    fn default() -> Self {
        Self {
            to_first_launch: Histogram::new(&FIRST_TOKEN_PART_BUCKETS),
            to_first_record: Histogram::new(&FIRST_TOKEN_PART_BUCKETS),
            to_sampling_launch: Histogram::new(&FIRST_TOKEN_PART_BUCKETS),
            sampling_to_record: Histogram::new(&FIRST_TOKEN_PART_BUCKETS),
        }
    }
}

/// Per-request timestamps behind [`Latency`].
#[derive(Debug, Default)]
pub(super) struct LatencyTracker {
    latency: Latency,
    /// Submission time, until the first token; then the last token's time.
    since: HashMap<RequestId, (Instant, bool)>,
}

impl LatencyTracker {
    /// A request was submitted at `now`.
    pub(super) fn submitted(&mut self, id: RequestId, now: Instant) {
        self.since.insert(id, (now, false));
    }

    /// Observes an event routed at `now`.
    pub(super) fn routed(&mut self, event: &RequestEvent, now: Instant) {
        match &event.event {
            Event::Tokens { tokens, .. } if !tokens.is_empty() => {
                let Some((since, started)) = self.since.get_mut(&event.request) else {
                    return;
                };
                let elapsed = now.saturating_duration_since(*since).as_secs_f64();
                let mut tokens = tokens.len();
                if !*started {
                    self.latency.time_to_first_token.observe(elapsed);
                    *started = true;
                    tokens -= 1;
                    if tokens == 0 {
                        *since = now;
                        return;
                    }
                }
                // Tokens that arrive together share the gap evenly.
                let gap = elapsed / tokens as f64;
                for _ in 0..tokens {
                    self.latency.inter_token.observe(gap);
                }
                *since = now;
            }
            terminal if terminal.is_terminal() => {
                self.since.remove(&event.request);
            }
            _ => {}
        }
    }

    /// The histograms so far.
    pub(super) fn latency(&self) -> &Latency {
        &self.latency
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scheduler::FinishReason;

    #[test]
    fn buckets_are_cumulative_and_end_in_the_total() {
        let mut histogram = Histogram::new(&[0.1, 1.0]);
        for value in [0.05, 0.1, 0.5, 2.0] {
            histogram.observe(value);
        }
        assert_eq!(
            histogram.cumulative(),
            vec![(0.1, 2), (1.0, 3), (f64::INFINITY, 4)]
        );
        assert_eq!(histogram.count(), 4);
        assert!((histogram.sum() - 2.65).abs() < 1e-12);
    }

    fn tokens(id: u64, first: u32, count: usize) -> RequestEvent {
        RequestEvent {
            request: RequestId(id),
            event: Event::Tokens {
                first,
                tokens: vec![7; count],
            },
        }
    }

    #[test]
    fn the_first_token_is_ttft_and_later_gaps_are_shared() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut tracker = LatencyTracker::default();
        tracker.submitted(RequestId(1), start);
        tracker.routed(&tokens(1, 0, 1), at(40));
        tracker.routed(&tokens(1, 1, 1), at(50));
        tracker.routed(&tokens(1, 2, 2), at(70));
        let latency = tracker.latency();
        assert_eq!(latency.time_to_first_token.count(), 1);
        assert!((latency.time_to_first_token.sum() - 0.040).abs() < 1e-9);
        assert_eq!(latency.inter_token.count(), 3);
        assert!((latency.inter_token.sum() - 0.030).abs() < 1e-9);
        let finished = RequestEvent {
            request: RequestId(1),
            event: Event::Finished {
                reason: FinishReason::Length,
                output_tokens: 4,
            },
        };
        tracker.routed(&finished, at(80));
        assert!(tracker.since.is_empty());
        // Events of a request never submitted here are ignored.
        tracker.routed(&tokens(9, 0, 1), at(90));
        assert_eq!(tracker.latency().time_to_first_token.count(), 1);
    }

    #[test]
    fn a_first_event_of_several_tokens_counts_the_rest_as_gaps() {
        let start = Instant::now();
        let mut tracker = LatencyTracker::default();
        tracker.submitted(RequestId(2), start);
        tracker.routed(&tokens(2, 0, 3), start + Duration::from_millis(30));
        assert_eq!(tracker.latency().time_to_first_token.count(), 1);
        assert_eq!(tracker.latency().inter_token.count(), 2);
    }
}
