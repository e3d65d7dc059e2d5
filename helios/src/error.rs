//! Errors returned by Helios.

use std::path::PathBuf;

use crate::core::CoreError;
use crate::replay::ReplayError;

/// Errors returned by the Helios engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeliosError {
    /// The runtime core at `path` cannot be served because this build has no
    /// server yet (`flare replay` loads and replays a core).
    #[error(
        "cannot serve runtime core {}: serving is not part of this build yet \
         (flare replay loads and replays a core)",
        path.display()
    )]
    CoreUnavailable {
        /// Path of the runtime core that was requested.
        path: PathBuf,
    },
    /// The runtime core's manifest could not be read, decoded or validated.
    #[error("invalid runtime core: {0}")]
    Core(#[from] CoreError),
    /// The runtime core could not be loaded onto the GPU or replayed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_unavailable_keeps_the_requested_path() {
        let err = HeliosError::CoreUnavailable {
            path: PathBuf::from("models/tiny.core"),
        };
        assert!(matches!(
            err,
            HeliosError::CoreUnavailable { ref path } if path == &PathBuf::from("models/tiny.core")
        ));
    }
}
