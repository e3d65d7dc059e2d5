//! Planning one iteration, as pure functions of the scheduler's state: at
//! most one request's prefill work (its admit, its prefix restore and the
//! next chunk of its history), then one decode step over every decoding
//! placement. Submitting a plan (`submit.rs`) is kept apart, so what an
//! iteration does is unit-tested here without an executor.
//!
//! Rules:
//! - prompts are prefilled one request at a time, in admission order: the
//!   oldest live placement with prompt work left is the one planned;
//! - a chunk ends at the first selected checkpoint endpoint after its start
//!   (so that endpoint can be snapshotted), at the prompt's end, or after
//!   the largest prefill capacity, whichever comes first; on a positional-KV
//!   core message endpoints are not among them (they are captured after
//!   the chunk that holds them, `checkpoints.rs`);
//! - a whole-history prefix hit has no chunk: its resume samples instead;
//! - decode candidates are the decoding placements with budget left, oldest
//!   admission first (growth may still stall or preempt some of them).

use std::collections::BTreeMap;

use super::geometry::Geometry;
use super::ids::RequestId;
use super::request::{Phase, Placed};

/// One request's prefill work for this iteration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PrefillPlan {
    /// The request.
    pub(super) id: RequestId,
    /// Its admit launch goes first (its first prefill iteration).
    pub(super) admit: bool,
    /// Then its prefix restore (and a whole-history hit's resume).
    pub(super) restore: bool,
    /// Then this chunk of its history; none for a whole-history hit.
    pub(super) chunk: Option<ChunkPlan>,
}

/// History tokens `start..end` in one prefill launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ChunkPlan {
    /// The first token.
    pub(super) start: u32,
    /// One past the last token.
    pub(super) end: u32,
    /// The prefill capacity whose graph runs it.
    pub(super) capacity: u32,
    /// Whether it ends the history, so it samples the first output token.
    pub(super) ends_prompt: bool,
}

/// The prefill work of this iteration, if any placement has some.
pub(super) fn plan_prefill(
    geometry: &Geometry,
    placed: &BTreeMap<RequestId, Placed>,
    by_admission: &BTreeMap<u64, RequestId>,
) -> Option<PrefillPlan> {
    let (id, placement) = (by_admission.values())
        .map(|id| (*id, &placed[id].placement))
        .find(|(_, placement)| placement.prefills())?;
    let restore = placement.phase == Phase::Restoring
        || (placement.phase == Phase::Admitting && placement.prefix.restore.is_some());
    let chunk = (!(restore && placement.prefix.resume)).then(|| {
        let start = placement.submitted_consumed;
        let stop = (placement.prefix.stops.iter().copied())
            .find(|&stop| stop > start)
            .unwrap_or(placement.history);
        let len = (stop - start).min(geometry.prefill_chunk_size());
        let end = start + len;
        ChunkPlan {
            start,
            end,
            capacity: (geometry.prefill_capacity(len))
                .expect("a chunk is at most the largest prefill capacity"),
            ends_prompt: end == placement.history,
        }
    });
    Some(PrefillPlan {
        id,
        admit: placement.phase == Phase::Admitting,
        restore,
        chunk,
    })
}

/// The decode candidates of this iteration, oldest admission first.
pub(super) fn plan_decode(
    placed: &BTreeMap<RequestId, Placed>,
    by_admission: &BTreeMap<u64, RequestId>,
) -> Vec<RequestId> {
    (by_admission.values().copied())
        .filter(|id| placed[id].placement.decodes())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::executor::SamplingParams;
    use super::super::ledger::PageLedger;
    use super::super::request::{Exit, Placement, Request, RequestSpec};
    use super::*;
    use crate::core::proto::PreparedContract;

    fn geometry() -> Geometry {
        // 64-token pages, prefill chunks of at most 256 tokens.
        let contract = PreparedContract {
            page_size: 64,
            max_concurrency: 8,
            context_limit: 1024,
            prefill_chunk_size: 256,
            decode_capacities: vec![1, 2, 4, 8],
            prefill_capacities: vec![128, 256],
            kv_pages: 200,
            vocab_size: 10,
            ..PreparedContract::default()
        };
        Geometry::from_contract(&contract, &[2]).unwrap()
    }

    /// Placements of `histories`, admitted in that order, all `Admitting`.
    fn placed(histories: &[u32]) -> (BTreeMap<RequestId, Placed>, BTreeMap<u64, RequestId>) {
        let mut ledger = PageLedger::new(8, 200);
        let mut placed = BTreeMap::new();
        let mut by_admission = BTreeMap::new();
        for (index, &history) in histories.iter().enumerate() {
            let id = RequestId(index as u64 + 10);
            let request = Request {
                spec: RequestSpec {
                    prompt: vec![1; history as usize],
                    max_new_tokens: 8,
                    sampling: SamplingParams::default(),
                    seed: 0,
                    message_endpoints: Vec::new(),
                    grammar: None,
                },
                chain: None,
                arrival: index as u64,
                output: Vec::new(),
                admitted: true,
                submitted: std::time::Instant::now(),
                first_launch: None,
                sampling_launch: None,
            };
            let placement = Placement::new(ledger.lease(0), index as u64, history, 8);
            placed.insert(id, Placed { request, placement });
            by_admission.insert(index as u64, id);
        }
        (placed, by_admission)
    }

    #[test]
    fn the_oldest_prefilling_placement_gets_its_admit_and_first_chunk() {
        let (placed, order) = placed(&[600, 100]);
        let plan = plan_prefill(&geometry(), &placed, &order).unwrap();
        assert_eq!(plan.id, RequestId(10));
        assert!(plan.admit && !plan.restore);
        let chunk = plan.chunk.unwrap();
        assert_eq!((chunk.start, chunk.end, chunk.ends_prompt), (0, 256, false));
        assert_eq!(chunk.capacity, 256);
        assert!(plan_decode(&placed, &order).is_empty());
    }

    #[test]
    fn a_chunk_stops_at_the_next_endpoint_and_at_the_prompt_end() {
        let (mut placed, order) = placed(&[300]);
        let placement = &mut placed.get_mut(&RequestId(10)).unwrap().placement;
        placement.phase = Phase::Prefilling;
        placement.submitted_consumed = 64;
        placement.prefix.stops = [64, 130].into();
        let chunk = plan_prefill(&geometry(), &placed, &order)
            .unwrap()
            .chunk
            .unwrap();
        assert_eq!((chunk.start, chunk.end, chunk.capacity), (64, 130, 128));
        let placement = &mut placed.get_mut(&RequestId(10)).unwrap().placement;
        placement.submitted_consumed = 130;
        let plan = plan_prefill(&geometry(), &placed, &order).unwrap();
        assert!(!plan.admit);
        let chunk = plan.chunk.unwrap();
        assert_eq!((chunk.end, chunk.ends_prompt), (300, true));
    }

    #[test]
    fn a_whole_history_hit_restores_and_resumes_without_a_chunk() {
        let (mut placed, order) = placed(&[128]);
        let placement = &mut placed.get_mut(&RequestId(10)).unwrap().placement;
        placement.phase = Phase::Restoring;
        placement.submitted_consumed = 128;
        placement.prefix.resume = true;
        let plan = plan_prefill(&geometry(), &placed, &order).unwrap();
        assert_eq!((plan.admit, plan.restore, plan.chunk), (false, true, None));
    }

    #[test]
    fn decoders_with_budget_are_planned_oldest_first_and_ended_ones_never() {
        let (mut placed, order) = placed(&[10, 20, 30, 40]);
        let phases = [
            (10, Phase::Decoding, 3),
            (11, Phase::Exiting(Exit::Cancelled), 1),
            (12, Phase::Decoding, 8),
            (13, Phase::Decoding, 1),
        ];
        for (id, phase, samples) in phases {
            let placement = &mut placed.get_mut(&RequestId(id)).unwrap().placement;
            placement.phase = phase;
            placement.submitted_samples = samples;
        }
        // 12 has drawn its whole budget; 11 ended.
        assert_eq!(
            plan_decode(&placed, &order),
            vec![RequestId(10), RequestId(13)]
        );
        assert_eq!(plan_prefill(&geometry(), &placed, &order), None);
    }
}
