//! Errors returned by Helios.

use std::path::PathBuf;

use crate::core::CoreError;

/// Errors returned by the Helios engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeliosError {
    /// The runtime core at `path` cannot be loaded because this build has no
    /// runtime-core loader yet.
    #[error(
        "cannot load runtime core {}: the runtime-core loader is not part of this build yet \
         (the runtime-core issue adds it)",
        path.display()
    )]
    CoreUnavailable {
        /// Path of the runtime core that was requested.
        path: PathBuf,
    },
    /// The runtime core's manifest could not be read, decoded or validated.
    #[error("invalid runtime core: {0}")]
    Core(#[from] CoreError),
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
