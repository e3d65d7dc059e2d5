//! Why a runtime core could not be loaded onto the GPU or replayed.

use std::path::PathBuf;

use crate::core::CoreError;
use crate::cuda::CudaError;

/// A core directory that cannot be loaded, or a replay that cannot run.
///
/// Everything about the directory's files is checked before any CUDA work,
/// so a corrupt core is reported with one of the file variants whether or not
/// the machine has a GPU.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The manifest could not be read, decoded or validated.
    #[error("invalid runtime core: {0}")]
    Core(#[from] CoreError),
    /// A file of the core directory could not be read (missing, unreadable
    /// or shorter than it claims).
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A kernel image file's length differs from the manifest's.
    #[error(
        "kernel image {sha256}: the manifest declares {declared} bytes, its file holds {found}"
    )]
    ImageSize {
        /// The image's digest.
        sha256: String,
        /// `size_bytes` in the manifest.
        declared: u64,
        /// Length of the file.
        found: u64,
    },
    /// A kernel image file's contents do not hash to its name.
    #[error("kernel image {sha256}: its file's contents hash to {found}")]
    ImageDigest {
        /// The digest the manifest and the file name give.
        sha256: String,
        /// The SHA-256 of the file's contents.
        found: String,
    },
    /// `buffers.safetensors` is not a valid safetensors file (bad header,
    /// truncated data).
    #[error("{}: not a valid safetensors file: {reason}", path.display())]
    CorruptTensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A buffer's initial tensor is not in `buffers.safetensors`.
    #[error("buffer {buffer:?}: its initial tensor {tensor:?} is not in buffers.safetensors")]
    InitialTensorMissing {
        /// The buffer.
        buffer: String,
        /// The tensor name the manifest gives.
        tensor: String,
    },
    /// A buffer's initial tensor has another dtype than the buffer.
    #[error(
        "buffer {buffer:?}: its initial tensor has dtype {found}, the manifest declares {expected}"
    )]
    InitialTensorDtype {
        /// The buffer.
        buffer: String,
        /// The buffer's dtype, for example `DTYPE_BF16`.
        expected: &'static str,
        /// The tensor's safetensors dtype, for example `F32`.
        found: String,
    },
    /// A buffer's initial tensor has another shape than the buffer.
    #[error(
        "buffer {buffer:?}: its initial tensor has shape {found:?}, the manifest declares \
         {expected:?}"
    )]
    InitialTensorShape {
        /// The buffer.
        buffer: String,
        /// The buffer's shape.
        expected: Vec<u64>,
        /// The tensor's shape.
        found: Vec<u64>,
    },
    /// A buffer with initial contents is not a contiguous view, so the
    /// tensor's bytes cannot be copied to it as they are.
    #[error("buffer {buffer:?} has initial contents but is not a contiguous view")]
    NonContiguous {
        /// The buffer.
        buffer: String,
    },
    /// A buffer the host writes or reads lies outside the window's backed
    /// memory.
    #[error("buffer {buffer:?} lies outside the window's backed memory")]
    Unbacked {
        /// The buffer.
        buffer: String,
    },
    /// The window cannot be laid out on this device.
    #[error("window: {reason}")]
    WindowLayout {
        /// What is wrong.
        reason: &'static str,
    },
    /// The device has less free memory than the window's backed spans need.
    #[error("the window backs {needed} bytes, the device has {free} bytes free")]
    InsufficientMemory {
        /// Bytes to map.
        needed: u64,
        /// Free device memory.
        free: u64,
    },
    /// Every rank of a tensor-parallel core was to be loaded in one thread
    /// with KV pages sized from free memory: that is how one rank loads
    /// ([`super::LoadedCore::load_rank`], one thread per rank when
    /// serving); loading every rank at once (`flare replay`) backs their
    /// prepared pages.
    #[error(
        "the core has {world_size} ranks: flare replay loads them with their prepared KV \
         pages (drop --gpu-reserve)"
    )]
    RanksFromFreeMemory {
        /// The core's ranks.
        world_size: u32,
    },
    /// An operation that runs one rank alone was asked of a tensor-parallel
    /// core, whose ranks' graphs wait for each other.
    #[error(
        "{what} runs one rank alone, and this core has {world_size} ranks that wait for each other"
    )]
    OneRankOnly {
        /// The operation.
        what: &'static str,
        /// The core's ranks.
        world_size: u32,
    },
    /// Loading one rank of a tensor-parallel core failed (a core of one rank
    /// reports the failure itself).
    #[error("rank {rank} of {world_size}: {source}")]
    Rank {
        /// The rank that failed to load.
        rank: u32,
        /// The core's ranks.
        world_size: u32,
        /// Why.
        #[source]
        source: Box<ReplayError>,
    },
    /// A rank past the core's world size was asked for.
    #[error("rank {rank} asked for, and the core has {world_size} ranks")]
    NoRank {
        /// The rank asked for.
        rank: u32,
        /// The core's ranks.
        world_size: u32,
    },
    /// The devices given for a tensor-parallel core's ranks do not name one
    /// per rank.
    #[error("{given} rank devices given for a core of {world_size} ranks: name one per rank")]
    RankDevices {
        /// Devices given.
        given: usize,
        /// The core's ranks.
        world_size: u32,
    },
    /// A rank's device cannot reach a peer rank's device memory, where the
    /// rank's graphs read and signal the peer's collectives region.
    #[error(
        "device {from} cannot access device {to}'s memory (no peer access between them): the \
         ranks' collectives need it; place the ranks on devices connected by NVLink or PCIe P2P"
    )]
    NoPeerAccess {
        /// The device that would read.
        from: i32,
        /// The device whose memory it would read.
        to: i32,
    },
    /// A rank's collectives region is not backed whole, so peers could not
    /// reach all of it.
    #[error("rank {rank}'s collectives region is not backed whole: re-export the core")]
    CollectivesUnbacked {
        /// The rank.
        rank: u32,
    },
    /// Free device memory, after everything else was loaded and the reserve
    /// and driver margin set aside, backs fewer KV pages than one request of
    /// the context limit needs (or, for a core without `kv_page_axis`, not
    /// all of them).
    #[error(
        "the KV cache needs at least {needed} pages of {bytes_per_page} bytes; the {budget} bytes \
         free after the reserve and the driver margin back {backable}"
    )]
    InsufficientKvPages {
        /// Pages needed: one request of the context limit and the null page
        /// (every prepared page for a core without `kv_page_axis`).
        needed: u32,
        /// Pages the budget backs.
        backable: u32,
        /// `contract.bytes_per_page`.
        bytes_per_page: u64,
        /// Free memory less the reserve and the driver margin.
        budget: u64,
    },
    /// The device's compute capability differs from the core's.
    #[error(
        "the core was prepared for compute capability {}.{}, device {ordinal} ({name}) has {}.{}",
        expected.0, expected.1, found.0, found.1
    )]
    DeviceMismatch {
        /// (major, minor) recorded in the core's identity.
        expected: (u32, u32),
        /// (major, minor) of the device.
        found: (u32, u32),
        /// The device ordinal.
        ordinal: i32,
        /// The device's name.
        name: String,
    },
    /// A kernel image could not be loaded.
    #[error("cannot load kernel image {sha256}: {source}")]
    Image {
        /// The image's digest.
        sha256: String,
        /// Why.
        #[source]
        source: CudaError,
    },
    /// A graph could not be rebuilt or instantiated.
    #[error("cannot rebuild graph {index} ({kind} at capacity {capacity}): {source}")]
    Graph {
        /// Position of the graph in the manifest.
        index: usize,
        /// Its kind, for example `GRAPH_KIND_DECODE`.
        kind: &'static str,
        /// Its capacity.
        capacity: u32,
        /// Why.
        #[source]
        source: CudaError,
    },
    /// A launch named a graph the core does not have.
    #[error("no graph {index}: the core has {count}")]
    NoGraph {
        /// The index asked for.
        index: usize,
        /// Number of graphs.
        count: usize,
    },
    /// Any other failure of the CUDA driver layer (driver missing, window
    /// unavailable, a copy or launch failed).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// `--check` was asked of a core exported without a qualification
    /// sequence.
    #[error("the core carries no qualification sequence (it was exported without one)")]
    NoQualification,
    /// Fault isolation could not order or run a graph's nodes.
    #[error("fault isolation: {reason}")]
    Isolation {
        /// What went wrong.
        reason: String,
    },
    /// The decode bench asked for a capacity the core has no graph for.
    #[error(
        "the core has no decode graph at capacity {capacity} (decode capacities {available:?})"
    )]
    NoDecodeGraph {
        /// The capacity asked for.
        capacity: u32,
        /// The core's decode capacities.
        available: Vec<u32>,
    },
}
