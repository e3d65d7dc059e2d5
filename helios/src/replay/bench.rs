//! The native decode replay bench: one decode graph replayed step after step
//! with the per-step work of the Python replay harness (launch, wait, copy
//! the completion records to the host), timed on the host; then what one
//! checkpoint costs: the snapshot and restore graphs' device time and the
//! bytes of a snapshot row.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::ReplayError;
use super::qualify::ReplayDevice;
use crate::core::proto::{BufferRole, GraphKind, Semantic};
use crate::core::{CoreError, ValidCore};

/// A distribution of durations in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Median (the mean of the middle two for an even count).
    pub median_ms: f64,
    /// 99th percentile: the sample at index `floor(0.99 * n)` of the sorted
    /// samples, as the Python replay floor computes it.
    pub p99_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Smallest sample.
    pub min_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl Timing {
    /// Summarizes `samples` (milliseconds); `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let (&min_ms, &max_ms) = (sorted.first()?, sorted.last()?);
        let median_ms = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let p99 = ((0.99 * n as f64) as usize).min(n - 1);
        Some(Self {
            median_ms,
            p99_ms: sorted[p99],
            mean_ms: sorted.iter().sum::<f64>() / n as f64,
            min_ms,
            max_ms,
        })
    }
}

/// What the decode bench measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeBench {
    /// The decode graph's capacity.
    pub capacity: u32,
    /// Its position in the manifest.
    pub graph: usize,
    /// Steps replayed.
    pub steps: u32,
    /// One step: from the launch call to the completion records on the
    /// host.
    pub step: Timing,
    /// Host submission gap: from the previous step's completion records on
    /// the host to this step's launch call returning (absent for one step).
    pub submission_gap: Option<Timing>,
    /// Wall time of all steps together.
    pub total_ms: f64,
    /// Device time of one replay when `steps` replays are queued back to
    /// back after the timed steps: the graph's own cost, without the host.
    pub device_ms_per_replay: f64,
    /// Free device memory before the first step.
    pub free_before: u64,
    /// Free device memory after the last timed step.
    pub free_after: u64,
    /// Whether free memory is unchanged.
    pub allocation_free: bool,
    /// What one checkpoint costs, timed after the steps; absent for a core
    /// without snapshot rows.
    pub checkpoint: Option<CheckpointCost>,
}

/// What one prefix checkpoint costs on the device: the snapshot graph copies
/// a slot's continuation state into a snapshot row, the restore graph copies
/// it back. Each is timed as the decode graph's device time is, `launches`
/// replays queued back to back, over whatever slot and row the inputs
/// already name (the qualification's last).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CheckpointCost {
    /// Bytes of one snapshot row: every snapshot-row buffer's share of a
    /// row (K/V tail pages and, for rows-continuation cores, the
    /// continuation rows).
    pub row_bytes: u64,
    /// Replays timed per graph.
    pub launches: u32,
    /// Device time of one snapshot replay.
    pub snapshot_ms: f64,
    /// Device time of one restore replay.
    pub restore_ms: f64,
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Replays the decode graph of `capacity` `steps` times on `device`, each
/// step launching, waiting and copying the completion records
/// (`SEMANTIC_COMPLETIONS`) to the host. No input is written: the slots
/// the device holds (left by the qualification) stay as they are.
pub fn bench_decode<D: ReplayDevice>(
    core: &ValidCore,
    device: &mut D,
    capacity: u32,
    steps: NonZeroU32,
) -> Result<DecodeBench, ReplayError> {
    let graph = (core.graphs().iter())
        .position(|g| g.kind == GraphKind::Decode as i32 && g.capacity == capacity)
        .ok_or_else(|| ReplayError::NoDecodeGraph {
            capacity,
            available: core.contract().decode_capacities.clone(),
        })?;
    let completions = core
        .buffer(Semantic::Completions)
        .ok_or(CoreError::Missing {
            field: "SEMANTIC_COMPLETIONS",
        })?;
    let addr = core.window().base + completions.offset;
    let mut records = vec![0u8; completions.size_bytes as usize];

    let count = steps.get() as usize;
    let mut step_ms = Vec::with_capacity(count);
    let mut gap_ms = Vec::with_capacity(count);
    let free_before = device.free_memory()?;
    let started = Instant::now();
    let mut previous_done: Option<Instant> = None;
    for _ in 0..count {
        let start = Instant::now();
        device.launch(graph)?;
        let launched = Instant::now();
        device.synchronize()?;
        device.read(addr, &mut records)?;
        let done = Instant::now();
        step_ms.push(ms(done - start));
        if let Some(previous) = previous_done {
            gap_ms.push(ms(launched - previous));
        }
        previous_done = Some(done);
    }
    let total_ms = ms(started.elapsed());
    let free_after = device.free_memory()?;
    let device_ms = device.time_back_to_back(graph, steps.get())?;
    let checkpoint = checkpoint_cost(core, device, steps.get())?;
    Ok(DecodeBench {
        capacity,
        graph,
        steps: steps.get(),
        // Never empty: there is at least one step.
        step: Timing::of(&step_ms).unwrap_or_default(),
        submission_gap: Timing::of(&gap_ms),
        total_ms,
        device_ms_per_replay: device_ms / f64::from(steps.get()),
        free_before,
        free_after,
        allocation_free: free_before == free_after,
        checkpoint,
    })
}

/// Times `launches` back-to-back replays of the snapshot graph, then of the
/// restore graph; `None` when the core has no snapshot rows or lacks either
/// graph.
fn checkpoint_cost<D: ReplayDevice>(
    core: &ValidCore,
    device: &mut D,
    launches: u32,
) -> Result<Option<CheckpointCost>, ReplayError> {
    let rows = core.contract().snapshot_rows;
    let position = |kind: GraphKind| (core.graphs().iter()).position(|g| g.kind == kind as i32);
    let (Some(snapshot), Some(restore)) =
        (position(GraphKind::Snapshot), position(GraphKind::Restore))
    else {
        return Ok(None);
    };
    if rows == 0 {
        return Ok(None);
    }
    let row_bytes = (core.buffers().iter())
        .filter(|b| b.role == BufferRole::SnapshotRows as i32)
        .map(|b| b.size_bytes / u64::from(rows))
        .sum();
    let snapshot_ms = device.time_back_to_back(snapshot, launches)? / f64::from(launches);
    let restore_ms = device.time_back_to_back(restore, launches)? / f64::from(launches);
    Ok(Some(CheckpointCost {
        row_bytes,
        launches,
        snapshot_ms,
        restore_ms,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_of_an_odd_count() {
        let t = Timing::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(t.median_ms, 2.0);
        assert_eq!(t.p99_ms, 3.0);
        assert_eq!(t.mean_ms, 2.0);
        assert_eq!((t.min_ms, t.max_ms), (1.0, 3.0));
    }

    #[test]
    fn timing_of_an_even_count_averages_the_middle() {
        assert_eq!(Timing::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median_ms, 2.5);
    }

    #[test]
    fn p99_is_the_python_floor_index() {
        let samples: Vec<f64> = (0..200).map(f64::from).collect();
        // floor(0.99 * 200) = 198
        assert_eq!(Timing::of(&samples).unwrap().p99_ms, 198.0);
        let samples: Vec<f64> = (0..50).map(f64::from).collect();
        // floor(0.99 * 50) = 49
        assert_eq!(Timing::of(&samples).unwrap().p99_ms, 49.0);
    }

    #[test]
    fn no_samples_no_timing() {
        assert!(Timing::of(&[]).is_none());
    }
}
