//! The model thread's executor for `flare run`: one rank's [`GpuExecutor`]
//! over a loaded core, or, for a tensor-parallel core, a [`RankGroup`] with
//! one execution thread per rank, each loading its rank onto its device
//! ([`LoadedCore::load_rank`]) and driving it.
//!
//! Every rank backs as many KV pages as its device holds beside the reserve
//! (ranks sharing a device share it); the group serves the fewest, so a page the scheduler hands out is backed
//! on every rank (the ranks take the same page and slot assignments).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::execution::GpuExecutor;
use crate::replay::{CoreDir, LoadOptions, LoadReport, LoadedCore, ReplayError};
use crate::scheduler::{Completion, ExecutionError, Executor, Launch, RankGroup, Ticket};

/// What the model thread drives.
pub(super) enum Served {
    /// A one-rank core.
    One(Box<GpuExecutor>),
    /// Every rank of a tensor-parallel core, one execution thread each.
    Ranks(RankGroup<GpuExecutor>),
}

impl Executor for Served {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        match self {
            Served::One(one) => one.submit(launch),
            Served::Ranks(group) => group.submit(launch),
        }
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        match self {
            Served::One(one) => one.poll(ticket),
            Served::Ranks(group) => group.poll(ticket),
        }
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        match self {
            Served::One(one) => one.wait(ticket),
            Served::Ranks(group) => group.wait(ticket),
        }
    }

    fn applies_masks(&self) -> bool {
        match self {
            Served::One(one) => one.applies_masks(),
            Served::Ranks(group) => group.applies_masks(),
        }
    }

    fn drain(&mut self) -> Result<(), ExecutionError> {
        match self {
            Served::One(one) => one.drain(),
            // Each rank drains on its own thread when the group is joined,
            // before the ranks' teardown meeting.
            Served::Ranks(_) => Ok(()),
        }
    }
}

/// A loaded executor and each rank's load report in rank order.
pub(super) struct Loaded {
    pub(super) executor: Served,
    pub(super) reports: Vec<LoadReport>,
}

impl Loaded {
    /// The KV pages every rank backs: the fewest any rank does.
    pub(super) fn kv_pages(&self) -> u32 {
        (self.reports.iter().map(|report| report.kv_pages).min()).expect("at least rank 0")
    }
}

pub(super) fn load_failure(error: ReplayError) -> ExecutionError {
    ExecutionError::Device {
        operation: "core load",
        source: Arc::new(error),
    }
}

/// Loads the core at `path` under `options` (on the calling thread for one
/// rank; on one thread per rank for several).
/// Rank 0's report's `read_ms` and `total_ms` count reading the directory.
pub(super) fn load(path: &Path, options: &LoadOptions) -> Result<Loaded, ExecutionError> {
    let started = Instant::now();
    let dir = CoreDir::read(path).map_err(load_failure)?;
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    let world_size = dir.core().world_size();
    let mut loaded = if world_size == 1 {
        let loaded = LoadedCore::load_rank(&dir, 0, options).map_err(load_failure)?;
        let reports = loaded.reports().to_vec();
        Loaded {
            executor: Served::One(Box::new(GpuExecutor::new(loaded)?)),
            reports,
        }
    } else {
        load_ranks(dir, world_size, options)?
    };
    let zero = &mut loaded.reports[0];
    zero.read_ms += read_ms;
    zero.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(loaded)
}

fn load_ranks(
    dir: CoreDir,
    world_size: u32,
    options: &LoadOptions,
) -> Result<Loaded, ExecutionError> {
    // Devices for every rank are checked before any rank starts.
    options.devices(world_size).map_err(load_failure)?;
    let dir = Arc::new(dir);
    let options = options.clone();
    let (group, reports) = RankGroup::spawn(world_size as usize, move |rank| {
        let loaded = LoadedCore::load_rank(&dir, rank as u32, &options).map_err(load_failure)?;
        let report = loaded.report().clone();
        Ok((GpuExecutor::new(loaded)?, report))
    })?;
    Ok(Loaded {
        executor: Served::Ranks(group),
        reports,
    })
}
