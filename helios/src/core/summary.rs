//! A display-ready digest of a valid core, printed by `flare inspect`.

use std::collections::BTreeMap;

use super::proto::{
    BufferRole, ContinuationState, GraphKind, Identity, ReasoningParser, RegionKind,
    SamplingDefaults, ToolParser,
};
use super::ValidCore;

/// Facts about a valid core, grouped for display.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreSummary {
    /// Execution ABI the core was exported for.
    pub abi_version: u32,
    /// What was prepared, from what, on which device.
    pub identity: Identity,
    /// Virtual address of the window.
    pub window_base: u64,
    /// Size of the window in bytes.
    pub window_size: u64,
    /// The window's regions, in manifest order.
    pub regions: Vec<RegionSummary>,
    /// Each peer rank's number and window (base, size): empty for one rank.
    pub peer_windows: Vec<(u32, u64, u64)>,
    /// Number of buffers.
    pub buffer_count: usize,
    /// Bytes of all buffers together.
    pub buffer_bytes: u64,
    /// Buffers grouped by role, in schema order; roles without buffers are
    /// left out.
    pub buffers_by_role: Vec<RoleSummary>,
    /// Number of kernel images.
    pub image_count: usize,
    /// Bytes of all kernel images together.
    pub image_bytes: u64,
    /// Graphs grouped by kind, in schema order; kinds without graphs are left
    /// out.
    pub graphs_by_kind: Vec<GraphKindSummary>,
    /// The contract's scalar facts and capacity lists.
    pub contract: ContractSummary,
    /// The frontend's facts (the tokenizer itself is left out).
    pub frontend: FrontendSummary,
}

/// One region of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSummary {
    /// What the region holds.
    pub kind: RegionKind,
    /// Offset from the window base, in bytes.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// The buffers of one role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleSummary {
    /// The role.
    pub role: BufferRole,
    /// Number of buffers with that role.
    pub count: usize,
    /// Their bytes together.
    pub bytes: u64,
}

/// The graphs of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphKindSummary {
    /// The kind.
    pub kind: GraphKind,
    /// Capacities recorded for it, ascending.
    pub capacities: Vec<u32>,
    /// Nodes of all these graphs together.
    pub nodes: usize,
}

/// The prepared contract, without its bindings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractSummary {
    /// Tokens per KV page.
    pub page_size: u32,
    /// Most requests decoded at once.
    pub max_concurrency: u32,
    /// Most tokens of one request.
    pub context_limit: u32,
    /// Most tokens prefilled by one prefill graph.
    pub prefill_chunk_size: u32,
    /// Decode graph capacities, ascending.
    pub decode_capacities: Vec<u32>,
    /// Prefill graph capacities, ascending.
    pub prefill_capacities: Vec<u32>,
    /// KV pages, the null page included.
    pub kv_pages: u32,
    /// Bytes of one KV page.
    pub bytes_per_page: u64,
    /// Snapshot rows.
    pub snapshot_rows: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Number of semantic bindings.
    pub bindings: usize,
    /// Column names of a completion record.
    pub completion_fields: Vec<String>,
    /// What a request's state holds ([`ValidCore::continuation`]).
    pub continuation: ContinuationState,
}

/// The frontend, without the tokenizer and chat template texts.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontendSummary {
    /// Bytes of the tokenizer serialization.
    pub tokenizer_json_bytes: usize,
    /// Bytes of the chat template (0: none).
    pub chat_template_bytes: usize,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Number of special tokens.
    pub special_tokens: usize,
    /// Default sampling parameters and their ranges.
    pub sampling: SamplingDefaults,
    /// Tool-call parser.
    pub tool_parser: ToolParser,
    /// Its markers, when it has any.
    pub tool_markers: Option<super::proto::ToolMarkers>,
    /// Reasoning parser.
    pub reasoning_parser: ReasoningParser,
    /// Its markers, when it has any.
    pub reasoning_markers: Option<super::proto::ReasoningMarkers>,
}

impl CoreSummary {
    pub(super) fn of(core: &ValidCore) -> Self {
        let window = core.window();
        let regions = window
            .regions
            .iter()
            .map(|region| RegionSummary {
                kind: RegionKind::try_from(region.kind).unwrap_or_default(),
                offset: region.offset,
                size: region.size,
            })
            .collect();

        let mut roles: BTreeMap<BufferRole, RoleSummary> = BTreeMap::new();
        for buffer in core.buffers() {
            let role = BufferRole::try_from(buffer.role).unwrap_or_default();
            let entry = roles.entry(role).or_insert(RoleSummary {
                role,
                count: 0,
                bytes: 0,
            });
            entry.count += 1;
            entry.bytes = entry.bytes.saturating_add(buffer.size_bytes);
        }

        let mut kinds: BTreeMap<GraphKind, GraphKindSummary> = BTreeMap::new();
        for graph in core.graphs() {
            let kind = GraphKind::try_from(graph.kind).unwrap_or_default();
            let entry = kinds.entry(kind).or_insert_with(|| GraphKindSummary {
                kind,
                capacities: Vec::new(),
                nodes: 0,
            });
            entry.capacities.push(graph.capacity);
            entry.nodes = entry.nodes.saturating_add(graph.nodes.len());
        }
        for entry in kinds.values_mut() {
            entry.capacities.sort_unstable();
        }

        let contract = core.contract();
        let frontend = core.frontend();
        Self {
            abi_version: core.abi_version(),
            identity: core.identity().clone(),
            window_base: window.base,
            window_size: window.size,
            peer_windows: (core.peers().iter())
                .map(|peer| (peer.rank(), peer.window().base, peer.window().size))
                .collect(),
            regions,
            buffer_count: core.buffers().len(),
            buffer_bytes: core
                .buffers()
                .iter()
                .fold(0u64, |sum, buffer| sum.saturating_add(buffer.size_bytes)),
            buffers_by_role: roles.into_values().collect(),
            image_count: core.images().len(),
            image_bytes: core
                .images()
                .iter()
                .fold(0u64, |sum, image| sum.saturating_add(image.size_bytes)),
            graphs_by_kind: kinds.into_values().collect(),
            contract: ContractSummary {
                page_size: contract.page_size,
                max_concurrency: contract.max_concurrency,
                context_limit: contract.context_limit,
                prefill_chunk_size: contract.prefill_chunk_size,
                decode_capacities: contract.decode_capacities.clone(),
                prefill_capacities: contract.prefill_capacities.clone(),
                kv_pages: contract.kv_pages,
                bytes_per_page: contract.bytes_per_page,
                snapshot_rows: contract.snapshot_rows,
                vocab_size: contract.vocab_size,
                bindings: contract.bindings.len(),
                completion_fields: contract.completion_fields.clone(),
                continuation: core.continuation(),
            },
            frontend: FrontendSummary {
                tokenizer_json_bytes: frontend.tokenizer_json.len(),
                chat_template_bytes: frontend.chat_template.len(),
                eos_token_ids: frontend.eos_token_ids.clone(),
                special_tokens: frontend.special_tokens.len(),
                sampling: *core.sampling(),
                tool_parser: ToolParser::try_from(frontend.tool_parser).unwrap_or_default(),
                tool_markers: frontend.tool_markers.clone(),
                reasoning_parser: ReasoningParser::try_from(frontend.reasoning_parser)
                    .unwrap_or_default(),
                reasoning_markers: frontend.reasoning_markers.clone(),
            },
        }
    }
}
