//! A small, valid manifest built in Rust, for tests and examples.
//!
//! It describes no real model: its graphs hold placeholder nodes and its
//! buffers are laid out in a synthetic 32 MiB window. Tests of Helios and of
//! the `flare` CLI start from it and change one thing at a time.
//!
//! Compiled only with the `test-support` feature (and in Helios's own unit
//! tests): no default build of the library carries it.

use super::proto::{
    node::Op, Binding, Buffer, BufferDigest, BufferRole, BufferWrite, ContinuationState, Core,
    DType, Dim3, Edge, EmptyNode, FloatRange, Frontend, Graph, GraphKind, Identity, KernelImage,
    KernelNode, NamedToken, Node, PreparedContract, Qualification, QualificationStep, RankBundle,
    RankLayout, ReasoningParser, Region, RegionKind, SamplingDefaults, Semantic, ToolParser,
    Window,
};
use super::{all_semantics, ENGINE_ABI};

const MIB: u64 = 1 << 20;

/// Window base of the sample core (2 MiB aligned).
pub const SAMPLE_BASE: u64 = 0x2000_0000_0000;
/// Window size of the sample core: the smallest allowed.
pub const SAMPLE_WINDOW: u64 = 32 * MIB;
/// Digest of the sample core's only kernel image.
pub const SAMPLE_IMAGE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// The buffer the sample core's qualification step writes and checks.
pub const SAMPLE_QUALIFIED: &str = "staging.decode_slots";
/// Decode capacities of the sample core.
pub const SAMPLE_DECODE: [u32; 3] = [1, 2, 4];
/// Prefill capacities of the sample core.
pub const SAMPLE_PREFILL: [u32; 2] = [128, 256];

const PAGE_SIZE: u32 = 16;
const CONTEXT_LIMIT: u32 = 512;
const KV_PAGES: u32 = 8;
const VOCAB: u32 = 256;
const HIDDEN: u64 = 64;

/// (region kind, offset, size) of the sample window, in MiB.
const REGIONS: [(RegionKind, u64, u64); 7] = [
    (RegionKind::Weights, 0, 4),
    (RegionKind::RequestState, 4, 4),
    (RegionKind::KvPages, 8, 8),
    (RegionKind::SnapshotRows, 16, 2),
    (RegionKind::Staging, 18, 2),
    (RegionKind::Scratch, 20, 4),
    (RegionKind::GraphPool, 24, 8),
];

fn itemsize(dtype: DType) -> u64 {
    match dtype {
        DType::DtypeUnspecified | DType::DtypeU8 => 1,
        DType::DtypeBf16 | DType::DtypeF16 => 2,
        DType::DtypeF32 | DType::DtypeI32 => 4,
        DType::DtypeI64 => 8,
    }
}

/// Lays contiguous buffers out one after another inside their role's region.
struct Layout {
    buffers: Vec<Buffer>,
    cursors: Vec<(RegionKind, u64)>,
}

impl Layout {
    fn new() -> Self {
        let cursors = REGIONS
            .iter()
            .map(|&(kind, offset, _)| (kind, offset * MIB))
            .collect();
        Self {
            buffers: Vec::new(),
            cursors,
        }
    }

    fn add(&mut self, name: &str, role: BufferRole, dtype: DType, shape: &[u64]) {
        let region = match role {
            BufferRole::Weight => RegionKind::Weights,
            BufferRole::RequestState => RegionKind::RequestState,
            BufferRole::KvPages => RegionKind::KvPages,
            BufferRole::SnapshotRows => RegionKind::SnapshotRows,
            _ => RegionKind::Staging,
        };
        let mut strides = vec![1u64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        let size_bytes = shape.iter().product::<u64>() * itemsize(dtype);
        let cursor = self
            .cursors
            .iter_mut()
            .find(|(kind, _)| *kind == region)
            .map(|(_, cursor)| cursor)
            .expect("every role has a region");
        let offset = *cursor;
        *cursor += size_bytes.div_ceil(256) * 256;
        self.buffers.push(Buffer {
            name: name.to_owned(),
            role: role as i32,
            offset,
            size_bytes,
            dtype: dtype as i32,
            shape: shape.to_vec(),
            strides,
            initial_tensor: String::new(),
        });
    }
}

/// Buffer name, role, dtype and shape carrying one semantic value.
fn semantic_buffer(semantic: Semantic) -> (String, BufferRole, DType, Vec<u64>) {
    let rows = u64::from(SAMPLE_DECODE[SAMPLE_DECODE.len() - 1]);
    let chunk = u64::from(SAMPLE_PREFILL[SAMPLE_PREFILL.len() - 1]);
    let field = semantic
        .as_str_name()
        .trim_start_matches("SEMANTIC_")
        .to_ascii_lowercase();
    let staging = format!("staging.{field}");
    let (role, dtype, shape) = match semantic {
        Semantic::PageTable => {
            let pages = u64::from(CONTEXT_LIMIT / PAGE_SIZE);
            let name = format!("state.{field}");
            return (
                name,
                BufferRole::RequestState,
                DType::DtypeI32,
                vec![rows, pages],
            );
        }
        Semantic::StopTokens => {
            let name = format!("state.{field}");
            return (
                name,
                BufferRole::RequestState,
                DType::DtypeI32,
                vec![rows, 4],
            );
        }
        Semantic::Logits => (
            BufferRole::Output,
            DType::DtypeF32,
            vec![rows, u64::from(VOCAB)],
        ),
        Semantic::Completions => (BufferRole::Output, DType::DtypeI32, vec![rows, 3]),
        Semantic::SampleMask => (
            BufferRole::StagingInput,
            DType::DtypeI32,
            vec![rows, u64::from(VOCAB.div_ceil(32))],
        ),
        Semantic::MaintStatus => (BufferRole::Output, DType::DtypeI32, vec![1]),
        Semantic::ChunkTokens | Semantic::AdmitTokens => {
            (BufferRole::StagingInput, DType::DtypeI32, vec![chunk])
        }
        Semantic::AdmitFloat => (BufferRole::StagingInput, DType::DtypeF32, vec![8]),
        Semantic::AdmitSeed => (BufferRole::StagingInput, DType::DtypeI64, vec![1]),
        _ => (BufferRole::StagingInput, DType::DtypeI32, vec![rows]),
    };
    (staging, role, dtype, shape)
}

fn graph(kind: GraphKind, capacity: u32) -> Graph {
    Graph {
        kind: kind as i32,
        capacity,
        nodes: vec![Node {
            op: Some(Op::Empty(EmptyNode {})),
        }],
        edges: Vec::new(),
    }
}

fn dim3(x: u32, y: u32, z: u32) -> Option<Dim3> {
    Some(Dim3 { x, y, z })
}

/// A small valid core: a 32 MiB window with all seven regions, weights, KV
/// pages, snapshot rows and one buffer per semantic value (all 23 bound,
/// the optional token masks included),
/// one kernel image, decode graphs at [`SAMPLE_DECODE`], prefill graphs at
/// [`SAMPLE_PREFILL`], and resume, admit, snapshot and restore graphs at
/// capacity 1. The decode graph at capacity 1 launches a kernel from the
/// image; every other node is empty.
pub fn tiny_core() -> Core {
    let mut layout = Layout::new();
    let weight = [u64::from(VOCAB), HIDDEN];
    layout.add(
        "weight.embed",
        BufferRole::Weight,
        DType::DtypeBf16,
        &weight,
    );
    layout.add(
        "weight.lm_head",
        BufferRole::Weight,
        DType::DtypeBf16,
        &weight,
    );
    let kv = [u64::from(KV_PAGES), 2, u64::from(PAGE_SIZE), HIDDEN];
    layout.add("kv.pages", BufferRole::KvPages, DType::DtypeBf16, &kv);
    layout.add(
        "snapshot.kv",
        BufferRole::SnapshotRows,
        DType::DtypeBf16,
        &[2, HIDDEN],
    );
    let mut bindings = Vec::new();
    for semantic in all_semantics() {
        let (name, role, dtype, shape) = semantic_buffer(semantic);
        layout.add(&name, role, dtype, &shape);
        bindings.push(Binding {
            semantic: semantic as i32,
            buffer: name,
        });
    }

    let mut graphs: Vec<Graph> = (SAMPLE_DECODE.iter())
        .map(|&capacity| graph(GraphKind::Decode, capacity))
        .chain((SAMPLE_PREFILL.iter()).map(|&capacity| graph(GraphKind::Prefill, capacity)))
        .chain(
            [
                GraphKind::Resume,
                GraphKind::Admit,
                GraphKind::Snapshot,
                GraphKind::Restore,
            ]
            .map(|kind| graph(kind, 1)),
        )
        .collect();
    graphs[0].nodes.push(Node {
        op: Some(Op::Kernel(KernelNode {
            image_sha256: SAMPLE_IMAGE.to_owned(),
            function: "sample_decode_step".to_owned(),
            grid: dim3(1, 1, 1),
            block: dim3(128, 1, 1),
            params: vec![0; 8],
            param_offsets: vec![0],
            param_sizes: vec![8],
            ..KernelNode::default()
        })),
    });
    graphs[0].edges.push(Edge {
        from: 0,
        to: 1,
        ..Edge::default()
    });

    Core {
        abi_version: ENGINE_ABI,
        identity: Some(Identity {
            engine_version: crate::ENGINE_VERSION.to_owned(),
            recipe: "sample".to_owned(),
            checkpoint_fingerprint: "sample-checkpoint".to_owned(),
            config_fingerprint: "sample-config".to_owned(),
            tokenizer_fingerprint: "sample-tokenizer".to_owned(),
            device_name: "none (sample)".to_owned(),
            ..Identity::default()
        }),
        window: Some(Window {
            base: SAMPLE_BASE,
            size: SAMPLE_WINDOW,
            regions: REGIONS
                .iter()
                .map(|&(kind, offset, size)| Region {
                    kind: kind as i32,
                    offset: offset * MIB,
                    size: size * MIB,
                    backed_bytes: size * MIB,
                })
                .collect(),
        }),
        buffers: layout.buffers,
        images: vec![KernelImage {
            sha256: SAMPLE_IMAGE.to_owned(),
            size_bytes: 4096,
        }],
        graphs,
        contract: Some(PreparedContract {
            page_size: PAGE_SIZE,
            max_concurrency: SAMPLE_DECODE[SAMPLE_DECODE.len() - 1],
            context_limit: CONTEXT_LIMIT,
            prefill_chunk_size: SAMPLE_PREFILL[SAMPLE_PREFILL.len() - 1],
            decode_capacities: SAMPLE_DECODE.to_vec(),
            prefill_capacities: SAMPLE_PREFILL.to_vec(),
            kv_pages: KV_PAGES,
            bytes_per_page: 2 * u64::from(PAGE_SIZE) * HIDDEN * 2,
            snapshot_rows: 2,
            vocab_size: VOCAB,
            bindings,
            completion_fields: ["slot", "token", "finished"].map(str::to_owned).to_vec(),
            kv_page_axis: Some(0),
            // K/V pages alone, as a dense core's.
            continuation: ContinuationState::PositionalKv as i32,
        }),
        frontend: Some(Frontend {
            tokenizer_json: r#"{"version":"1.0","model":{"type":"WordLevel"}}"#.to_owned(),
            chat_template: String::new(),
            eos_token_ids: vec![2],
            special_tokens: ["<s>", "</s>"].map(str::to_owned).to_vec(),
            sampling: Some(SamplingDefaults {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.0,
                repetition_penalty: 1.0,
                temperature_range: Some(FloatRange { min: 0.0, max: 2.0 }),
                ..SamplingDefaults::default()
            }),
            tool_parser: ToolParser::None as i32,
            reasoning_parser: ReasoningParser::None as i32,
            named_special_tokens: [("bos_token", "<s>"), ("eos_token", "</s>")]
                .map(|(name, content)| NamedToken {
                    name: name.to_owned(),
                    content: content.to_owned(),
                })
                .to_vec(),
            tool_markers: None,
            reasoning_markers: None,
        }),
        qualification: Some(Qualification {
            steps: vec![QualificationStep {
                graph: 0,
                writes: vec![BufferWrite {
                    buffer: SAMPLE_QUALIFIED.to_owned(),
                    offset: 0,
                    data: vec![1, 0, 0, 0],
                }],
                digests: vec![BufferDigest {
                    buffer: SAMPLE_QUALIFIED.to_owned(),
                    sha256: SAMPLE_IMAGE.to_owned(),
                }],
            }],
        }),
        rank_layout: None,
    }
}

/// The sample core prepared for `world_size` ranks ([`with_ranks`]).
pub fn ranked_core(world_size: u32) -> Core {
    with_ranks(tiny_core(), world_size)
}

/// `core` prepared for `world_size` ranks: each peer has rank 0's buffers,
/// graphs and qualification sequence in a window of its own, right after the
/// previous rank's.
pub fn with_ranks(mut core: Core, world_size: u32) -> Core {
    let window = core.window.clone().expect("the sample has a window");
    let peers = (1..world_size)
        .map(|rank| RankBundle {
            rank,
            window: Some(Window {
                base: window.base + u64::from(rank) * window.size,
                ..window.clone()
            }),
            buffers: core.buffers.clone(),
            graphs: core.graphs.clone(),
            qualification: core.qualification.clone(),
        })
        .collect();
    core.rank_layout = Some(RankLayout {
        world_size,
        peers,
        collectives_wait_limit_offset: None,
    });
    core
}

/// A contiguous bf16 KV pages buffer (`kv.pages`, role KV pages) of `shape`
/// at window offset `offset`, for tests that vary the page geometry.
pub fn contiguous_kv_buffer(offset: u64, shape: &[u64]) -> Buffer {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    Buffer {
        name: "kv.pages".to_owned(),
        role: BufferRole::KvPages as i32,
        offset,
        size_bytes: shape.iter().product::<u64>() * itemsize(DType::DtypeBf16),
        dtype: DType::DtypeBf16 as i32,
        shape: shape.to_vec(),
        strides,
        initial_tensor: String::new(),
    }
}
