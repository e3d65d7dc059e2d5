//! Errors returned by Helios.

use std::path::PathBuf;

use crate::core::CoreError;
use crate::replay::ReplayError;

/// Errors returned by the Helios engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeliosError {
    /// The runtime core's manifest could not be read, decoded or validated.
    #[error("invalid runtime core: {0}")]
    Core(#[from] CoreError),
    /// The runtime core could not be loaded onto the GPU or replayed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// Serving failed to start, or stopped with a failure.
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    /// A report could not be written.
    #[error("cannot write the report to {}: {source}", path.display())]
    WriteReport {
        /// Where it was to be written.
        path: PathBuf,
        /// Why it could not be.
        #[source]
        source: std::io::Error,
    },
}
