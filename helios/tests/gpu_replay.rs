//! The CUDA driver layer and the loader on a real GPU. Every test needs one
//! (`cargo test -p flare-helios --test gpu_replay -- --ignored`); each uses
//! its own window base, so they may run in parallel in one process.

mod support;

use std::num::NonZeroU32;
use std::rc::Rc;
use std::time::Duration;

use helios::core::proto::{
    node::Op, BufferDigest, BufferWrite, Core, Dim3, Edge, EmptyNode, Graph as GraphDesc,
    GraphKind, KernelNode, MemcpyNode, MemsetNode, Node, QualificationStep, RankBundle, RankLayout,
    Region, RegionKind,
};
use helios::core::sample::{tiny_core, SAMPLE_BASE};
use helios::core::ValidCore;
use helios::cuda::{Context, CudaError, Event, Graph, Modules, Span, Stream, Window};
use helios::replay::{sha256_hex, KvBacking, LoadOptions, LoadedCore, ReplayError};
use safetensors::Dtype;
use support::{fresh_dir, give_initial, use_image, write_core, Tensor};

const MIB: u64 = 1 << 20;

/// `add_one(u32 *data, u64 n)`: `data[i] += 1` for `i < n`, one thread per
/// element. PTX, so the driver compiles it for whatever GPU runs the test.
const ADD_ONE_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry add_one(
    .param .u64 add_one_param_0,
    .param .u64 add_one_param_1
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<5>;
    .reg .b64 %rd<7>;

    ld.param.u64 %rd1, [add_one_param_0];
    ld.param.u64 %rd2, [add_one_param_1];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mad.lo.s32 %r4, %r1, %r2, %r3;
    cvt.u64.u32 %rd3, %r4;
    setp.ge.u64 %p1, %rd3, %rd2;
    @%p1 bra $L__done;
    cvta.to.global.u64 %rd4, %rd1;
    shl.b64 %rd5, %rd3, 2;
    add.s64 %rd6, %rd4, %rd5;
    ld.global.u32 %r1, [%rd6];
    add.s32 %r1, %r1, 1;
    st.global.u32 [%rd6], %r1;
$L__done:
    ret;
}
"#;

/// A window base of its own for each test (2 MiB aligned, 64 GiB apart).
fn base(test: u64) -> u64 {
    SAMPLE_BASE + (test + 1) * (64 << 30)
}

fn context() -> Rc<Context> {
    Context::new(0).expect("a CUDA device")
}

fn dim(x: u32) -> Option<Dim3> {
    Some(Dim3 { x, y: 1, z: 1 })
}

fn node(op: Op) -> Node {
    Node { op: Some(op) }
}

/// `add_one` over `n` u32 at `addr`, its parameters passed as
/// `kernelParams` or as one `extra` block.
fn add_one(sha256: &str, addr: u64, n: u64, from_extra: bool) -> Node {
    let mut params = addr.to_le_bytes().to_vec();
    params.extend_from_slice(&n.to_le_bytes());
    node(Op::Kernel(KernelNode {
        image_sha256: sha256.to_owned(),
        function: "add_one".to_owned(),
        grid: dim(1),
        block: dim(128),
        params,
        param_offsets: vec![0, 8],
        param_sizes: vec![8, 8],
        params_from_extra: from_extra,
        ..KernelNode::default()
    }))
}

fn edge(from: u32, to: u32) -> Edge {
    Edge {
        from,
        to,
        ..Edge::default()
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn le(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_window_maps_at_its_base_zeroed_and_round_trips_bytes() {
    let ctx = context();
    let base = base(0);
    let mut window = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    assert_eq!(window.base(), base);
    let g = window.granularity();
    window.map(Span { offset: g, len: g }).unwrap();
    let mut bytes = vec![0xffu8; 4096];
    window.read(base + g, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "mapped memory starts zeroed");
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    window.write(base + g + 100, &pattern).unwrap();
    window.read(base + g + 100, &mut bytes).unwrap();
    assert_eq!(bytes, pattern);
    assert!(matches!(
        window.write(base, &pattern),
        Err(CudaError::Unmapped { .. })
    ));
    assert!(matches!(
        window.map(Span { offset: g, len: g }),
        Err(CudaError::InvalidSpan { .. })
    ));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_taken_base_is_unavailable_until_released() {
    let ctx = context();
    let base = base(1);
    let first = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    match Window::reserve(&ctx, base, 32 * MIB) {
        Err(CudaError::WindowUnavailable { base: wanted, got }) => {
            assert_eq!(wanted, base);
            assert_ne!(got, base);
        }
        other => panic!("expected WindowUnavailable, got {other:?}"),
    }
    drop(first);
    let again = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    assert_eq!(again.base(), base);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn memset_and_memcpy_nodes_replay_in_edge_order() {
    let ctx = context();
    let base = base(2);
    let mut window = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    window
        .map(Span {
            offset: 0,
            len: window.granularity(),
        })
        .unwrap();
    let description = GraphDesc {
        kind: GraphKind::Decode as i32,
        capacity: 1,
        nodes: vec![
            node(Op::Memset(MemsetNode {
                dst: base,
                pitch: 0,
                value: 0xab,
                element_size: 1,
                width: 4096,
                height: 1,
            })),
            node(Op::Memcpy(MemcpyNode {
                dst: base + 4096,
                src: base,
                size_bytes: 4096,
            })),
            // Two rows of 16 u32 with a 128-byte pitch.
            node(Op::Memset(MemsetNode {
                dst: base + 8192,
                pitch: 128,
                value: 0x0102_0304,
                element_size: 4,
                width: 16,
                height: 2,
            })),
            node(Op::Empty(EmptyNode {})),
        ],
        edges: vec![edge(0, 1), edge(1, 3), edge(2, 3)],
    };
    let graph = Graph::build(&ctx, &description, &Modules::new(), &window).unwrap();
    assert_eq!(graph.node_count(), 4);
    let exec = graph.instantiate().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    exec.upload(&stream).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();

    let mut copied = vec![0u8; 4096];
    window.read(base + 4096, &mut copied).unwrap();
    assert!(copied.iter().all(|&b| b == 0xab));
    let mut rows = vec![0u8; 256];
    window.read(base + 8192, &mut rows).unwrap();
    let rows = words(&rows);
    assert!(rows[..16].iter().all(|&w| w == 0x0102_0304));
    assert!(rows[16..32].iter().all(|&w| w == 0), "the pitch gap stays");
    assert!(rows[32..48].iter().all(|&w| w == 0x0102_0304));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nodes_outside_mapped_memory_are_refused_before_the_driver() {
    let ctx = context();
    let base = base(3);
    let window = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    let description = GraphDesc {
        kind: GraphKind::Decode as i32,
        capacity: 1,
        nodes: vec![node(Op::Memcpy(MemcpyNode {
            dst: base,
            src: base + 64,
            size_bytes: 64,
        }))],
        edges: Vec::new(),
    };
    let err = Graph::build(&ctx, &description, &Modules::new(), &window).unwrap_err();
    assert!(matches!(err, CudaError::AtNode { node: 0, .. }), "{err:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_nodes_replay_with_kernel_params_extra_and_programmatic_edges() {
    let ctx = context();
    let base = base(4);
    let mut window = Window::reserve(&ctx, base, 32 * MIB).unwrap();
    window
        .map(Span {
            offset: 0,
            len: window.granularity(),
        })
        .unwrap();
    let sha = sha256_hex(ADD_ONE_PTX.as_bytes());
    let mut modules = Modules::new();
    modules.load(&ctx, &sha, ADD_ONE_PTX.as_bytes()).unwrap();
    let (x, y) = (base, base + 4096);
    window.write(x, &le(&[1, 2, 3, 4, 5])).unwrap();
    window.write(y, &le(&[10, 20, 30])).unwrap();
    let description = GraphDesc {
        kind: GraphKind::Decode as i32,
        capacity: 1,
        nodes: vec![add_one(&sha, x, 5, false), add_one(&sha, y, 3, true)],
        // A programmatic edge (type 1) from the programmatic port (1): the
        // two kernels touch different memory, so the result is fixed.
        edges: vec![Edge {
            from: 0,
            to: 1,
            from_port: 1,
            to_port: 0,
            r#type: 1,
        }],
    };
    let graph = Graph::build(&ctx, &description, &modules, &window).unwrap();
    let exec = graph.instantiate().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (start, end) = (Event::new(&ctx).unwrap(), Event::new(&ctx).unwrap());
    start.record(&stream).unwrap();
    for _ in 0..2 {
        exec.launch(&stream).unwrap();
    }
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    let mut out = vec![0u8; 24];
    window.read(x, &mut out).unwrap();
    assert_eq!(words(&out), [3, 4, 5, 6, 7, 0]);
    window.read(y, &mut out[..16]).unwrap();
    assert_eq!(words(&out[..16]), [12, 22, 32, 0]);
}

/// The one report of a one-rank core's check.
fn only_rank(
    reports: Result<Vec<helios::replay::QualificationReport>, ReplayError>,
) -> helios::replay::QualificationReport {
    let mut reports = reports.unwrap();
    assert_eq!(reports.len(), 1, "one rank, one report");
    reports.remove(0)
}

/// The sample core at `base`, made runnable: decode@1 adds one to the
/// decode slots (a PTX kernel) and copies them into the completion records;
/// `state.stop_tokens` has initial contents (the tensor `stop`, counting
/// from `seed`); two qualification steps, the first writing `first` into
/// the slots, with digests computed here.
fn runnable(base: u64, first: [u32; 2], seed: u8) -> (Core, Tensor) {
    let mut core = tiny_core();
    core.window.as_mut().unwrap().base = base;
    let sha = use_image(&mut core, ADD_ONE_PTX.as_bytes());
    give_initial(&mut core, "state.stop_tokens", "stop");
    let stop = Tensor::counting("stop", Dtype::I32, &[4, 4], seed);

    let valid = ValidCore::new(core.clone()).unwrap();
    let at = |name: &str| base + valid.buffer_named(name).unwrap().offset;
    let (slots, records) = (at("staging.decode_slots"), at("staging.completions"));
    core.graphs[0].nodes = vec![
        node(Op::Empty(EmptyNode {})),
        add_one(&sha, slots, 4, false),
        node(Op::Memcpy(MemcpyNode {
            dst: records,
            src: slots,
            size_bytes: 16,
        })),
    ];
    core.graphs[0].edges = vec![edge(0, 1), edge(1, 2)];

    let digest = |buffer: &str, bytes: &[u8]| BufferDigest {
        buffer: buffer.to_owned(),
        sha256: sha256_hex(bytes),
    };
    let records_after = |slots: &[u32]| {
        let mut bytes = le(slots);
        bytes.resize(48, 0);
        bytes
    };
    let [a, b] = first;
    core.qualification.as_mut().unwrap().steps = vec![
        QualificationStep {
            graph: 0,
            writes: vec![BufferWrite {
                buffer: "staging.decode_slots".to_owned(),
                offset: 0,
                data: le(&first),
            }],
            digests: vec![
                digest("staging.decode_slots", &le(&[a + 1, b + 1, 1, 1])),
                digest("staging.completions", &records_after(&[a + 1, b + 1, 1, 1])),
                digest("state.stop_tokens", &stop.data),
            ],
        },
        QualificationStep {
            graph: 0,
            writes: Vec::new(),
            digests: vec![digest("staging.decode_slots", &le(&[a + 2, b + 2, 2, 2]))],
        },
    ];
    (core, stop)
}

/// [`runnable`] at `base` with `change` applied, written; returns the
/// directory.
fn runnable_core(name: &str, base: u64, change: impl FnOnce(&mut Core)) -> std::path::PathBuf {
    let (mut core, stop) = runnable(base, [1, 2], 3);
    change(&mut core);
    let dir = fresh_dir(&format!("gpu-replay-{name}"));
    write_core(&dir, &core, &[stop], &[ADD_ONE_PTX.as_bytes()]);
    dir
}

/// Where the two-rank core's collectives region lies in each window, and its
/// wait limit's word in it.
const COLLECTIVES_AT: u64 = 32 * MIB;
const WAIT_LIMIT_AT: u64 = 528;
/// The collectives region's size: Ignition's least (`COLLECTIVES_MINIMUM`),
/// so each window is a whole number of 32 MiB. The driver honours a
/// reservation's requested address at that granularity only: on the H100
/// a 34 MiB window left rank 1's base, 34 MiB further, taken (the driver
/// placed rank 1 at 64 MiB).
const COLLECTIVES_SIZE: u64 = 32 * MIB;

/// [`runnable`] with a collectives region after the sample's regions.
fn ranked_runnable(base: u64, first: [u32; 2], seed: u8) -> (Core, Tensor) {
    let (mut core, stop) = runnable(base, first, seed);
    let window = core.window.as_mut().unwrap();
    window.size = COLLECTIVES_AT + COLLECTIVES_SIZE;
    window.regions.push(Region {
        kind: RegionKind::Collectives as i32,
        offset: COLLECTIVES_AT,
        size: COLLECTIVES_SIZE,
        backed_bytes: COLLECTIVES_SIZE,
    });
    (core, stop)
}

/// Two ranks of [`runnable`] side by side from `base`, with their own slot
/// values and initial contents (rank 1's stored as `rank1/stop`, as
/// Ignition's merge names a peer's) and a collectives region each, whose
/// wait limit the layout names; `change` applied to the group's manifest;
/// returns the directory.
fn two_rank_core(name: &str, base: u64, change: impl FnOnce(&mut Core)) -> std::path::PathBuf {
    let (mut zero, stop) = ranked_runnable(base, [1, 2], 3);
    let size = zero.window.as_ref().unwrap().size;
    let (mut one, mut peer_stop) = ranked_runnable(base + size, [40, 50], 9);
    peer_stop.name = "rank1/stop".to_owned();
    for buffer in &mut one.buffers {
        if buffer.initial_tensor == "stop" {
            buffer.initial_tensor = peer_stop.name.clone();
        }
    }
    zero.rank_layout = Some(RankLayout {
        world_size: 2,
        peers: vec![RankBundle {
            rank: 1,
            window: one.window,
            buffers: one.buffers,
            graphs: one.graphs,
            qualification: one.qualification,
        }],
        collectives_wait_limit_offset: Some(WAIT_LIMIT_AT),
    });
    change(&mut zero);
    let dir = fresh_dir(&format!("gpu-replay-{name}"));
    write_core(&dir, &zero, &[stop, peer_stop], &[ADD_ONE_PTX.as_bytes()]);
    dir
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_two_rank_core_loads_both_windows_and_checks_each_rank_in_lockstep() {
    // Both ranks on this device (what one GPU allows): two windows in one
    // process, each rank's initial contents and graphs its own.
    let on_one = LoadOptions {
        rank_devices: vec![0, 0],
        collectives_wait_limit: Some(Duration::from_nanos(123_456_789)),
        ..LoadOptions::default()
    };
    let dir = two_rank_core("two-ranks", base(11), |_| {});
    let mut loaded = LoadedCore::load(&dir, &on_one).unwrap();
    let reports = loaded.reports().to_vec();
    assert_eq!(reports.len(), 2);
    assert_eq!((reports[0].rank, reports[1].rank), (0, 1));
    assert_eq!(
        reports[1].window_base,
        reports[0].window_base + reports[0].window_reserved
    );
    // Each rank's collectives region is mapped, zeroed, its wait limit written.
    for window in loaded.windows() {
        let region = window.base() + COLLECTIVES_AT;
        let mut words = vec![0xFFu8; 1024];
        window.read(region, &mut words).unwrap();
        let limit = WAIT_LIMIT_AT as usize;
        assert_eq!(words[limit..limit + 8], 123_456_789u64.to_le_bytes());
        assert!(words[..limit]
            .iter()
            .chain(&words[limit + 8..])
            .all(|&b| b == 0));
    }
    let checks = loaded.check().unwrap();
    assert_eq!(checks.len(), 2);
    for check in &checks {
        assert!(check.passed(), "{check:?}");
        assert_eq!(check.total_steps, 2);
    }
    // One rank alone would wait for its peers' collectives forever.
    let err = loaded
        .bench_decode(1, NonZeroU32::new(4).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, ReplayError::OneRankOnly { world_size: 2, .. }),
        "{err:?}"
    );
    drop(loaded);

    // A peer's own digest differing is reported on that rank alone.
    let dir = two_rank_core("two-ranks-mismatch", base(13), |core| {
        let peer = &mut core.rank_layout.as_mut().unwrap().peers[0];
        peer.qualification.as_mut().unwrap().steps[1].digests[0].sha256 =
            sha256_hex(b"something else");
    });
    let checks = LoadedCore::load(&dir, &on_one).unwrap().check().unwrap();
    assert!(checks[0].passed(), "{:?}", checks[0]);
    assert!(!checks[1].passed());
    assert_eq!(checks[1].steps[1].mismatched, vec!["staging.decode_slots"]);

    // Devices for a group name one per rank.
    let err = LoadedCore::load(
        &dir,
        &LoadOptions {
            rank_devices: vec![0],
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::RankDevices {
                given: 1,
                world_size: 2
            }
        ),
        "{err:?}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_core_loads_checks_bitwise_and_benches() {
    let dir = runnable_core("check", base(5), |_| {});
    let mut loaded = LoadedCore::load(&dir, &LoadOptions::default()).unwrap();
    let load = loaded.report().clone();
    assert_eq!(load.window_base, base(5));
    assert_eq!((load.images, load.initial_tensors), (1, 1));
    assert_eq!(load.graphs, 9);
    assert!(load.backed_bytes >= 32 * MIB);
    let report = only_rank(loaded.check());
    assert!(report.passed(), "{report:?}");
    assert_eq!(report.total_steps, 2);
    // Free memory is not compared: tests in this binary map windows in
    // parallel on the same device.
    let bench = loaded
        .bench_decode(1, NonZeroU32::new(16).unwrap())
        .unwrap();
    assert_eq!(bench.steps, 16);
    assert!(bench.step.median_ms > 0.0);
    assert!(bench.submission_gap.is_some());
    assert!(bench.device_ms_per_replay > 0.0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn kv_pages_sized_from_free_memory_are_mapped_after_the_graphs() {
    // A context limit of 64 tokens: one request needs 5 of the 8 pages.
    let dir = runnable_core("kv-free", base(9), |core| {
        core.contract.as_mut().unwrap().context_limit = 64;
    });
    let free = |reserve_bytes| LoadOptions {
        kv: KvBacking::FromFreeMemory { reserve_bytes },
        ..LoadOptions::default()
    };
    let mut loaded = LoadedCore::load(&dir, &free(0)).unwrap();
    let load = loaded.report().clone();
    assert_eq!((loaded.kv_pages(), load.kv_pages_prepared), (8, 8));
    assert_eq!(load.kv_tokens, 7 * 16);
    assert_eq!(load.kv_reserve_bytes, Some(0));
    assert!(only_rank(loaded.check()).passed());
    drop(loaded);

    let total = load.device.total_memory;
    let err = LoadedCore::load(&dir, &free(total)).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::InsufficientKvPages {
                needed: 5,
                backable: 0,
                budget: 0,
                ..
            }
        ),
        "{err:?}"
    );
    // The failed load released its window: the prepared extent loads.
    let mut prepared = LoadedCore::load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(prepared.report().kv_reserve_bytes, None);
    assert!(only_rank(prepared.check()).passed());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_differing_digest_is_reported_not_raised() {
    let dir = runnable_core("mismatch", base(6), |core| {
        let steps = &mut core.qualification.as_mut().unwrap().steps;
        steps[1].digests[0].sha256 = sha256_hex(b"something else");
    });
    let mut loaded = LoadedCore::load(&dir, &LoadOptions::default()).unwrap();
    let report = only_rank(loaded.check());
    assert!(!report.passed());
    assert!(report.steps[0].ok);
    assert_eq!(report.steps[1].mismatched, vec!["staging.decode_slots"]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_core_loads_again_once_the_first_is_dropped_and_not_while_it_lives() {
    let dir = runnable_core("twice", base(7), |_| {});
    let first = LoadedCore::load(&dir, &LoadOptions::default()).unwrap();
    let err = LoadedCore::load(&dir, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(err, ReplayError::Cuda(CudaError::WindowUnavailable { .. })),
        "{err:?}"
    );
    drop(first);
    let mut again = LoadedCore::load(&dir, &LoadOptions::default()).unwrap();
    assert!(only_rank(again.check()).passed());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_core_for_another_compute_capability_is_refused() {
    let dir = runnable_core("other-device", base(8), |core| {
        let identity = core.identity.as_mut().unwrap();
        identity.compute_capability_major = 1;
        identity.compute_capability_minor = 0;
    });
    let err = LoadedCore::load(&dir, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ReplayError::DeviceMismatch {
                expected: (1, 0),
                ..
            }
        ),
        "{err:?}"
    );
}
