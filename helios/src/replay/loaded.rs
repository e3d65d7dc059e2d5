//! A runtime core loaded onto the GPU: every rank (replay) or one rank (a
//! serving thread's), each loaded by [`super::rank_load`].

use std::num::NonZeroU32;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::bench::{bench_decode, DecodeBench};
use super::core_dir::CoreDir;
use super::error::ReplayError;
use super::isolate::{isolate, IsolationReport};
use super::kv_backing::KvBacking;
use super::qualify::{qualify_ranks, QualificationReport};
use super::rank_load::{grant_peers, load_rank, ms, Gpu, RankLoad};
use super::report::LoadReport;
use super::spans::check_qualification_backed;
use crate::core::ValidCore;
use crate::cuda::{Context, CudaError, Stream, Window};
/// The collectives' wait limit `flare replay` and `flare run` load by default:
/// far longer than a rank ever waits for its peer's arrival while both run (a
/// step's skew), short enough that a rank whose peer faulted fails its step.
pub const COLLECTIVES_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// How to load a core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOptions {
    /// CUDA device ordinal (rank 0's, for a tensor-parallel core).
    pub device: i32,
    /// How many KV pages to back: the prepared extent (what the
    /// qualification covers) or as many as free memory holds.
    pub kv: KvBacking,
    /// The device of every rank of a tensor-parallel core, rank 0's first;
    /// empty: rank `r` on `device + r`. Ranks may share a device.
    pub rank_devices: Vec<i32>,
    /// The longest a rank's collective waits for its peer before it traps,
    /// written in nanoseconds where the rank layout names the word (at most
    /// `i64::MAX`, at least 1); `None` leaves the word at 0: waits forever.
    /// By default [`COLLECTIVES_WAIT_LIMIT`].
    pub collectives_wait_limit: Option<Duration>,
}

impl Default for LoadOptions {
    /// Device 0, the prepared KV pages, rank `r` on device `r`, the default
    /// collectives' wait limit.
    fn default() -> Self {
        Self {
            device: 0,
            kv: KvBacking::default(),
            rank_devices: Vec::new(),
            collectives_wait_limit: Some(COLLECTIVES_WAIT_LIMIT),
        }
    }
}

impl LoadOptions {
    /// The device of each of `world_size` ranks.
    pub fn devices(&self, world_size: u32) -> Result<Vec<i32>, ReplayError> {
        if self.rank_devices.is_empty() {
            return Ok((0..world_size as i32).map(|r| self.device + r).collect());
        }
        if self.rank_devices.len() != world_size as usize {
            return Err(ReplayError::RankDevices {
                given: self.rank_devices.len(),
                world_size,
            });
        }
        Ok(self.rank_devices.clone())
    }
}

/// A runtime core on the GPU, ready to replay. It stays on the thread that
/// loaded it. A tensor-parallel core holds every rank, each on its device.
pub struct LoadedCore {
    core: ValidCore,
    /// The rank of `gpus[0]`: 0, or the one rank a serving thread loaded
    /// ([`LoadedCore::load_rank`]).
    first_rank: u32,
    /// The loaded ranks' reports, in rank order.
    reports: Vec<LoadReport>,
    gpus: Vec<Gpu>,
}

impl Drop for LoadedCore {
    /// Every rank's work drains before any rank's window goes: a rank's
    /// graphs reach its peers' collectives regions.
    fn drop(&mut self) {
        for gpu in &self.gpus {
            let _ = gpu.context.bind();
            let _ = gpu.stream.synchronize();
        }
    }
}

impl std::fmt::Debug for LoadedCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedCore")
            .field("reports", &self.reports)
            .finish_non_exhaustive()
    }
}

impl LoadedCore {
    /// Loads the core directory at `path`: rank 0 onto device
    /// `options.device`, and every further rank of a tensor-parallel core
    /// onto its device ([`LoadOptions::devices`]).
    ///
    /// Every file is read and checked before any CUDA work; then, rank by
    /// rank, the device is checked against the core's identity, the window
    /// reserved at its exact base and the backed spans of every region but
    /// the KV page region mapped and zeroed (a collectives region among
    /// them: its flags start at zero, then its wait limit is written), the
    /// initial contents uploaded, the
    /// kernel images loaded and every graph rebuilt, instantiated and
    /// uploaded. The KV pages are mapped with the other regions for
    /// [`KvBacking::Prepared`]; for [`KvBacking::FromFreeMemory`] they are
    /// mapped last, as many as the free memory measured then holds (a
    /// one-rank core only here: [`ReplayError::RanksFromFreeMemory`]; a
    /// served group loads each rank on its thread, [`Self::load_rank`]).
    /// Each rank's collectives region is opened to every other rank's
    /// device.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self, ReplayError> {
        let started = Instant::now();
        let dir = CoreDir::read(path)?;
        let read = started.elapsed();
        let world_size = dir.core().world_size();
        if world_size > 1 && options.kv != KvBacking::Prepared {
            return Err(ReplayError::RanksFromFreeMemory { world_size });
        }
        let mut loaded = Self::load_ranks(&dir, 0..world_size, options, read)?;
        // Rank 0's total covers every rank's load.
        loaded.reports[0].total_ms = ms(started.elapsed());
        Ok(loaded)
    }

    /// Loads rank `rank` of the core read as `dir` onto its device
    /// ([`LoadOptions::devices`]), alone: what each execution thread of a
    /// served tensor-parallel core does (its CUDA objects stay on the thread
    /// that made them). Its collectives region is opened to every other
    /// rank's device. With [`KvBacking::FromFreeMemory`] each rank backs what
    /// its device holds; the group serves the fewest.
    pub fn load_rank(dir: &CoreDir, rank: u32, options: &LoadOptions) -> Result<Self, ReplayError> {
        Self::load_ranks(dir, rank..rank + 1, options, Duration::ZERO)
    }

    fn load_ranks(
        dir: &CoreDir,
        ranks: std::ops::Range<u32>,
        options: &LoadOptions,
        read: Duration,
    ) -> Result<Self, ReplayError> {
        let core = dir.core();
        let devices = options.devices(core.world_size())?;
        let images = dir.images();
        let mut reports = Vec::with_capacity(ranks.len());
        let mut gpus: Vec<Gpu> = Vec::with_capacity(ranks.len());
        let several = ranks.len() > 1;
        for rank in ranks.clone() {
            let view = core.rank(rank).ok_or(ReplayError::NoRank {
                rank,
                world_size: core.world_size(),
            })?;
            let device = devices[rank as usize];
            let initial = &dir.initial()[rank as usize];
            let how = RankLoad {
                kv: options.kv,
                sharing: devices.iter().filter(|&&other| other == device).count() as u64,
                wait_limit: options.collectives_wait_limit,
            };
            // Loading several ranks here, the failing one is named here (a
            // serving thread's one rank is named by its group).
            let in_rank = |source: ReplayError| {
                if !several {
                    return source;
                }
                ReplayError::Rank {
                    rank,
                    world_size: core.world_size(),
                    source: Box::new(source),
                }
            };
            let (mut gpu, mut report) =
                load_rank(core, view, device, images, initial, how).map_err(in_rank)?;
            grant_peers(&mut gpu, view, &devices).map_err(in_rank)?;
            // The files were read once, for every rank.
            if rank == ranks.start {
                report.read_ms += ms(read);
            }
            reports.push(report);
            gpus.push(gpu);
        }
        Ok(Self {
            core: core.clone(),
            first_rank: ranks.start,
            reports,
            gpus,
        })
    }

    /// The rank of the first (for a serving thread, the only) rank loaded.
    pub fn rank(&self) -> u32 {
        self.first_rank
    }

    /// The core's validated manifest.
    pub fn core(&self) -> &ValidCore {
        &self.core
    }

    /// What loading did and how long it took (the first loaded rank's: rank
    /// 0's, whose `total_ms` covers every rank, or a serving thread's one).
    pub fn report(&self) -> &LoadReport {
        &self.reports[0]
    }

    /// Every rank's load report, in rank order.
    pub fn reports(&self) -> &[LoadReport] {
        &self.reports
    }

    /// KV pages backed in every slab, the null page included: the host may
    /// hand out pages `1..kv_pages()` only. At most the prepared pages.
    pub fn kv_pages(&self) -> u32 {
        self.reports[0].kv_pages
    }

    /// Replays every rank's recorded qualification sequence, in lockstep
    /// ([`qualify_ranks`]), and compares every digest; one report per rank,
    /// in rank order. Meant for the freshly loaded core: the sequence starts
    /// from the initial contents. Its digests cover the whole KV pages
    /// buffer, so a core loaded with fewer KV pages than prepared is refused
    /// ([`ReplayError::Unbacked`]).
    pub fn check(&mut self) -> Result<Vec<QualificationReport>, ReplayError> {
        // A serving thread's one rank of a group would wait for its peers.
        if self.gpus.len() != self.core.world_size() as usize {
            return Err(ReplayError::OneRankOnly {
                what: "the qualification check",
                world_size: self.core.world_size(),
            });
        }
        let ranks = self.core.ranks();
        for (rank, gpu) in ranks.iter().zip(&self.gpus) {
            check_qualification_backed(*rank, gpu.window.mapped())?;
        }
        qualify_ranks(&ranks, &mut self.gpus)
    }

    /// Runs the qualification sequence with every node of every graph
    /// launched alone (topological order, waiting after each) and reports
    /// the first node the device rejects. A fault poisons the context, so
    /// this is the only use of a core after it. Refused, as
    /// [`LoadedCore::check`], with fewer KV pages than prepared, and for a
    /// tensor-parallel core (a node alone would wait for its peers forever).
    pub fn isolate(&mut self) -> Result<IsolationReport, ReplayError> {
        self.one_rank("fault isolation")?;
        check_qualification_backed(self.core.view(), self.gpus[0].window.mapped())?;
        isolate(&self.core, &mut self.gpus[0])
    }

    /// Replays the decode graph of `capacity` `steps` times, each step
    /// waiting for it and copying the completion records to the host; run
    /// after [`LoadedCore::check`] so the decode slots hold real requests.
    /// One rank only.
    pub fn bench_decode(
        &mut self,
        capacity: u32,
        steps: NonZeroU32,
    ) -> Result<DecodeBench, ReplayError> {
        self.one_rank("the decode bench")?;
        bench_decode(&self.core, &mut self.gpus[0], capacity, steps)
    }

    fn one_rank(&self, what: &'static str) -> Result<(), ReplayError> {
        one_rank(&self.core, what)
    }
}

/// Refuses a tensor-parallel `core` for `what`, which runs one rank alone
/// (its ranks' graphs wait for each other).
pub(super) fn one_rank(core: &ValidCore, what: &'static str) -> Result<(), ReplayError> {
    match core.world_size() {
        1 => Ok(()),
        world_size => Err(ReplayError::OneRankOnly { what, world_size }),
    }
}

/// What the serving executor drives: the core's stream, window and graphs.
impl LoadedCore {
    /// The CUDA context the core lives in.
    pub fn context(&self) -> &Rc<Context> {
        &self.gpus[0].context
    }

    /// The stream every graph of the core runs on.
    pub fn stream(&self) -> &Stream {
        &self.gpus[0].stream
    }

    /// The window, mapped at its exact base.
    pub fn window(&self) -> &Window {
        &self.gpus[0].window
    }

    /// Every loaded rank's window, in rank order.
    pub fn windows(&self) -> impl Iterator<Item = &Window> {
        self.gpus.iter().map(|gpu| &gpu.window)
    }

    /// Queues the graph at manifest position `index` on [`Self::stream`].
    pub fn launch_graph(&self, index: usize) -> Result<(), CudaError> {
        let exec = self.gpus[0]
            .execs
            .get(index)
            .ok_or(CudaError::InvalidNode {
                reason: format!("no graph at position {index}"),
            })?;
        exec.launch(&self.gpus[0].stream)
    }
}
