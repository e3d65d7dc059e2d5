//! A runtime core loaded onto the GPU: window mapped at its exact base,
//! initial contents uploaded, modules loaded, every graph rebuilt and
//! instantiated.

use std::num::NonZeroU32;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::bench::{bench_decode, DecodeBench};
use super::core_dir::{CoreDir, ImageBytes};
use super::error::ReplayError;
use super::identity::check_device;
use super::initial::{InitialContents, PIECE_BYTES, READERS};
use super::isolate::{isolate, IsolationReport, NodeDevice};
use super::kv_backing::{kv_budget, plan_kv_prepared, plan_kv_within, KvBacking, KvPlan, KvWindow};
use super::qualify::{qualify_ranks, QualificationReport, ReplayDevice};
use super::report::LoadReport;
use super::spans::{
    check_backed, check_initial_backed, check_qualification_backed, merged, plan_spans_of,
    span_bytes,
};
use crate::core::proto::{self, GraphKind, RegionKind};
use crate::core::{RankView, ValidCore};
use crate::cuda::{covered, Span};
use crate::cuda::{Context, CudaError, Event, Graph, GraphExec, Modules, Stream, Window};

/// The collectives' wait limit `flare replay` and `flare run` load by default:
/// far longer than a rank ever waits for its peer's arrival while both run (a
/// step's skew), short enough that a rank whose peer faulted fails its step.
pub const COLLECTIVES_WAIT_LIMIT_NS: u64 = COLLECTIVES_WAIT_LIMIT_MS * 1_000_000;
/// [`COLLECTIVES_WAIT_LIMIT_NS`] in milliseconds, as the command line takes it.
pub const COLLECTIVES_WAIT_LIMIT_MS: u64 = 10_000;

/// How to load a core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// in nanoseconds (at most `i64::MAX`), written where the rank layout
    /// names the word; 0, the default here, leaves it at 0: waits forever
    /// (`flare run` and `flare replay` load [`COLLECTIVES_WAIT_LIMIT_NS`]).
    pub collectives_wait_limit_ns: u64,
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

/// When the KV pages are mapped.
enum KvStage {
    /// With the other regions, before anything uses them: the prepared
    /// extent.
    Early(KvPlan),
    /// Once the graphs are uploaded, sized from the free memory left then.
    Late {
        /// Device memory to keep free besides the driver margin.
        reserve_bytes: u64,
    },
}

/// The GPU side of a loaded core.
///
/// Release order is the field order (after `Drop::drop` drained the work):
/// executable graphs and graphs before the modules whose functions they
/// use, all of them before the window they address, the context last (every
/// owner also holds an `Rc` of it).
struct Gpu {
    execs: Vec<GraphExec>,
    /// Held only to be released in this order.
    _graphs: Vec<Graph>,
    _modules: Modules,
    stream: Stream,
    window: Window,
    context: Rc<Context>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.context.bind();
        let _ = self.stream.synchronize();
        let _ = self.context.synchronize();
    }
}

/// Every operation binds the rank's context first: a tensor-parallel core's
/// ranks are replayed from one thread.
impl ReplayDevice for Gpu {
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ReplayError> {
        self.context.bind()?;
        Ok(self.window.write(addr, data)?)
    }

    fn launch(&mut self, graph: usize) -> Result<(), ReplayError> {
        self.context.bind()?;
        let exec = self.execs.get(graph).ok_or(ReplayError::NoGraph {
            index: graph,
            count: self.execs.len(),
        })?;
        Ok(exec.launch(&self.stream)?)
    }

    fn synchronize(&mut self) -> Result<(), ReplayError> {
        self.context.bind()?;
        Ok(self.stream.synchronize()?)
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ReplayError> {
        self.context.bind()?;
        Ok(self.window.read(addr, out)?)
    }

    fn free_memory(&mut self) -> Result<u64, ReplayError> {
        self.context.bind()?;
        Ok(self.context.mem_get_info()?.free)
    }

    fn time_back_to_back(&mut self, graph: usize, launches: u32) -> Result<f64, ReplayError> {
        let start = Event::new(&self.context)?;
        let end = Event::new(&self.context)?;
        start.record(&self.stream)?;
        for _ in 0..launches {
            self.launch(graph)?;
        }
        end.record(&self.stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?))
    }
}

impl NodeDevice for Gpu {
    fn run_node(&mut self, graph: &proto::Graph, node: usize) -> Result<(), ReplayError> {
        let single = proto::Graph {
            kind: graph.kind,
            capacity: graph.capacity,
            nodes: vec![graph.nodes[node].clone()],
            edges: Vec::new(),
        };
        let built = Graph::build(&self.context, &single, &self._modules, &self.window)?;
        let exec = built.instantiate()?;
        exec.launch(&self.stream)?;
        Ok(self.stream.synchronize()?)
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

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Time spent reading tensors from disk and copying them to the device.
struct UploadTimes {
    read: Duration,
    upload: Duration,
}

fn upload_initial(
    rank: RankView<'_>,
    initial: &InitialContents,
    window: &Window,
) -> Result<UploadTimes, ReplayError> {
    let mut times = UploadTimes {
        read: Duration::ZERO,
        upload: Duration::ZERO,
    };
    if initial.uploads().is_empty() {
        return Ok(times);
    }
    let base = rank.window().base;
    let pieces = initial.read_pieces(PIECE_BYTES, READERS, |piece, bytes| {
        let buffer = &rank.buffers()[piece.upload.buffer];
        window.write(base + buffer.offset + piece.offset, bytes)?;
        Ok(())
    })?;
    // Reading overlaps the uploads: what counts as reading is the wait for it.
    times.read = pieces.waiting;
    times.upload = pieces.consuming;
    Ok(times)
}

fn load_modules(context: &Rc<Context>, images: &[ImageBytes]) -> Result<Modules, ReplayError> {
    let mut modules = Modules::new();
    for image in images {
        modules
            .load(context, &image.sha256, &image.bytes)
            .map_err(|source| ReplayError::Image {
                sha256: image.sha256.clone(),
                source,
            })?;
    }
    Ok(modules)
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
                wait_limit_ns: options.collectives_wait_limit_ns,
            };
            let (mut gpu, mut report) = load_rank(core, view, device, images, initial, how)?;
            grant_peers(&mut gpu, view, &devices)?;
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
        match self.core.world_size() {
            1 => Ok(()),
            world_size => Err(ReplayError::OneRankOnly { what, world_size }),
        }
    }
}

/// How [`load_rank`] backs a rank's KV pages and collectives.
#[derive(Debug, Clone, Copy)]
struct RankLoad {
    kv: KvBacking,
    /// Ranks loading onto the same device (their KV budget is shared).
    sharing: u64,
    /// Written as the collectives' wait limit where the layout names it.
    wait_limit_ns: u64,
}

/// Loads one rank onto `device` (see [`LoadedCore::load`]); the report's
/// `read_ms` counts only the initial tensors' wait, `total_ms` this rank.
///
/// With [`KvBacking::FromFreeMemory`], `sharing` ranks load onto this device
/// (serving threads, at the same time): this rank takes `1 / sharing` of the
/// budget measured after its graphs are built, the reserve counted once. A
/// peer that mapped its pages first leaves less to share, so ranks sharing a
/// device may back fewer pages than they could, never more than fit.
fn load_rank(
    core: &ValidCore,
    rank: RankView<'_>,
    device: i32,
    images: &[ImageBytes],
    initial: &InitialContents,
    how: RankLoad,
) -> Result<(Gpu, LoadReport), ReplayError> {
    let RankLoad {
        kv: kv_backing,
        sharing,
        wait_limit_ns,
    } = how;
    let started = Instant::now();
    let context = Context::new(device)?;
    let device = context.info()?;
    check_device(core.identity(), &device)?;
    let granularity = context.granularity()?;
    let not_kv = |region: &proto::Region| region.kind != RegionKind::KvPages as i32;
    let plan = plan_spans_of(rank.window(), granularity, not_kv)?;
    if let Some(collectives) = rank.collectives_region() {
        if !covered(&plan.spans, collectives.offset, collectives.size) {
            return Err(ReplayError::CollectivesUnbacked { rank: rank.rank() });
        }
    }
    let kv_window = |mapped| KvWindow {
        granularity,
        reservation: plan.reservation,
        mapped,
    };
    let mut early = plan.spans.clone();
    let stage = match kv_backing {
        KvBacking::Prepared => {
            let kv = plan_kv_prepared(rank, kv_window(&plan.spans))?;
            early = merged([early, kv.spans.clone()].concat());
            check_backed(rank, &early)?;
            KvStage::Early(kv)
        }
        KvBacking::FromFreeMemory { reserve_bytes } => {
            // The qualification is checked when it runs: with fewer
            // pages than prepared it cannot.
            check_initial_backed(rank, &early)?;
            KvStage::Late { reserve_bytes }
        }
    };
    let free = context.mem_get_info()?.free;
    if span_bytes(&early) > free {
        return Err(ReplayError::InsufficientMemory {
            needed: span_bytes(&early),
            free,
        });
    }

    // On failure the locals drop in reverse order of declaration:
    // executable graphs, graphs, stream, modules, window, context, the
    // same safe order as `Gpu`.
    let mapping = Instant::now();
    let mut window = Window::reserve(&context, rank.window().base, plan.reservation)?;
    for &span in &early {
        window.map(span)?;
    }
    context.synchronize()?;
    let mut map = mapping.elapsed();

    let times = upload_initial(rank, initial, &window)?;
    if let (Some(region), Some(offset)) = (
        rank.collectives_region(),
        core.collectives_wait_limit_offset(),
    ) {
        if wait_limit_ns > 0 {
            // The kernels read a signed word: past i64::MAX would mean forever.
            let limit = wait_limit_ns.min(i64::MAX as u64);
            let addr = rank.window().base + region.offset + offset;
            window.write(addr, &limit.to_le_bytes())?;
        }
    }
    context.synchronize()?;

    let loading = Instant::now();
    let modules = load_modules(&context, images)?;
    let module_load = loading.elapsed();

    let building = Instant::now();
    let stream = Stream::new(&context)?;
    let mut graphs = Vec::with_capacity(rank.graphs().len());
    let mut execs = Vec::with_capacity(rank.graphs().len());
    for (index, description) in rank.graphs().iter().enumerate() {
        let wrap = |source: CudaError| ReplayError::Graph {
            index,
            kind: GraphKind::try_from(description.kind)
                .unwrap_or_default()
                .as_str_name(),
            capacity: description.capacity,
            source,
        };
        let graph = Graph::build(&context, description, &modules, &window).map_err(wrap)?;
        let exec = graph.instantiate().map_err(wrap)?;
        exec.upload(&stream).map_err(wrap)?;
        graphs.push(graph);
        execs.push(exec);
    }
    stream.synchronize()?;
    let graph_build = building.elapsed();

    let (kv, kv_reserve_bytes) = match stage {
        KvStage::Early(kv) => (kv, None),
        KvStage::Late { reserve_bytes } => {
            let free = context.mem_get_info()?.free;
            let budget = kv_budget(free, reserve_bytes) / sharing.max(1);
            let kv = plan_kv_within(rank, kv_window(window.mapped()), budget)?;
            let mapping = Instant::now();
            for &span in &kv.spans {
                window.map(span)?;
            }
            context.synchronize()?;
            map += mapping.elapsed();
            (kv, Some(reserve_bytes))
        }
    };
    let contract = core.contract();

    let report = LoadReport {
        rank: rank.rank(),
        device,
        read_ms: ms(times.read),
        map_ms: ms(map),
        upload_ms: ms(times.upload),
        module_load_ms: ms(module_load),
        graph_build_ms: ms(graph_build),
        total_ms: ms(started.elapsed()),
        window_base: window.base(),
        window_reserved: window.size(),
        backed_bytes: window.mapped_bytes(),
        spans: window.mapped().len(),
        granularity,
        initial_tensors: initial.uploads().len(),
        initial_bytes: initial.bytes(),
        images: images.len(),
        image_bytes: images.iter().map(|image| image.bytes.len() as u64).sum(),
        graphs: graphs.len(),
        nodes: graphs.iter().map(Graph::node_count).sum(),
        free_after_load: context.mem_get_info()?.free,
        kv_pages: kv.pages,
        kv_pages_prepared: contract.kv_pages,
        kv_bytes: u64::from(kv.pages) * contract.bytes_per_page,
        kv_tokens: u64::from(kv.pages.saturating_sub(1)) * u64::from(contract.page_size),
        kv_reserve_bytes,
    };
    let gpu = Gpu {
        execs,
        _graphs: graphs,
        _modules: modules,
        stream,
        window,
        context,
    };
    Ok((gpu, report))
}

/// Opens `rank`'s collectives region (in `gpu`'s window) to every other
/// rank's device, whose graphs read and signal it. Ranks on the same device
/// need nothing.
fn grant_peers(gpu: &mut Gpu, rank: RankView<'_>, devices: &[i32]) -> Result<(), ReplayError> {
    let Some(region) = rank.collectives_region() else {
        return Ok(());
    };
    let span = Span {
        offset: region.offset,
        len: region.size,
    };
    let own = gpu.context.ordinal();
    let mut granted = Vec::new();
    for (peer, &device) in devices.iter().enumerate() {
        if peer as u32 == rank.rank() || device == own || granted.contains(&device) {
            continue;
        }
        if !gpu.context.peer_can_access(device)? {
            return Err(ReplayError::NoPeerAccess {
                from: device,
                to: own,
            });
        }
        gpu.context.bind()?;
        gpu.window.grant_access(span, device)?;
        granted.push(device);
    }
    Ok(())
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
