//! Why a runtime-core manifest was rejected.

use std::path::PathBuf;

/// A runtime-core manifest that cannot be read, decoded or trusted.
///
/// Every variant names what was wrong: the field, buffer, region, graph or
/// reference, so that an operator can find it in the exported core. Enum names
/// (`what`, `field`, `kind`) use the schema's spelling, for example
/// `buffer.dtype` or `SEMANTIC_LOGITS`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A file of the core could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest bytes are not a valid `flare.core.v1.Core` message
    /// (truncated or corrupt).
    #[error("manifest is not a valid flare.core.v1.Core message: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A required field is absent or zero. For semantic bindings, `field` is
    /// the unbound semantic, for example `SEMANTIC_LOGITS`.
    #[error("manifest is missing {field}")]
    Missing {
        /// The missing field.
        field: &'static str,
    },
    /// An enum field is unspecified (0) or holds a value this build does not
    /// know.
    #[error("{field} has unknown or unspecified value {value}")]
    UnknownEnum {
        /// The enum field.
        field: &'static str,
        /// The value found.
        value: i32,
    },
    /// The core was exported for a newer execution ABI than this engine's.
    #[error("core uses execution ABI {found}, this engine supports up to {supported}")]
    UnsupportedAbi {
        /// ABI version recorded in the core.
        found: u32,
        /// Highest ABI version this engine accepts.
        supported: u32,
    },
    /// The fixed virtual-address window is unusable.
    #[error("invalid window: {reason}")]
    InvalidWindow {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A window region is unusable.
    #[error("invalid region {index}: {reason}")]
    InvalidRegion {
        /// Position of the region in `window.regions`.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A buffer is not a consistent typed view of window memory.
    #[error("invalid buffer {buffer:?}: {reason}")]
    InvalidView {
        /// Name of the buffer.
        buffer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A kernel image entry is unusable.
    #[error("invalid kernel image {sha256:?}: {reason}")]
    InvalidImage {
        /// The image's recorded digest.
        sha256: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A recorded graph is structurally unusable.
    #[error("invalid {kind} graph at capacity {capacity}: {reason}")]
    InvalidGraph {
        /// The graph's kind, for example `GRAPH_KIND_DECODE`.
        kind: &'static str,
        /// The graph's capacity.
        capacity: u32,
        /// What is wrong with it.
        reason: String,
    },
    /// The graph catalog does not match the contract: bad capacity lists or a
    /// graph the contract needs is absent.
    #[error("graph catalog: {reason}")]
    Catalog {
        /// What is wrong with it.
        reason: String,
    },
    /// A contract field has an unusable value.
    #[error("invalid contract.{field}: {reason}")]
    Contract {
        /// The contract field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Something refers by name to an entry that does not exist.
    #[error("unknown {what} {name:?}")]
    UnknownReference {
        /// What kind of entry was referred to (`buffer`, `kernel image`).
        what: &'static str,
        /// The name that was not found.
        name: String,
    },
    /// Two entries share a name that must be unique.
    #[error("duplicate {what} {name:?}")]
    Duplicate {
        /// What kind of entry is duplicated (`buffer`, `kernel image`,
        /// `graph`, `binding`).
        what: &'static str,
        /// The duplicated name.
        name: String,
    },
    /// A step of the recorded qualification sequence is unusable.
    #[error("invalid qualification step {step}: {reason}")]
    InvalidQualification {
        /// Position of the step in `qualification.steps`.
        step: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The frontend assets (tokenizer, stop tokens, sampling) are unusable.
    #[error("invalid frontend: {reason}")]
    Frontend {
        /// What is wrong with them.
        reason: &'static str,
    },
    /// `contract.kv_page_axis` does not describe the KV pages buffer as
    /// slabs of `kv_pages` pages of `bytes_per_page` bytes together.
    #[error("invalid contract.kv_page_axis {axis} of KV pages buffer {buffer:?}: {problem}")]
    KvPageAxis {
        /// The KV pages buffer.
        buffer: String,
        /// The axis the contract names.
        axis: u32,
        /// What does not match.
        problem: KvAxisProblem,
    },
    /// The rank layout of a tensor-parallel core does not hold together
    /// (world size, the set of ranks, their catalogs, bindings or windows).
    #[error("invalid rank layout: {reason}")]
    RankLayout {
        /// What is wrong with it.
        reason: String,
    },
    /// One rank's window, buffers or graphs are invalid.
    #[error("rank {rank}: {source}")]
    InRank {
        /// The rank whose bundle was rejected.
        rank: u32,
        /// Why.
        #[source]
        source: Box<CoreError>,
    },
}

/// Why `contract.kv_page_axis` does not fit the KV pages buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KvAxisProblem {
    /// The axis is not one of the buffer's.
    #[error("the buffer has rank {rank}")]
    PastRank {
        /// The buffer's rank.
        rank: usize,
    },
    /// A dimension of the buffer is 0.
    #[error("the buffer has an empty dimension")]
    EmptyDimension,
    /// The page axis does not count `contract.kv_pages` pages.
    #[error("the axis holds {found} pages, contract.kv_pages is {kv_pages}")]
    PageCount {
        /// `shape[axis]`.
        found: u64,
        /// `contract.kv_pages`.
        kv_pages: u32,
    },
    /// The axes after the page axis reach past one page's stride, so pages
    /// overlap and a prefix of them cannot be backed alone.
    #[error("one page spans {span} elements, more than the page stride of {stride}")]
    PageOverlap {
        /// Elements from a page's first element to its last, plus one.
        span: u64,
        /// `strides[axis]`.
        stride: u64,
    },
    /// More slabs (the product of the axes before the page axis) than a
    /// load plans spans for.
    #[error("{slabs} slabs exceed the limit of {limit}")]
    TooManySlabs {
        /// The product of `shape[..axis]`.
        slabs: u64,
        /// The most slabs accepted.
        limit: u64,
    },
    /// `contract.bytes_per_page` is not the slabs times the page stride in
    /// bytes.
    #[error("{slabs} slabs of a {stride_bytes}-byte page stride make {computed} bytes per page, contract.bytes_per_page is {declared}")]
    BytesPerPage {
        /// The product of `shape[..axis]`.
        slabs: u64,
        /// `strides[axis]` times the dtype's size.
        stride_bytes: u64,
        /// Their product.
        computed: u128,
        /// `contract.bytes_per_page`.
        declared: u64,
    },
    /// The buffer does not lie inside one `REGION_KIND_KV_PAGES` region, so
    /// backing that region's pages would not back the buffer's.
    #[error("the buffer does not lie inside a REGION_KIND_KV_PAGES region")]
    OutsideRegion,
}
