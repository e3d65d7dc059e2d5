//! Submitting one iteration's plan: the prefill plan's admit, restore and
//! chunk, then one decode step over the planned candidates whose pages could
//! grow (`growth.rs`). What to submit is decided in `plan.rs`.

use super::engine::{Row, Scheduler};
use super::error::ExecutionError;
use super::executor::{Admit, Decode, Executor, Operation, PrefillChunk, Resume};
use super::growth::Growth;
use super::ids::{RequestId, Slot};
use super::plan::{plan_decode, plan_prefill, ChunkPlan, PrefillPlan};
use super::request::{len32, Phase, Placed, Placement};
use super::rng::readmission_seed;

impl<E: Executor> Scheduler<E> {
    /// The mask of request `id`'s next sample when it is constrained; a
    /// grammar that fails fails the request (its launch then samples
    /// unconstrained, into output nobody reads).
    pub(super) fn next_mask(&mut self, id: RequestId) -> Option<Vec<u32>> {
        let grammar = self.placed.get(&id)?.request.spec.grammar.clone()?;
        let words = (self.geometry.vocab_size() as usize).div_ceil(32);
        let started = std::time::Instant::now();
        let mask = grammar.mask(words);
        self.mask_time.observe(started.elapsed().as_secs_f64());
        match mask {
            Ok(mask) => Some(mask),
            Err(error) => {
                let reason = error.to_string();
                self.fail_with(id, ExecutionError::Grammar { reason });
                None
            }
        }
    }

    fn placement(&self, id: RequestId) -> &Placement {
        &self.placed[&id].placement
    }

    /// This iteration's prefill, planned from the current state.
    pub(super) fn prefill_plan(&self) -> Option<PrefillPlan> {
        plan_prefill(&self.geometry, &self.placed, &self.by_admission)
    }

    /// The admit of `id`'s current placement with `consumed` tokens already
    /// in its slot: a restored prefix, or (for a capture inside a chunk) the
    /// endpoint to snapshot and then the chunk's end again.
    pub(super) fn admit_at(&self, id: RequestId, consumed: u32) -> Admit {
        let Placed { request, placement } = &self.placed[&id];
        Admit {
            slot: placement.lease.slot(),
            prompt: request.history(0, placement.history),
            max_new_tokens: placement.budget,
            sampling: request.spec.sampling,
            seed: readmission_seed(request.spec.seed, request.output.len() as u64),
            consumed,
        }
    }

    /// Submits a prefill plan: the admit launch, the restore (and resume),
    /// then the chunk and the captures after it; returns the launches
    /// submitted.
    ///
    /// A chunk ending the prompt with a capture inside it cannot sample
    /// itself: the captures admit the slot back to their endpoints. A resume
    /// samples the first token right after the chunk, so the captures stay
    /// out of the time to first token, and when they admitted the slot back
    /// a resample after them restores the sampled state the decode needs
    /// (the same hidden vector, seed and counter give the same token).
    pub(super) fn submit_prefill(&mut self, plan: PrefillPlan) -> Result<usize, ExecutionError> {
        let id = plan.id;
        let mut submitted = 0;
        if plan.admit {
            let admit = self.admit_at(id, self.placement(id).submitted_consumed);
            let placement = self.placement_mut(id).expect("placed");
            placement.phase = if placement.prefix.restore.is_some() {
                Phase::Restoring
            } else {
                Phase::Prefilling
            };
            self.launch(Operation::Admit(admit), Vec::new(), vec![id], None)?;
            submitted += 1;
        }
        if plan.restore {
            submitted += self.submit_restore(id)?;
        }
        let Some(ChunkPlan {
            start,
            end,
            capacity,
            ends_prompt,
        }) = plan.chunk
        else {
            // A whole-history hit: the resume sampled instead of a chunk.
            return Ok(submitted);
        };
        let len = end - start;
        // A capture inside the chunk admits the slot back to its endpoint: a
        // chunk ending the prompt then samples through a resume.
        let folds = self.folds_in(id, start, end);
        let samples = ends_prompt && folds.iter().all(|&e| e == end);
        let placement = self.placement(id);
        let slot = placement.lease.slot();
        let tokens = self.placed[&id].request.history(start, end);
        // The admission reservation covers the whole history.
        self.take_pages(id, self.geometry.pages_for(end));
        self.prefilled_tokens += u64::from(len);
        let placement = self.placement_mut(id).expect("placed");
        placement.submitted_consumed = end;
        placement.submitted_samples += u32::from(ends_prompt);
        if ends_prompt {
            placement.phase = Phase::Decoding;
        }
        let mask = if samples { self.next_mask(id) } else { None };
        let chunk = PrefillChunk {
            slot,
            capacity,
            tokens,
            samples,
            mask,
        };
        let row = Row::Chunk { id, len, samples };
        self.launch(Operation::PrefillChunk(chunk), vec![row], vec![id], None)?;
        submitted += 1;
        // The resample repeats the resume's sample, under the same mask.
        let resume_mask = (ends_prompt && !samples).then(|| self.next_mask(id));
        if let Some(mask) = &resume_mask {
            submitted += self.submit_resume(id, Row::Resume { id }, mask.clone())?;
        }
        if !folds.is_empty() {
            let (launches, readmitted) = self.capture_folds(id, end)?;
            submitted += launches;
            if let (Some(mask), true) = (resume_mask, readmitted) {
                submitted += self.submit_resume(id, Row::Resample { id }, mask)?;
            }
        }
        submitted += self.capture_at_stop(id, end)?;
        Ok(submitted)
    }

    /// Submits a resume of `id`'s slot for `row` (a sample, or a resample
    /// of it) under `mask`; one launch.
    pub(super) fn submit_resume(
        &mut self,
        id: RequestId,
        row: Row,
        mask: Option<Vec<u32>>,
    ) -> Result<usize, ExecutionError> {
        let slot = self.placement(id).lease.slot();
        let resume = Resume { slot, mask };
        self.launch(Operation::Resume(resume), vec![row], vec![id], None)?;
        Ok(1)
    }

    /// Submits one decode step over the planned candidates (oldest first,
    /// after growing their pages); returns the launches submitted.
    pub(super) fn submit_decode(&mut self) -> Result<usize, ExecutionError> {
        let candidates = plan_decode(&self.placed, &self.by_admission);
        let mut batch = Vec::with_capacity(candidates.len());
        for id in candidates {
            // An earlier candidate's growth may have preempted this one (and
            // retired it, when nothing in flight referenced it). A constrained
            // one waits until its earlier samples are applied: its mask
            // follows them.
            let decodes = (self.placed.get(&id)).is_some_and(|placed| {
                let placement = &placed.placement;
                let caught_up = placed.request.spec.grammar.is_none()
                    || placement.confirmed.generated >= placement.submitted_samples;
                placement.decodes() && caught_up
            });
            if decodes && self.grow(id) == Growth::Ready {
                batch.push(id);
            }
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let capacity = (self.geometry)
            .decode_capacity(len32(batch.len()))
            .expect("decoders hold distinct slots, at most max_concurrency");
        let mut slots = Vec::with_capacity(capacity as usize);
        let mut rows = Vec::with_capacity(capacity as usize);
        let mut masks: Vec<Option<Vec<u32>>> = batch.iter().map(|&id| self.next_mask(id)).collect();
        if masks.iter().all(Option::is_none) {
            masks.clear();
        } else {
            masks.resize(capacity as usize, None);
        }
        for &id in &batch {
            let placement = self.placement_mut(id).expect("placed");
            placement.submitted_consumed += 1;
            placement.submitted_samples += 1;
            slots.push(placement.lease.slot());
            rows.push(Row::Decode { id });
        }
        slots.resize(capacity as usize, Slot::NULL);
        rows.resize(capacity as usize, Row::Padding);
        let decode = Decode {
            capacity,
            slots,
            masks,
        };
        self.launch(Operation::Decode(decode), rows, batch, None)?;
        Ok(1)
    }
}
