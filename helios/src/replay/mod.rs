//! Loading a runtime core onto the GPU and replaying it with no Python.
//!
//! [`CoreDir::read`] reads and checks the whole core directory on the host
//! (manifest, kernel image digests, initial tensors' dtypes and shapes)
//! before any CUDA work. [`LoadedCore::load`] then reserves the fixed window
//! at its exact base, backs and zeroes the spans the regions record, uploads
//! the initial contents, loads the kernel images and rebuilds and
//! instantiates every graph, timing each part ([`LoadReport`]). The KV page
//! region is backed at its prepared extent or, per [`KvBacking`], last and
//! from the free memory left then ([`plan_kv_from_free`]).
//!
//! [`LoadedCore::check`] replays the qualification sequence recorded from
//! Python replay and compares every digest bitwise
//! ([`QualificationReport`]); [`LoadedCore::bench_decode`] times native
//! decode replay ([`DecodeBench`]). Both run on [`ReplayDevice`], so their
//! logic is tested with a CPU fake. [`LoadedCore::isolate`] runs the
//! sequence node by node to name the first node the device rejects
//! ([`IsolationReport`]).
//!
//! [`check_core`] is the one driver of the check (load, qualification,
//! bench) that `flare replay` and Heliopause's `replay_check` share, and
//! [`isolate_core`] that of the isolation.

mod bench;
mod check;
mod core_dir;
mod digest;
mod error;
mod identity;
mod initial;
mod isolate;
mod kv_backing;
mod loaded;
mod qualify;
mod rank_load;
mod report;
mod spans;

pub use bench::{bench_decode, CheckpointCost, DecodeBench, Timing};
pub use check::{check_core, isolate_core, CheckOptions};
pub use core_dir::{image_path, CoreDir, ImageBytes, IMAGES_DIR};
pub use digest::sha256_hex;
pub use error::ReplayError;
pub use identity::check_device;
pub use initial::{is_contiguous, InitialContents, InitialUpload, TensorReader, BUFFERS_FILE};
pub use isolate::{
    isolate, topological_order, IsolationReport, NodeDevice, NodeFailure, NodeSummary,
};
pub use kv_backing::{
    kv_budget, min_kv_pages, page_spans, plan_kv_from_free, plan_kv_prepared, plan_kv_within,
    KvBacking, KvPlan, KvWindow, DRIVER_MARGIN,
};
pub use loaded::{LoadOptions, LoadedCore, COLLECTIVES_WAIT_LIMIT};
pub use qualify::{qualify, qualify_ranks, QualificationReport, ReplayDevice, StepReport};
pub use report::{LoadReport, PeerReport, ReplayReport};
pub use spans::{
    check_backed, check_initial_backed, check_qualification_backed, plan_spans, plan_spans_of,
    SpanPlan,
};
