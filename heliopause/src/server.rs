//! `start_server`: Helios serving a prepared model in the process that
//! prepared it (the design's in-process diagnostic path).
//!
//! Python hands over a manifest without graph nodes (contract, buffers,
//! window, frontend), the executable handles of its captured graphs and the
//! owner object that keeps graphs, buffers and window alive. Helios borrows
//! the graphs on its own model thread, without the GIL, and serves HTTP.
//! The handle keeps the owner until the server has drained and joined;
//! `close()` releases it (with the GIL) afterwards.

use std::sync::Mutex;
use std::time::Duration;

use helios::serve::{start_in_process, InProcessConfig, InProcessServer};
use pyo3::prelude::*;

pyo3::create_exception!(
    flare_heliopause,
    ServerError,
    pyo3::exceptions::PyRuntimeError,
    "Helios could not start, or stopped with a failure, serving in this process."
);

/// A running in-process server: `address`, `wait()`, `close()`.
#[pyclass(module = "flare_heliopause")]
pub struct ServerHandle {
    address: String,
    server: Mutex<Option<InProcessServer>>,
    owner: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl ServerHandle {
    /// `host:port` the server listens on.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Blocks, with the GIL released, until the server stops (it stops when
    /// closed from another thread). Ctrl-C raises `KeyboardInterrupt` here;
    /// the server keeps running until `close()`.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        loop {
            let stopped = py.detach(|| {
                let guard = self.server.lock().unwrap_or_else(|e| e.into_inner());
                guard
                    .as_ref()
                    .is_none_or(|server| server.wait_timeout(Duration::from_millis(100)))
            });
            if stopped {
                return Ok(());
            }
            py.check_signals()?;
        }
    }

    /// Stops admission, lets running requests finish, drains the GPU, joins
    /// the native threads, then releases the prepared model's owner.
    /// Idempotent. Raises `ServerError` when the server or its model thread
    /// had failed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        let result = match server {
            Some(mut server) => py.detach(move || server.close()),
            None => Ok(()),
        };
        // Only now may Python free the graphs and buffers.
        let owner = self.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(owner);
        result.map_err(|error| ServerError::new_err(error.to_string()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<Py<PyAny>>,
        _value: Option<Py<PyAny>>,
        _traceback: Option<Py<PyAny>>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        // Never leave native threads using memory whose owner goes away.
        if let Some(mut server) = self.server.get_mut().ok().and_then(Option::take) {
            let _ = server.close();
        }
    }
}

/// Serves prepared graphs in this process: `manifest` (a serialized
/// `flare.core.v1.Core` whose graphs list kind and capacity only),
/// `graph_execs` (each graph's `cudaGraphExec_t`, in the manifest's order)
/// and `owner` (kept alive until `close()`: it must own the graphs, the
/// buffers and the window). Returns once the socket is bound; raises
/// `ServerError` (and binds nothing) when startup fails.
#[pyfunction]
#[pyo3(signature = (
    manifest, graph_execs, owner, host = "127.0.0.1".to_owned(), port = 8080,
    api_key = None, model = "flare".to_owned(), max_body_bytes = 4 << 20,
    queue_capacity = 1024, device = 0, prefix_cache = true
))]
#[allow(clippy::too_many_arguments)]
pub fn start_server(
    py: Python<'_>,
    manifest: Vec<u8>,
    graph_execs: Vec<u64>,
    owner: Py<PyAny>,
    host: String,
    port: u16,
    api_key: Option<String>,
    model: String,
    max_body_bytes: usize,
    queue_capacity: usize,
    device: i32,
    prefix_cache: bool,
) -> PyResult<ServerHandle> {
    let config = InProcessConfig {
        host,
        port,
        api_key,
        model,
        max_body_bytes,
        queue_capacity,
        device,
        prefix_cache,
    };
    // SAFETY: the handles come from the owner's captured graphs, which it
    // keeps instantiated and alive; the handle returned keeps the owner
    // until the server is closed.
    let server = py
        .detach(move || unsafe { start_in_process(manifest, graph_execs, config) })
        .map_err(|error| ServerError::new_err(error.to_string()))?;
    Ok(ServerHandle {
        address: server.address().to_string(),
        server: Mutex::new(Some(server)),
        owner: Mutex::new(Some(owner)),
    })
}
