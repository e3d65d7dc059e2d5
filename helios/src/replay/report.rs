//! What loading measured, and the whole replay report as JSON.

use serde::Serialize;

use super::bench::DecodeBench;
use super::qualify::QualificationReport;
use crate::cuda::DeviceInfo;

/// What loading a core onto the GPU did, and how long each part took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    /// The rank loaded (0 for a one-rank core).
    pub rank: u32,
    /// The device the core was loaded on.
    pub device: DeviceInfo,
    /// Reading the core from disk: manifest, kernel images, the initial
    /// contents' header, and the wait for the initial tensors' pieces (read
    /// by several threads while earlier pieces upload).
    pub read_ms: f64,
    /// Reserving the window, mapping its backed spans and zeroing them.
    pub map_ms: f64,
    /// Copying the initial contents to the device.
    pub upload_ms: f64,
    /// Loading the kernel images as modules.
    pub module_load_ms: f64,
    /// Rebuilding, instantiating and uploading every graph.
    pub graph_build_ms: f64,
    /// Everything, from the first file read to the last graph uploaded.
    pub total_ms: f64,
    /// The window's base address.
    pub window_base: u64,
    /// Bytes reserved.
    pub window_reserved: u64,
    /// Bytes backed by device memory.
    pub backed_bytes: u64,
    /// Number of backed spans.
    pub spans: usize,
    /// The device's allocation granularity.
    pub granularity: u64,
    /// Buffers with initial contents.
    pub initial_tensors: usize,
    /// Bytes of initial contents uploaded.
    pub initial_bytes: u64,
    /// Kernel images loaded.
    pub images: usize,
    /// Their bytes.
    pub image_bytes: u64,
    /// Graphs rebuilt.
    pub graphs: usize,
    /// Their nodes together.
    pub nodes: usize,
    /// Free device memory once loaded.
    pub free_after_load: u64,
    /// KV pages backed in every slab, the null page included: the host may
    /// hand out pages `1..kv_pages`.
    pub kv_pages: u32,
    /// KV pages the core was prepared with, the most a load can back.
    pub kv_pages_prepared: u32,
    /// Bytes of the backed KV pages: `kv_pages` times `bytes_per_page`.
    pub kv_bytes: u64,
    /// Tokens the backed KV pages hold, the null page excluded.
    pub kv_tokens: u64,
    /// Device memory kept free besides the driver margin when the KV pages
    /// were sized from free memory; `None` when the prepared extent was
    /// backed.
    pub kv_reserve_bytes: Option<u64>,
}

/// Everything [`super::check_core`] reports: what `flare replay` prints and
/// writes with `--json`, and what Heliopause's `replay_check` returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The core directory, as given.
    pub core: String,
    /// Loading.
    pub load: LoadReport,
    /// The qualification check, when it ran.
    pub qualification: Option<QualificationReport>,
    /// The decode bench, when it ran.
    pub decode_bench: Option<DecodeBench>,
    /// Ranks 1.. of a tensor-parallel core (the fields above are rank 0's),
    /// in rank order; absent for a one-rank core.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerReport>,
}

/// A peer rank's part of a [`ReplayReport`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerReport {
    /// Loading the rank.
    pub load: LoadReport,
    /// Its qualification check, replayed in lockstep with rank 0's, when it
    /// ran.
    pub qualification: Option<QualificationReport>,
}

impl ReplayReport {
    /// Whether every digest of the qualification matched (also when it did
    /// not run).
    pub fn passed(&self) -> bool {
        let passed = |q: &Option<QualificationReport>| q.as_ref().is_none_or(|q| q.passed());
        passed(&self.qualification) && self.peers.iter().all(|peer| passed(&peer.qualification))
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }
}
