//! `flare_heliopause`: the Python extension module that Ignition imports.
//!
//! Heliopause is where Ignition's Python preparation pipeline meets Helios.
//! It will carry the fixed-address preparation allocator (so the tensors
//! Ignition records live at the addresses the runtime core describes), CUDA
//! inspection, and in-process replay diagnostics that run Helios's graph
//! replay next to the Python one. For now it only reports the engine version,
//! so both halves can check they were built from the same workspace.

use pyo3::prelude::*;

/// Python module `flare_heliopause`.
#[pymodule]
mod flare_heliopause {
    use pyo3::prelude::*;

    /// Version of the Helios engine this extension was built against.
    #[pyfunction]
    fn engine_version() -> &'static str {
        helios::ENGINE_VERSION
    }
}
