//! One rank of a runtime core loaded onto its device: the window reserved at
//! its exact base and backed, the initial contents uploaded (and a
//! collectives region's wait limit written), the kernel images loaded, every
//! graph rebuilt and instantiated, the KV pages backed, and the collectives
//! region opened to the peer ranks' devices. [`super::LoadedCore`] holds
//! one rank or every rank of a core.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::core_dir::ImageBytes;
use super::error::ReplayError;
use super::identity::check_device;
use super::initial::{InitialContents, PIECE_BYTES, READERS};
use super::isolate::NodeDevice;
use super::kv_backing::{kv_budget, plan_kv_prepared, plan_kv_within, KvBacking, KvPlan, KvWindow};
use super::qualify::ReplayDevice;
use super::report::LoadReport;
use super::spans::{check_backed, check_initial_backed, merged, plan_spans_of, span_bytes};
use crate::core::proto::{self, GraphKind, RegionKind};
use crate::core::{RankView, ValidCore};
use crate::cuda::{covered, Span};
use crate::cuda::{Context, CudaError, Event, Graph, GraphExec, Modules, Stream, Window};

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
pub(super) struct Gpu {
    pub(super) execs: Vec<GraphExec>,
    /// Held only to be released in this order.
    pub(super) _graphs: Vec<Graph>,
    pub(super) _modules: Modules,
    pub(super) stream: Stream,
    pub(super) window: Window,
    pub(super) context: Rc<Context>,
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

pub(super) fn ms(duration: Duration) -> f64 {
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

/// How [`load_rank`] backs a rank's KV pages and collectives.
#[derive(Debug, Clone, Copy)]
pub(super) struct RankLoad {
    pub(super) kv: KvBacking,
    /// Ranks loading onto the same device (their KV budget is shared).
    pub(super) sharing: u64,
    /// Written as the collectives' wait limit where the layout names it
    /// (`None`: left at 0, waits forever).
    pub(super) wait_limit: Option<Duration>,
}

/// Loads one rank onto `device` (see [`LoadedCore::load`]); the report's
/// `read_ms` counts only the initial tensors' wait, `total_ms` this rank.
///
/// With [`KvBacking::FromFreeMemory`], `sharing` ranks load onto this device
/// (serving threads, at the same time): this rank takes `1 / sharing` of the
/// budget measured after its graphs are built, the reserve counted once. A
/// peer that mapped its pages first leaves less to share, so ranks sharing a
/// device may back fewer pages than they could, never more than fit.
pub(super) fn load_rank(
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
        wait_limit,
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
        if let Some(wait_limit) = wait_limit {
            // The kernels read signed nanoseconds, 0 meaning forever: a limit
            // rounds up to 1 ns and down to i64::MAX.
            let limit = wait_limit.as_nanos().clamp(1, i64::MAX as u128) as u64;
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
pub(super) fn grant_peers(
    gpu: &mut Gpu,
    rank: RankView<'_>,
    devices: &[i32],
) -> Result<(), ReplayError> {
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
