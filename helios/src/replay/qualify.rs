//! The qualification check: replay the sequence recorded from Python replay
//! and compare every recorded digest bitwise.
//!
//! The loop runs against [`ReplayDevice`], the few operations a replay needs,
//! so its logic is tested with a CPU fake; [`super::LoadedCore`] implements it
//! on the GPU.

use serde::Serialize;

use super::digest::sha256_hex;
use super::error::ReplayError;
use crate::core::proto::GraphKind;
use crate::core::{CoreError, RankView, ValidCore};

/// What a replay does to a device: host copies at absolute window addresses,
/// graph launches by manifest position, and free memory.
pub trait ReplayDevice {
    /// Copies `data` to `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ReplayError>;
    /// Queues one replay of graph `graph` (its position in the manifest).
    fn launch(&mut self, graph: usize) -> Result<(), ReplayError>;
    /// Waits until every queued replay has finished.
    fn synchronize(&mut self) -> Result<(), ReplayError>;
    /// Copies `out.len()` bytes from `addr` into `out`.
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ReplayError>;
    /// Free device memory in bytes.
    fn free_memory(&mut self) -> Result<u64, ReplayError>;
    /// Device milliseconds of `launches` replays of `graph` queued back to
    /// back (no host work between them).
    fn time_back_to_back(&mut self, graph: usize, launches: u32) -> Result<f64, ReplayError>;
}

/// One qualification step's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepReport {
    /// Position of the step in the sequence.
    pub step: usize,
    /// Position of the graph it launched.
    pub graph: usize,
    /// The graph's kind, for example `GRAPH_KIND_DECODE`.
    pub kind: &'static str,
    /// The graph's capacity.
    pub capacity: u32,
    /// Host writes applied before the launch.
    pub writes: usize,
    /// Digests compared after it.
    pub digests: usize,
    /// Whether every digest matched.
    pub ok: bool,
    /// Buffers whose digest differs, in the step's order.
    pub mismatched: Vec<String>,
}

/// The result of the whole qualification sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QualificationReport {
    /// The rank whose sequence this is (0 for a one-rank core).
    pub rank: u32,
    /// Every step, in order.
    pub steps: Vec<StepReport>,
    /// Number of steps.
    pub total_steps: usize,
    /// Steps whose digests all matched.
    pub matched_steps: usize,
    /// Free device memory before the first step.
    pub free_before: u64,
    /// Free device memory after the last step.
    pub free_after: u64,
    /// Whether free memory is unchanged: steady-state replay allocates
    /// nothing.
    pub allocation_free: bool,
}

impl QualificationReport {
    /// Whether every digest of every step matched.
    pub fn passed(&self) -> bool {
        self.matched_steps == self.total_steps
    }
}

/// Absolute address and extent of buffer `name` on `rank`, which validation
/// guarantees exists and lies in the rank's window (so the sum cannot
/// overflow).
pub(crate) fn locate(rank: RankView<'_>, name: &str) -> Result<(u64, u64), ReplayError> {
    let buffer = rank
        .buffer_named(name)
        .ok_or_else(|| CoreError::UnknownReference {
            what: "buffer",
            name: name.to_owned(),
        })?;
    Ok((rank.window().base + buffer.offset, buffer.size_bytes))
}

/// Replays `core`'s qualification sequence (rank 0's) on `device`, which must
/// hold the freshly loaded core: per step, the writes, one launch, a
/// synchronize, then every digest compared.
pub fn qualify<D: ReplayDevice>(
    core: &ValidCore,
    device: &mut D,
) -> Result<QualificationReport, ReplayError> {
    let mut reports = qualify_ranks(&[core.view()], std::slice::from_mut(device))?;
    Ok(reports.remove(0))
}

/// Replays every rank's qualification sequence, `ranks[r]` on `devices[r]`,
/// in lockstep: per step, every rank's writes, then every rank's launch,
/// then every rank synchronized, then each rank's digests compared.
/// Validation holds every rank's sequence to rank 0's length and graphs.
/// One report per rank, in rank order.
///
/// The ranks' collectives rendezvous inside the graphs, so no rank may wait
/// while a launch of this step is still unqueued: host copies
/// ([`ReplayDevice::write`], [`ReplayDevice::read`]) are synchronous and, for
/// ranks sharing a device (one context), wait for every stream of it, a peer
/// rank's graph spinning on a collective included. So the copies run only
/// while nothing is queued on any rank: the writes after the previous step
/// finished everywhere, the reads after this one did.
pub fn qualify_ranks<D: ReplayDevice>(
    ranks: &[RankView<'_>],
    devices: &mut [D],
) -> Result<Vec<QualificationReport>, ReplayError> {
    assert_eq!(ranks.len(), devices.len(), "one device per rank");
    let sequences = (ranks.iter())
        .map(|rank| rank.qualification().ok_or(ReplayError::NoQualification))
        .collect::<Result<Vec<_>, _>>()?;
    let free_before = (devices.iter_mut())
        .map(ReplayDevice::free_memory)
        .collect::<Result<Vec<_>, _>>()?;
    let length = sequences.iter().map(|q| q.steps.len()).min().unwrap_or(0);
    let mut contents = Vec::new();
    let mut steps: Vec<Vec<StepReport>> = vec![Vec::with_capacity(length); ranks.len()];
    for index in 0..length {
        for ((rank, sequence), device) in ranks.iter().zip(&sequences).zip(devices.iter_mut()) {
            for write in &sequence.steps[index].writes {
                let (addr, _) = locate(*rank, &write.buffer)?;
                device.write(addr + write.offset, &write.data)?;
            }
        }
        for (sequence, device) in sequences.iter().zip(devices.iter_mut()) {
            device.launch(sequence.steps[index].graph as usize)?;
        }
        for device in devices.iter_mut() {
            device.synchronize()?;
        }
        for (((rank, sequence), device), reports) in
            (ranks.iter().zip(&sequences).zip(devices.iter_mut())).zip(&mut steps)
        {
            let step = &sequence.steps[index];
            let mut mismatched = Vec::new();
            for digest in &step.digests {
                let (addr, len) = locate(*rank, &digest.buffer)?;
                contents.resize(len as usize, 0);
                device.read(addr, &mut contents)?;
                if sha256_hex(&contents) != digest.sha256 {
                    mismatched.push(digest.buffer.clone());
                }
            }
            let graph_index = step.graph as usize;
            let graph = rank.graphs().get(graph_index);
            reports.push(StepReport {
                step: index,
                graph: graph_index,
                kind: graph
                    .and_then(|g| GraphKind::try_from(g.kind).ok())
                    .unwrap_or_default()
                    .as_str_name(),
                capacity: graph.map_or(0, |g| g.capacity),
                writes: step.writes.len(),
                digests: step.digests.len(),
                ok: mismatched.is_empty(),
                mismatched,
            });
        }
    }
    let mut reports = Vec::with_capacity(ranks.len());
    for (((rank, steps), device), free_before) in
        (ranks.iter().zip(steps).zip(devices.iter_mut())).zip(free_before)
    {
        let free_after = device.free_memory()?;
        reports.push(QualificationReport {
            rank: rank.rank(),
            total_steps: steps.len(),
            matched_steps: steps.iter().filter(|step| step.ok).count(),
            steps,
            free_before,
            free_after,
            allocation_free: free_before == free_after,
        });
    }
    Ok(reports)
}
