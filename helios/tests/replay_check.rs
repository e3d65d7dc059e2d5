//! The qualification check and the decode bench against a CPU fake of the
//! device: the window as host memory, graphs as functions over it that take
//! effect when the device is synchronized.

use std::num::NonZeroU32;

use helios::core::proto::{
    BufferDigest, BufferRole, BufferWrite, Core, GraphKind, QualificationStep, Semantic,
};
use helios::core::sample::{tiny_core, SAMPLE_WINDOW};
use helios::core::ValidCore;
use helios::cuda::CudaError;
use helios::replay::{bench_decode, qualify, sha256_hex, ReplayDevice, ReplayError};

type Effect = fn(&ValidCore, &mut [u8]);

/// Every launch, synchronize, read and write the loop does, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Write(u64, usize),
    Launch(usize),
    Synchronize,
    Read(u64, usize),
    BackToBack(usize, u32),
}

struct FakeDevice {
    core: ValidCore,
    memory: Vec<u8>,
    effects: Vec<Effect>,
    queued: Vec<usize>,
    calls: Vec<Call>,
    free: Vec<u64>,
    fail_launch: bool,
}

impl FakeDevice {
    fn new(core: &ValidCore, effects: Vec<Effect>) -> Self {
        Self {
            core: core.clone(),
            memory: vec![0; SAMPLE_WINDOW as usize],
            effects,
            queued: Vec::new(),
            calls: Vec::new(),
            free: Vec::new(),
            fail_launch: false,
        }
    }

    fn offset(&self, addr: u64) -> usize {
        (addr - self.core.window().base) as usize
    }

    fn launches(&self) -> Vec<usize> {
        (self.calls.iter())
            .filter_map(|call| match call {
                Call::Launch(graph) => Some(*graph),
                _ => None,
            })
            .collect()
    }
}

impl ReplayDevice for FakeDevice {
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ReplayError> {
        self.calls.push(Call::Write(addr, data.len()));
        let at = self.offset(addr);
        self.memory[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn launch(&mut self, graph: usize) -> Result<(), ReplayError> {
        if self.fail_launch {
            return Err(CudaError::Driver {
                call: "cuGraphLaunch",
                code: 700,
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".to_owned(),
            }
            .into());
        }
        self.calls.push(Call::Launch(graph));
        self.queued.push(graph);
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), ReplayError> {
        self.calls.push(Call::Synchronize);
        for graph in std::mem::take(&mut self.queued) {
            if let Some(effect) = self.effects.get(graph) {
                effect(&self.core, &mut self.memory);
            }
        }
        Ok(())
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ReplayError> {
        self.calls.push(Call::Read(addr, out.len()));
        let at = self.offset(addr);
        out.copy_from_slice(&self.memory[at..at + out.len()]);
        Ok(())
    }

    fn free_memory(&mut self) -> Result<u64, ReplayError> {
        Ok(if self.free.is_empty() {
            1 << 30
        } else {
            self.free.remove(0)
        })
    }

    fn time_back_to_back(&mut self, graph: usize, launches: u32) -> Result<f64, ReplayError> {
        self.calls.push(Call::BackToBack(graph, launches));
        Ok(f64::from(launches) * 0.25)
    }
}

fn extent(core: &ValidCore, name: &str) -> std::ops::Range<usize> {
    let buffer = core.buffer_named(name).unwrap();
    buffer.offset as usize..(buffer.offset + buffer.size_bytes) as usize
}

/// Graph 0 (decode at capacity 1) copies the decode slots into the
/// completion records.
fn copy_slots(core: &ValidCore, memory: &mut [u8]) {
    let slots = extent(core, "staging.decode_slots");
    let records = extent(core, "staging.completions");
    let len = slots.len().min(records.len());
    memory.copy_within(slots.start..slots.start + len, records.start);
}

/// Graph 1 (decode at capacity 2) adds one to every byte of the logits.
fn bump_logits(core: &ValidCore, memory: &mut [u8]) {
    for byte in &mut memory[extent(core, "staging.logits")] {
        *byte = byte.wrapping_add(1);
    }
}

/// The bytes of buffer `name` in a zeroed window after `change`.
fn expected(core: &ValidCore, name: &str, change: impl FnOnce(&mut [u8])) -> String {
    let mut memory = vec![0u8; SAMPLE_WINDOW as usize];
    change(&mut memory);
    sha256_hex(&memory[extent(core, name)])
}

fn digest(buffer: &str, sha256: String) -> BufferDigest {
    BufferDigest {
        buffer: buffer.to_owned(),
        sha256,
    }
}

/// A two-step qualification: write slots at an offset, decode@1 (copies
/// them into the records), then decode@2 (bumps the logits), with the
/// digests the fake must reproduce.
fn qualified_core() -> ValidCore {
    let plain = ValidCore::new(tiny_core()).unwrap();
    let slots = extent(&plain, "staging.decode_slots");
    let after_first = |memory: &mut [u8]| {
        memory[slots.start + 4..slots.start + 8].copy_from_slice(&[9, 0, 0, 0]);
        copy_slots(&plain, memory);
    };
    let records = expected(&plain, "staging.completions", after_first);
    let logits = expected(&plain, "staging.logits", |m| bump_logits(&plain, m));
    let mut core: Core = tiny_core();
    core.qualification.as_mut().unwrap().steps = vec![
        QualificationStep {
            graph: 0,
            writes: vec![BufferWrite {
                buffer: "staging.decode_slots".to_owned(),
                offset: 4,
                data: vec![9, 0, 0, 0],
            }],
            digests: vec![digest("staging.completions", records)],
        },
        QualificationStep {
            graph: 1,
            writes: Vec::new(),
            digests: vec![digest("staging.logits", logits)],
        },
    ];
    ValidCore::new(core).unwrap()
}

fn device(core: &ValidCore) -> FakeDevice {
    FakeDevice::new(core, vec![copy_slots, bump_logits])
}

#[test]
fn matching_digests_pass() {
    let core = qualified_core();
    let mut device = device(&core);
    let report = qualify(&core, &mut device).unwrap();
    assert!(report.passed(), "{report:?}");
    assert_eq!((report.total_steps, report.matched_steps), (2, 2));
    let first = &report.steps[0];
    assert_eq!((first.kind, first.capacity), ("GRAPH_KIND_DECODE", 1));
    assert_eq!((first.writes, first.digests), (1, 1));
    assert!(first.ok && first.mismatched.is_empty());
    assert_eq!(report.steps[1].capacity, 2);
    assert!(report.allocation_free);
}

#[test]
fn each_step_writes_launches_synchronizes_then_reads() {
    let core = qualified_core();
    let mut device = device(&core);
    qualify(&core, &mut device).unwrap();
    let base = core.window().base;
    let slots = core.buffer_named("staging.decode_slots").unwrap();
    let records = core.buffer(Semantic::Completions).unwrap();
    let logits = core.buffer(Semantic::Logits).unwrap();
    assert_eq!(
        device.calls,
        vec![
            Call::Write(base + slots.offset + 4, 4),
            Call::Launch(0),
            Call::Synchronize,
            Call::Read(base + records.offset, records.size_bytes as usize),
            Call::Launch(1),
            Call::Synchronize,
            Call::Read(base + logits.offset, logits.size_bytes as usize),
        ]
    );
}

#[test]
fn a_differing_digest_names_its_buffer() {
    let core = qualified_core();
    let mut device = device(&core);
    device.effects[1] = copy_slots; // the second graph no longer bumps the logits
    let report = qualify(&core, &mut device).unwrap();
    assert!(!report.passed());
    assert_eq!((report.total_steps, report.matched_steps), (2, 1));
    assert!(report.steps[0].ok);
    assert!(!report.steps[1].ok);
    assert_eq!(report.steps[1].mismatched, vec!["staging.logits"]);
}

#[test]
fn changed_free_memory_is_reported() {
    let core = qualified_core();
    let mut device = device(&core);
    device.free = vec![1000, 900];
    let report = qualify(&core, &mut device).unwrap();
    assert!(report.passed());
    assert_eq!((report.free_before, report.free_after), (1000, 900));
    assert!(!report.allocation_free);
}

#[test]
fn a_core_without_qualification_cannot_be_checked() {
    let mut core = tiny_core();
    core.qualification = None;
    let core = ValidCore::new(core).unwrap();
    let mut device = device(&core);
    assert!(matches!(
        qualify(&core, &mut device),
        Err(ReplayError::NoQualification)
    ));
}

#[test]
fn device_errors_end_the_check() {
    let core = qualified_core();
    let mut device = device(&core);
    device.fail_launch = true;
    assert!(matches!(
        qualify(&core, &mut device),
        Err(ReplayError::Cuda(CudaError::Driver {
            call: "cuGraphLaunch",
            ..
        }))
    ));
}

fn steps(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

#[test]
fn the_bench_replays_the_decode_graph_and_copies_the_records() {
    let core = qualified_core();
    let mut device = device(&core);
    let bench = bench_decode(&core, &mut device, 4, steps(5)).unwrap();
    let graph = (core.graphs().iter())
        .position(|g| g.kind == 1 && g.capacity == 4)
        .unwrap();
    assert_eq!((bench.capacity, bench.graph, bench.steps), (4, graph, 5));
    let records = core.buffer(Semantic::Completions).unwrap();
    let read = Call::Read(
        core.window().base + records.offset,
        records.size_bytes as usize,
    );
    let mut expected = Vec::new();
    for _ in 0..5 {
        expected.extend([Call::Launch(graph), Call::Synchronize, read.clone()]);
    }
    expected.push(Call::BackToBack(graph, 5));
    let position = |kind: GraphKind| {
        (core.graphs().iter())
            .position(|g| g.kind == kind as i32)
            .unwrap()
    };
    let (snapshot, restore) = (position(GraphKind::Snapshot), position(GraphKind::Restore));
    expected.extend([Call::BackToBack(snapshot, 5), Call::BackToBack(restore, 5)]);
    assert_eq!(
        device.calls, expected,
        "no writes, one launch, wait and read per step, then the checkpoint graphs timed"
    );
    assert_eq!(bench.device_ms_per_replay, 0.25);
    let checkpoint = bench.checkpoint.expect("the sample core has snapshot rows");
    let rows = u64::from(core.contract().snapshot_rows);
    let row_bytes: u64 = (core.buffers().iter())
        .filter(|b| b.role == BufferRole::SnapshotRows as i32)
        .map(|b| b.size_bytes / rows)
        .sum();
    assert!(row_bytes > 0);
    assert_eq!(checkpoint.row_bytes, row_bytes);
    assert_eq!(
        (checkpoint.snapshot_ms, checkpoint.restore_ms),
        (0.25, 0.25)
    );
    assert_eq!(checkpoint.launches, 5);
    assert!(bench.step.median_ms >= 0.0);
    assert!(bench.submission_gap.is_some());
    assert!(bench.allocation_free);
}

#[test]
fn one_step_has_no_submission_gap() {
    let core = qualified_core();
    let mut device = device(&core);
    let bench = bench_decode(&core, &mut device, 1, steps(1)).unwrap();
    assert!(bench.submission_gap.is_none());
    assert_eq!(device.launches(), vec![0]);
}

#[test]
fn the_bench_needs_a_decode_graph_of_that_capacity() {
    let core = qualified_core();
    let mut device = device(&core);
    assert!(matches!(
        bench_decode(&core, &mut device, 3, steps(4)),
        Err(ReplayError::NoDecodeGraph { capacity: 3, ref available }) if *available == [1, 2, 4]
    ));
    assert!(device.calls.is_empty());
}

// ------------------------------------------------ ranks replayed in lockstep

/// What every rank of a group on one device shares: each rank's launched
/// steps not yet synchronized. A rank's graph meets its peers' in a
/// collective, so it completes only once every rank launched the same step;
/// a synchronous host copy waits for every stream of the shared context.
/// Either wait that could never end fails the fake instead of hanging.
#[derive(Default)]
struct SharedContext {
    /// Per rank, how many launches it queued, and how many of them ended.
    launched: Vec<usize>,
    synchronized: Vec<usize>,
    /// Every rank's calls, in the order they were made.
    log: Vec<(usize, Call)>,
}

struct RankDevice {
    rank: usize,
    inner: FakeDevice,
    shared: std::rc::Rc<std::cell::RefCell<SharedContext>>,
}

impl RankDevice {
    fn hang(what: &str) -> ReplayError {
        CudaError::InvalidNode {
            reason: format!("{what} would wait forever"),
        }
        .into()
    }

    /// A synchronous copy waits for every rank's queued graphs; those can end
    /// only if every rank launched as many steps.
    fn copy_waits(&self) -> Result<(), ReplayError> {
        let shared = self.shared.borrow();
        let pending = (shared.launched.iter().zip(&shared.synchronized)).any(|(l, s)| l > s);
        let most = shared.launched.iter().max().copied().unwrap_or(0);
        let behind = shared.launched.iter().any(|&l| l < most);
        if pending && behind {
            return Err(Self::hang("a host copy behind a collective"));
        }
        Ok(())
    }
}

impl RankDevice {
    /// A host copy: it waits (or fails where it would never end), then is
    /// logged.
    fn copy(&mut self, call: Call) -> Result<(), ReplayError> {
        self.copy_waits()?;
        self.shared.borrow_mut().log.push((self.rank, call));
        Ok(())
    }
}

impl ReplayDevice for RankDevice {
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), ReplayError> {
        self.copy(Call::Write(addr, data.len()))?;
        self.inner.write(addr, data)
    }

    fn launch(&mut self, graph: usize) -> Result<(), ReplayError> {
        let mut shared = self.shared.borrow_mut();
        shared.launched[self.rank] += 1;
        shared.log.push((self.rank, Call::Launch(graph)));
        drop(shared);
        self.inner.launch(graph)
    }

    fn synchronize(&mut self) -> Result<(), ReplayError> {
        let mut shared = self.shared.borrow_mut();
        let mine = shared.launched[self.rank];
        if shared.launched.iter().any(|&l| l < mine) {
            return Err(Self::hang("a collective whose peer has not launched"));
        }
        shared.synchronized[self.rank] = mine;
        shared.log.push((self.rank, Call::Synchronize));
        drop(shared);
        self.inner.synchronize()
    }

    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), ReplayError> {
        self.copy(Call::Read(addr, out.len()))?;
        self.inner.read(addr, out)
    }

    fn free_memory(&mut self) -> Result<u64, ReplayError> {
        self.inner.free_memory()
    }

    fn time_back_to_back(&mut self, graph: usize, launches: u32) -> Result<f64, ReplayError> {
        self.inner.time_back_to_back(graph, launches)
    }
}

#[test]
fn ranks_sharing_a_device_replay_in_lockstep_without_waiting_on_a_peer() {
    use helios::replay::qualify_ranks;
    // Two ranks of the qualified core (the peer at its own window), both on
    // one device: every rank's writes, then every launch, then every
    // synchronize, then the reads. Writing rank 1's slots while rank 0's
    // first graph waits for rank 1's launch would never return.
    let zero = qualified_core();
    let core = helios::core::sample::with_ranks(zero.clone().into_core(), 2);
    let core = ValidCore::new(core).unwrap();
    let shared = std::rc::Rc::new(std::cell::RefCell::new(SharedContext {
        launched: vec![0; 2],
        synchronized: vec![0; 2],
        log: Vec::new(),
    }));
    let ranks = core.ranks();
    let mut devices: Vec<RankDevice> = (0..2)
        .map(|rank| {
            // The peer's buffers lie at the same offsets in its own window.
            let mut inner = device(&zero);
            inner.core = ValidCore::new({
                let mut one = zero.clone().into_core();
                one.window.as_mut().unwrap().base = ranks[rank].window().base;
                one
            })
            .unwrap();
            RankDevice {
                rank,
                inner,
                shared: shared.clone(),
            }
        })
        .collect();
    let reports = qualify_ranks(&ranks, &mut devices).unwrap();
    assert_eq!(reports.len(), 2);
    for (rank, report) in reports.iter().enumerate() {
        assert_eq!(report.rank, rank as u32);
        assert!(report.passed(), "rank {rank}: {report:?}");
    }
    // Per step: writes, launches, synchronizes, reads, never interleaved.
    let kinds: Vec<(usize, &str)> = (shared.borrow().log.iter())
        .map(|(rank, call)| {
            let kind = match call {
                Call::Write(..) => "write",
                Call::Launch(_) => "launch",
                Call::Synchronize => "sync",
                Call::Read(..) => "read",
                Call::BackToBack(..) => "bench",
            };
            (*rank, kind)
        })
        .collect();
    // The first step writes the slots; the second writes nothing.
    let step = [
        (0, "launch"),
        (1, "launch"),
        (0, "sync"),
        (1, "sync"),
        (0, "read"),
        (1, "read"),
    ];
    assert_eq!(
        kinds,
        [&[(0, "write"), (1, "write")][..], &step, &step].concat()
    );
}
