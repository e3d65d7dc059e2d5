//! `flare_heliopause`: the Python extension module that Ignition imports.
//!
//! Heliopause is where Ignition's Python preparation pipeline meets Helios.
//! It reports the engine version (so both halves can check they were built
//! from the same workspace) and carries the fixed-address preparation
//! allocator, "the window": one virtual address range reserved at a fixed
//! address and split into named regions, handed to PyTorch as a
//! `CUDAPluggableAllocator` so that every tensor Ignition records lives at an
//! address the runtime core can reproduce without Python.
//!
//! - [`window`]: the allocator's bookkeeping (pure Rust, unit-tested).
//! - [`cuda_backing`]: its physical side, over Helios's CUDA layer (the
//!   driver loaded at run time).
//! - [`allocator`]: the process-global window and the C entry points
//!   `flare_window_alloc` / `flare_window_free` for PyTorch.
//! - `replay_check`: in-process replay of an exported core through Helios.
//! - [`server`]: `start_server`, Helios serving graphs prepared in this
//!   process (the in-process diagnostic path).
//!
//! Python usage:
//!
//! ```python
//! import flare_heliopause as hp, torch
//! hp.window_open(0x200000000000, 1 << 30, [("weights", 512 << 20), ("scratch", 256 << 20)])
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     hp.library_path(), "flare_window_alloc", "flare_window_free")
//! weights = torch.cuda.MemPool(alloc.allocator())   # one pool per region
//! hp.window_select("weights")
//! with torch.cuda.use_mem_pool(weights):
//!     w = torch.empty(1024, 1024, device="cuda")
//! ```

pub mod allocator;
pub mod cuda_backing;
pub mod server;
pub mod shared;
pub mod window;

use pyo3::prelude::*;

pyo3::create_exception!(
    flare_heliopause,
    WindowError,
    pyo3::exceptions::PyRuntimeError,
    "An operation on the fixed-address preparation window failed."
);

pyo3::create_exception!(
    flare_heliopause,
    ReplayError,
    pyo3::exceptions::PyRuntimeError,
    "Helios could not load or replay a runtime core in this process."
);

/// Runs Helios's replay check ([`helios::replay::check_core`], the one
/// `flare replay --check` runs) or isolation ([`helios::replay::isolate_core`])
/// on the core at `path` in this process and renders its report as JSON;
/// every failure becomes one message.
fn replay_report(path: &std::path::Path, device: i32, isolate: bool) -> Result<String, String> {
    use helios::replay::{check_core, isolate_core, CheckOptions};

    let json = if isolate {
        isolate_core(path, device)
            .map_err(|e| e.to_string())?
            .to_json()
    } else {
        check_core(path, &CheckOptions::qualification(device))
            .map_err(|e| e.to_string())?
            .to_json()
    };
    json.map_err(|e| e.to_string())
}

fn window_err(message: String) -> PyErr {
    WindowError::new_err(message)
}

/// Python module `flare_heliopause`.
#[pymodule]
mod flare_heliopause {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::{allocator, window_err};

    #[pymodule_export]
    use super::server::{start_server, ServerError, ServerHandle};
    #[pymodule_export]
    use super::shared::SharedSpan;
    #[pymodule_export]
    use super::ReplayError;
    #[pymodule_export]
    use super::WindowError;

    /// In-process replay through Helios (a diagnostic path beside
    /// `start_server`): loads the runtime core at `core` (its window must not
    /// be reserved in this process: close the preparation window first),
    /// replays its qualification sequence and compares every digest, and
    /// returns the report as JSON (load timings, per-step results, free
    /// memory before and after). With `isolate=True` it runs the sequence
    /// node by node instead and reports the first node the device rejects.
    /// Raises `ReplayError` when the core cannot be loaded or replayed.
    #[pyfunction]
    #[pyo3(signature = (core, device = 0, isolate = false))]
    fn replay_check(
        py: Python<'_>,
        core: std::path::PathBuf,
        device: i32,
        isolate: bool,
    ) -> PyResult<String> {
        py.detach(|| super::replay_report(&core, device, isolate))
            .map_err(super::ReplayError::new_err)
    }

    /// Version of the Helios engine this extension was built against.
    #[pyfunction]
    fn engine_version() -> &'static str {
        helios::ENGINE_VERSION
    }

    /// Opens the process-wide window: reserves `size` bytes of device address
    /// space at exactly `base` on CUDA device `device` and lays `regions`
    /// (`(name, capacity)` pairs, in order) out contiguously from `base`, each
    /// rounded up to the allocation granularity. Nothing is mapped until
    /// allocations need it. Raises `WindowError` if a window is already open,
    /// the size is under 32 MiB, the layout does not fit, the CUDA driver
    /// cannot be loaded, or the address is not available.
    #[pyfunction]
    #[pyo3(signature = (base, size, regions, device = 0))]
    fn window_open(
        py: Python<'_>,
        base: u64,
        size: u64,
        regions: Vec<(String, u64)>,
        device: i32,
    ) -> PyResult<()> {
        py.detach(|| allocator::open(base, size, &regions, device))
            .map_err(window_err)
    }

    /// Makes `name` the region that the allocator's next allocations come from.
    #[pyfunction]
    fn window_select(name: &str) -> PyResult<()> {
        allocator::select(name).map_err(window_err)
    }

    /// Maps region `name` whole, before anything is allocated from it, with
    /// zeroed memory another process may map (a tensor-parallel rank's
    /// collectives storage, which its peer maps at this address with
    /// `SharedSpan.import_`), and returns `(address, size, fd)`: the POSIX
    /// descriptor is the caller's to pass on and close. Nothing is allocated
    /// from the region afterwards. Raises `WindowError` for an unknown region,
    /// one already holding memory, or a driver failure.
    #[pyfunction]
    fn window_export_region(py: Python<'_>, name: &str) -> PyResult<(u64, u64, i32)> {
        use std::os::fd::IntoRawFd;
        let (address, size, fd) = py
            .detach(|| allocator::export_region(name))
            .map_err(window_err)?;
        Ok((address, size, fd.into_raw_fd()))
    }

    /// One dict per region, in layout order: name, base, offset, capacity,
    /// high_water, mapped, live_bytes, live_blocks, allocations, reused,
    /// free_blocks, free_bytes, selected.
    #[pyfunction]
    fn window_usage(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
        let usage = allocator::usage().map_err(window_err)?;
        usage
            .into_iter()
            .map(|u| {
                let d = PyDict::new(py);
                d.set_item("name", u.name)?;
                d.set_item("base", u.base)?;
                d.set_item("offset", u.offset)?;
                d.set_item("capacity", u.capacity)?;
                d.set_item("high_water", u.high_water)?;
                d.set_item("mapped", u.mapped)?;
                d.set_item("live_bytes", u.live_bytes)?;
                d.set_item("live_blocks", u.live_blocks)?;
                d.set_item("allocations", u.allocations)?;
                d.set_item("reused", u.reused)?;
                d.set_item("free_blocks", u.free_blocks)?;
                d.set_item("free_bytes", u.free_bytes)?;
                d.set_item("selected", u.selected)?;
                Ok(d)
            })
            .collect()
    }

    /// Window-wide facts (base, size, granularity, device, current region,
    /// live_blocks, live_bytes, failures), or None when no window is open.
    #[pyfunction]
    fn window_info(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
        let Some(info) = allocator::info() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("base", info.base)?;
        d.set_item("size", info.size)?;
        d.set_item("granularity", info.granularity)?;
        d.set_item("device", info.device)?;
        d.set_item("current", info.current)?;
        d.set_item("live_blocks", info.live_blocks)?;
        d.set_item("live_bytes", info.live_bytes)?;
        d.set_item("failures", allocator::failures())?;
        Ok(Some(d))
    }

    /// Message of the most recent failure of `flare_window_alloc` /
    /// `flare_window_free` (which cannot raise), or None. `clear=True` also
    /// forgets it. `window_open` clears it.
    #[pyfunction]
    #[pyo3(signature = (clear = false))]
    fn window_last_error(clear: bool) -> Option<String> {
        allocator::last_error(clear)
    }

    /// Closes the window, unmapping its memory and freeing the reservation.
    /// Raises `WindowError` while blocks are still live (free the tensors,
    /// graphs and pools, then `torch.cuda.empty_cache()`) or when none is open.
    #[pyfunction]
    fn window_close(py: Python<'_>) -> PyResult<()> {
        py.detach(allocator::close).map_err(window_err)
    }

    /// Filesystem path of this extension module, which exports the C entry
    /// points `flare_window_alloc` and `flare_window_free` for
    /// `torch.cuda.memory.CUDAPluggableAllocator`.
    #[pyfunction]
    fn library_path() -> PyResult<String> {
        allocator::library_path().map_err(window_err)
    }
}
