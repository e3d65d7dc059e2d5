//! Helios: the Rust serving engine of Flare.
//!
//! Flare splits inference into two halves. Ignition, the Python preparation
//! package, turns a model into a *runtime core*: a self-describing artifact
//! holding the model's identity, its memory regions, its recorded graphs and
//! the contract that says how they may be driven. Helios loads such a core and
//! serves it with no Python in the process. It owns everything a server needs
//! around the core:
//!
//! - sockets, HTTP and server-sent events (SSE) streaming;
//! - tokenization;
//! - request scheduling and batching;
//! - KV-cache pages;
//! - checkpoints;
//! - graph replay of the recorded graphs.
//!
//! Helios never contains model-specific policy. Anything that depends on a
//! particular model architecture is decided by Ignition and written into the
//! core; Helios only executes what the core's contract describes.
//!
//! The `flare` binary is a thin command-line front end over this library, and
//! the `flare_heliopause` Python extension exposes parts of it to Ignition.

pub mod core;
pub mod cuda;
pub mod error;
pub mod execution;
pub mod frontend;
pub mod grammar;
pub mod http;
pub mod prefix;
pub mod replay;
pub mod scheduler;
pub mod serve;

pub use error::HeliosError;

/// Version of the Helios engine, taken from the workspace package version.
///
/// Runtime cores record the engine version they were prepared against, and
/// the Python extension reports the same value so both halves can be checked
/// against each other.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
