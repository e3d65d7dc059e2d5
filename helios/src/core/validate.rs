//! Structural validation of a decoded manifest, before any CUDA work.
//!
//! The manifest is untrusted input: every check here avoids panics, and all
//! offset and size arithmetic is checked.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::error::CoreError;
use super::proto::{
    node::Op, Binding, Buffer, BufferRole, ContinuationState, DType, Dim3, FloatRange, Frontend,
    Graph, GraphKind, KernelImage, KernelNode, MemcpyNode, MemsetNode, PreparedContract,
    Qualification, ReasoningParser, Region, RegionKind, Semantic, ToolParser, Window,
};
use super::ENGINE_ABI;

const MIB: u64 = 1 << 20;
/// The window base must be aligned to a large page.
pub(crate) const WINDOW_ALIGNMENT: u64 = 2 * MIB;
/// Smallest window a core may reserve.
pub(crate) const MIN_WINDOW_SIZE: u64 = 32 * MIB;
/// Graph kinds the contract needs once, at capacity 1.
const SINGLE_GRAPHS: [GraphKind; 4] = [
    GraphKind::Resume,
    GraphKind::Admit,
    GraphKind::Snapshot,
    GraphKind::Restore,
];

/// Semantic values a core may leave unbound: the sampling graphs' token
/// masks (cores exported before constrained decoding lack them, and load as
/// before). A core binds both or neither.
pub const OPTIONAL_SEMANTICS: [Semantic; 2] = [Semantic::SampleMask, Semantic::SampleMasked];

/// Every semantic value a core must bind, in schema order (all but
/// `SEMANTIC_UNSPECIFIED` and [`OPTIONAL_SEMANTICS`]).
pub fn required_semantics() -> impl Iterator<Item = Semantic> {
    all_semantics().filter(|semantic| !OPTIONAL_SEMANTICS.contains(semantic))
}

/// Every semantic value, in schema order (all but `SEMANTIC_UNSPECIFIED`).
pub fn all_semantics() -> impl Iterator<Item = Semantic> {
    (1..).map_while(|value| Semantic::try_from(value).ok())
}

/// The execution ABI: 0 means the field was never written.
pub(crate) fn check_abi(found: u32) -> Result<(), CoreError> {
    if found == 0 {
        return Err(CoreError::Missing {
            field: "abi_version",
        });
    }
    if found > ENGINE_ABI {
        return Err(CoreError::UnsupportedAbi {
            found,
            supported: ENGINE_ABI,
        });
    }
    Ok(())
}

/// An enum field that must hold a known, specified (non-zero) value.
fn specified<E: TryFrom<i32>>(field: &'static str, value: i32) -> Result<E, CoreError> {
    match E::try_from(value) {
        Ok(known) if value != 0 => Ok(known),
        _ => Err(CoreError::UnknownEnum { field, value }),
    }
}

pub(crate) fn check_window(window: &Window) -> Result<(), CoreError> {
    let invalid = |reason| Err(CoreError::InvalidWindow { reason });
    if window.base == 0 {
        return invalid("base is 0");
    }
    if !window.base.is_multiple_of(WINDOW_ALIGNMENT) {
        return invalid("base is not a multiple of 2 MiB");
    }
    if window.size < MIN_WINDOW_SIZE {
        return invalid("size is below 32 MiB");
    }
    if window.base.checked_add(window.size).is_none() {
        return invalid("base + size overflows the address space");
    }
    check_regions(&window.regions, window.size)
}

fn check_regions(regions: &[Region], window_size: u64) -> Result<(), CoreError> {
    let mut spans = Vec::with_capacity(regions.len());
    for (index, region) in regions.iter().enumerate() {
        specified::<RegionKind>("window.regions.kind", region.kind)?;
        let invalid = |reason| Err(CoreError::InvalidRegion { index, reason });
        if region.size == 0 {
            return invalid("is empty");
        }
        match region.offset.checked_add(region.size) {
            Some(end) if end <= window_size => spans.push((region.offset, end, index)),
            _ => return invalid("extends past the window"),
        }
        if region.backed_bytes > region.size {
            return invalid("backs more bytes than it holds");
        }
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if let [(_, earlier_end, _), (later_start, _, index)] = *pair {
            if earlier_end > later_start {
                return Err(CoreError::InvalidRegion {
                    index,
                    reason: "overlaps another region",
                });
            }
        }
    }
    Ok(())
}

/// Bytes of one element of `dtype` (0 for unspecified).
pub(super) fn itemsize(dtype: DType) -> u64 {
    match dtype {
        DType::DtypeUnspecified => 0,
        DType::DtypeU8 => 1,
        DType::DtypeBf16 | DType::DtypeF16 => 2,
        DType::DtypeF32 | DType::DtypeI32 => 4,
        DType::DtypeI64 => 8,
    }
}

/// Checks every buffer; returns buffer name -> position.
pub(crate) fn check_buffers(
    buffers: &[Buffer],
    window_size: u64,
) -> Result<HashMap<&str, usize>, CoreError> {
    let mut names = HashMap::with_capacity(buffers.len());
    for (position, buffer) in buffers.iter().enumerate() {
        if buffer.name.is_empty() {
            return Err(CoreError::Missing {
                field: "buffers.name",
            });
        }
        if names.insert(buffer.name.as_str(), position).is_some() {
            return Err(CoreError::Duplicate {
                what: "buffer",
                name: buffer.name.clone(),
            });
        }
        specified::<BufferRole>("buffers.role", buffer.role)?;
        let dtype = specified::<DType>("buffers.dtype", buffer.dtype)?;
        check_view(buffer, itemsize(dtype), window_size).map_err(|reason| {
            CoreError::InvalidView {
                buffer: buffer.name.clone(),
                reason,
            }
        })?;
    }
    Ok(names)
}

fn check_view(buffer: &Buffer, itemsize: u64, window_size: u64) -> Result<(), &'static str> {
    if buffer.shape.len() != buffer.strides.len() {
        return Err("shape and strides differ in length");
    }
    match buffer.offset.checked_add(buffer.size_bytes) {
        Some(end) if end <= window_size => {}
        _ => return Err("lies outside the window"),
    }
    if buffer.shape.contains(&0) {
        return Ok(()); // an empty tensor touches no memory
    }
    let overflow = "strided extent overflows";
    let mut last = 0u64; // index of the last element, in elements
    for (&dim, &stride) in buffer.shape.iter().zip(&buffer.strides) {
        let step = (dim - 1).checked_mul(stride).ok_or(overflow)?;
        last = last.checked_add(step).ok_or(overflow)?;
    }
    let extent = last
        .checked_add(1)
        .and_then(|elements| elements.checked_mul(itemsize))
        .ok_or(overflow)?;
    if extent > buffer.size_bytes {
        return Err("strided extent exceeds size_bytes");
    }
    Ok(())
}

fn is_sha256_hex(digest: &str) -> bool {
    digest.len() == 64
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks every kernel image; returns the set of their digests.
pub(crate) fn check_images(images: &[KernelImage]) -> Result<HashSet<&str>, CoreError> {
    let mut digests = HashSet::with_capacity(images.len());
    for image in images {
        if !is_sha256_hex(&image.sha256) {
            return Err(CoreError::InvalidImage {
                sha256: image.sha256.clone(),
                reason: "sha256 is not 64 lowercase hex digits",
            });
        }
        if !digests.insert(image.sha256.as_str()) {
            return Err(CoreError::Duplicate {
                what: "kernel image",
                name: image.sha256.clone(),
            });
        }
    }
    Ok(digests)
}

/// A launch dimension that is present and non-zero on every axis.
fn positive(dim: Option<&Dim3>) -> bool {
    dim.is_some_and(|d| d.x > 0 && d.y > 0 && d.z > 0)
}

/// Checks every graph; returns (kind, capacity) -> position.
pub(crate) fn check_graphs(
    graphs: &[Graph],
    images: &HashSet<&str>,
    window: &Window,
) -> Result<BTreeMap<(GraphKind, u32), usize>, CoreError> {
    let mut catalog = BTreeMap::new();
    for (position, graph) in graphs.iter().enumerate() {
        let kind = specified::<GraphKind>("graphs.kind", graph.kind)?;
        let invalid = |reason: String| CoreError::InvalidGraph {
            kind: kind.as_str_name(),
            capacity: graph.capacity,
            reason,
        };
        if graph.capacity == 0 {
            return Err(invalid("capacity is 0".to_owned()));
        }
        if catalog.insert((kind, graph.capacity), position).is_some() {
            return Err(CoreError::Duplicate {
                what: "graph",
                name: format!("{}@{}", kind.as_str_name(), graph.capacity),
            });
        }
        for (index, node) in graph.nodes.iter().enumerate() {
            let Some(op) = &node.op else {
                return Err(invalid(format!("node {index} has no op")));
            };
            let kernel = match op {
                Op::Kernel(kernel) => kernel,
                Op::Memset(memset) => {
                    check_memset(memset, window)
                        .map_err(|reason| invalid(format!("node {index}: {reason}")))?;
                    continue;
                }
                Op::Memcpy(memcpy) => {
                    check_memcpy(memcpy, window)
                        .map_err(|reason| invalid(format!("node {index}: {reason}")))?;
                    continue;
                }
                Op::Empty(_) => continue,
            };
            check_launch(kernel).map_err(|reason| invalid(format!("node {index}: {reason}")))?;
            if !images.contains(kernel.image_sha256.as_str()) {
                return Err(CoreError::UnknownReference {
                    what: "kernel image",
                    name: kernel.image_sha256.clone(),
                });
            }
            if !positive(kernel.block.as_ref()) {
                return Err(invalid(format!("node {index} has a zero block dimension")));
            }
            if !positive(kernel.grid.as_ref()) {
                return Err(invalid(format!("node {index} has a zero grid dimension")));
            }
        }
        let nodes = graph.nodes.len();
        for (index, edge) in graph.edges.iter().enumerate() {
            for end in [edge.from, edge.to] {
                if !usize::try_from(end).is_ok_and(|end| end < nodes) {
                    return Err(invalid(format!(
                        "edge {index} refers to node {end}, the graph has {nodes} nodes"
                    )));
                }
            }
        }
    }
    Ok(catalog)
}

/// Whether `[addr, addr + len)` lies inside the window's address range.
fn in_window(addr: u64, len: u64, window: &Window) -> bool {
    addr.checked_sub(window.base)
        .and_then(|offset| offset.checked_add(len))
        .is_some_and(|end| end <= window.size)
}

/// A memset the driver can do, inside the window (whether it is backed is
/// checked when the graph is built).
fn check_memset(memset: &MemsetNode, window: &Window) -> Result<(), String> {
    let extent = crate::cuda::memset_extent(memset)?;
    if !in_window(memset.dst, extent, window) {
        return Err(format!(
            "memset of {extent} bytes at {:#x} lies outside the window",
            memset.dst
        ));
    }
    Ok(())
}

/// A device-to-device copy inside the window.
fn check_memcpy(memcpy: &MemcpyNode, window: &Window) -> Result<(), String> {
    if memcpy.size_bytes == 0 {
        return Err("memcpy of 0 bytes".to_owned());
    }
    for (what, addr) in [("source", memcpy.src), ("destination", memcpy.dst)] {
        if !in_window(addr, memcpy.size_bytes, window) {
            return Err(format!(
                "memcpy {what} of {} bytes at {addr:#x} lies outside the window",
                memcpy.size_bytes
            ));
        }
    }
    Ok(())
}

/// A kernel launch the loader can express: its parameter layout fits its
/// bytes and its cluster shape is none or fully positive.
fn check_launch(kernel: &KernelNode) -> Result<(), String> {
    crate::cuda::param_ranges(
        kernel.params.len(),
        &kernel.param_offsets,
        &kernel.param_sizes,
    )
    .map_err(|error| format!("kernel parameters: {error}"))?;
    let cluster = kernel.cluster.unwrap_or_default();
    crate::cuda::cluster_launch(cluster.x, cluster.y, cluster.z)
        .map_err(|error| error.to_string())?;
    Ok(())
}

/// Capacity lists: non-empty, positive, strictly ascending, ending at `last`.
fn check_capacities(
    name: &str,
    capacities: &[u32],
    last_name: &str,
    last: u32,
) -> Result<(), CoreError> {
    let catalog = |reason| Err(CoreError::Catalog { reason });
    match capacities {
        [] => catalog(format!("{name} is empty")),
        [0, ..] => catalog(format!("{name} {capacities:?} start at 0")),
        _ if capacities.windows(2).any(|pair| pair[0] >= pair[1]) => {
            catalog(format!("{name} {capacities:?} are not strictly ascending"))
        }
        [.., end] if *end != last => catalog(format!(
            "{name} {capacities:?} end at {end}, but {last_name} is {last}"
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_contract(
    contract: &PreparedContract,
    catalog: &BTreeMap<(GraphKind, u32), usize>,
) -> Result<(), CoreError> {
    if contract.page_size == 0 {
        return Err(CoreError::Missing {
            field: "contract.page_size",
        });
    }
    if contract.context_limit == 0 {
        return Err(CoreError::Missing {
            field: "contract.context_limit",
        });
    }
    check_capacities(
        "decode_capacities",
        &contract.decode_capacities,
        "max_concurrency",
        contract.max_concurrency,
    )?;
    check_capacities(
        "prefill_capacities",
        &contract.prefill_capacities,
        "prefill_chunk_size",
        contract.prefill_chunk_size,
    )?;
    let not_paged = "is not a multiple of page_size";
    if !contract
        .prefill_chunk_size
        .is_multiple_of(contract.page_size)
    {
        return Err(CoreError::Contract {
            field: "prefill_chunk_size",
            reason: not_paged,
        });
    }
    if !contract.context_limit.is_multiple_of(contract.page_size) {
        return Err(CoreError::Contract {
            field: "context_limit",
            reason: not_paged,
        });
    }
    let needed = (contract.decode_capacities.iter())
        .map(|&capacity| (GraphKind::Decode, capacity))
        .chain((contract.prefill_capacities.iter()).map(|&capacity| (GraphKind::Prefill, capacity)))
        .chain(SINGLE_GRAPHS.map(|kind| (kind, 1)));
    for (kind, capacity) in needed {
        if !catalog.contains_key(&(kind, capacity)) {
            return Err(CoreError::Catalog {
                reason: format!("no {} graph for capacity {capacity}", kind.as_str_name()),
            });
        }
    }
    if contract.kv_pages < 2 {
        return Err(CoreError::Contract {
            field: "kv_pages",
            reason: "must be at least 2 (page 0 is the null page)",
        });
    }
    if contract.vocab_size == 0 {
        return Err(CoreError::Missing {
            field: "contract.vocab_size",
        });
    }
    if contract.completion_fields.is_empty() {
        return Err(CoreError::Missing {
            field: "contract.completion_fields",
        });
    }
    // Unspecified (older cores) is allowed and read as continuation rows.
    if ContinuationState::try_from(contract.continuation).is_err() {
        return Err(CoreError::UnknownEnum {
            field: "contract.continuation",
            value: contract.continuation,
        });
    }
    Ok(())
}

/// Checks that every semantic value is bound exactly once to an existing
/// buffer; returns semantic -> buffer position.
pub(crate) fn check_bindings(
    bindings: &[Binding],
    buffers: &HashMap<&str, usize>,
) -> Result<BTreeMap<Semantic, usize>, CoreError> {
    let mut bound = BTreeMap::new();
    for binding in bindings {
        let semantic = specified::<Semantic>("contract.bindings.semantic", binding.semantic)?;
        let Some(&position) = buffers.get(binding.buffer.as_str()) else {
            return Err(CoreError::UnknownReference {
                what: "buffer",
                name: binding.buffer.clone(),
            });
        };
        if bound.insert(semantic, position).is_some() {
            return Err(CoreError::Duplicate {
                what: "binding",
                name: semantic.as_str_name().to_owned(),
            });
        }
    }
    if let Some(unbound) = required_semantics().find(|s| !bound.contains_key(s)) {
        return Err(CoreError::Missing {
            field: unbound.as_str_name(),
        });
    }
    let optional = OPTIONAL_SEMANTICS.map(|semantic| bound.contains_key(&semantic));
    if optional.contains(&true) {
        if let Some(position) = optional.iter().position(|&is_bound| !is_bound) {
            return Err(CoreError::Missing {
                field: OPTIONAL_SEMANTICS[position].as_str_name(),
            });
        }
    }
    Ok(bound)
}

pub(crate) fn check_frontend(frontend: &Frontend) -> Result<(), CoreError> {
    let invalid = |reason| Err(CoreError::Frontend { reason });
    if frontend.tokenizer_json.is_empty() {
        return invalid("tokenizer_json is empty");
    }
    if frontend.eos_token_ids.is_empty() {
        return invalid("eos_token_ids is empty");
    }
    let Some(sampling) = &frontend.sampling else {
        return Err(CoreError::Missing {
            field: "frontend.sampling",
        });
    };
    let temperature = sampling.temperature;
    if !(temperature.is_finite() && temperature > 0.0) {
        return invalid("default sampling temperature is not a finite value > 0");
    }
    let defaults = [
        sampling.top_p,
        sampling.min_p,
        sampling.repetition_penalty,
        sampling.presence_penalty,
        sampling.frequency_penalty,
    ];
    if !defaults.iter().all(|value| value.is_finite()) || sampling.top_k < 0 {
        return invalid("a default sampling parameter is not finite (or top_k is negative)");
    }
    let ranges = [
        &sampling.temperature_range,
        &sampling.top_k_range,
        &sampling.top_p_range,
        &sampling.min_p_range,
        &sampling.repetition_penalty_range,
        &sampling.presence_penalty_range,
        &sampling.frequency_penalty_range,
    ];
    // Requests clamp into these ranges: each must be a finite, ordered pair.
    let ordered = |range: &FloatRange| {
        range.min.is_finite() && range.max.is_finite() && range.min <= range.max
    };
    if !ranges.into_iter().flatten().all(ordered) {
        return invalid("a sampling range is not a finite [min, max] with min <= max");
    }
    specified::<ToolParser>("frontend.tool_parser", frontend.tool_parser)?;
    specified::<ReasoningParser>("frontend.reasoning_parser", frontend.reasoning_parser)?;
    // Each parser's markers are present.
    crate::frontend::protocol::OutputProtocol::from_core(frontend).map_err(|error| {
        CoreError::Frontend {
            reason: error.reason,
        }
    })?;
    Ok(())
}

/// Checks the recorded qualification sequence against the graphs and buffers.
pub(crate) fn check_qualification(
    qualification: &Qualification,
    graphs: usize,
    buffers: &[Buffer],
    names: &HashMap<&str, usize>,
) -> Result<(), CoreError> {
    let size_of = |name: &str| -> Result<u64, CoreError> {
        names
            .get(name)
            .map(|&position| buffers[position].size_bytes)
            .ok_or_else(|| CoreError::UnknownReference {
                what: "buffer",
                name: name.to_owned(),
            })
    };
    for (index, step) in qualification.steps.iter().enumerate() {
        let invalid = |reason| {
            Err(CoreError::InvalidQualification {
                step: index,
                reason,
            })
        };
        if step.graph as usize >= graphs {
            return invalid("names a graph index past the catalog");
        }
        for write in &step.writes {
            let size = size_of(&write.buffer)?;
            let end = write.offset.checked_add(write.data.len() as u64);
            if write.data.is_empty() || end.is_none_or(|end| end > size) {
                return invalid("writes outside its buffer, or nothing");
            }
        }
        for digest in &step.digests {
            size_of(&digest.buffer)?;
            if !is_sha256_hex(&digest.sha256) {
                return invalid("digest is not 64 lowercase hex digits");
            }
        }
    }
    Ok(())
}
