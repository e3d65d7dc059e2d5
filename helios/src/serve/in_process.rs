//! The in-process diagnostic server: Helios serving graphs that Ignition
//! prepared in this same process (Heliopause's `start_server`).
//!
//! Startup, in order: the manifest is validated and the native frontend
//! built; the model thread starts and borrows the graphs (the handoff fails
//! here, before anything listens, if they cannot be served); then the socket
//! is bound and requests are admitted. [`InProcessServer::close`] stops
//! admission, lets running requests finish, drains the GPU and joins every
//! thread; only then may the owner of the prepared model release it.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::plan::{plan, Admission};
use super::{serve_http_with, ServeError};
use crate::core::decode_manifest;
use crate::execution::{BorrowedGraphs, GpuExecutor};
use crate::http::{router, AppState};
use crate::scheduler::{ExecutionError, SchedulerError, ShutdownMode, Worker};

/// How the in-process server listens and admits.
#[derive(Debug, Clone)]
pub struct InProcessConfig {
    /// Address or host name to listen on.
    pub host: String,
    /// TCP port (0 picks a free one: see [`InProcessServer::address`]).
    pub port: u16,
    /// When set, every `/v1` route requires it.
    pub api_key: Option<String>,
    /// The model id `/v1/models` lists.
    pub model: String,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Requests the admission queue holds.
    pub queue_capacity: usize,
    /// CUDA device ordinal the graphs were prepared on.
    pub device: i32,
    /// Reuse exact prefix checkpoints across requests (when the core has
    /// snapshot rows).
    pub prefix_cache: bool,
}

/// A running in-process server.
#[derive(Debug)]
pub struct InProcessServer {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

impl InProcessServer {
    /// The address the server listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Whether the server has stopped (it stops only when closed, or when
    /// its HTTP server fails).
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        match self.done.recv_timeout(timeout) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => true,
            Err(mpsc::RecvTimeoutError::Timeout) => false,
        }
    }

    /// Stops admission, finishes the running requests, drains the GPU and
    /// joins the server and model threads. Returns the failure, if the
    /// server or the model thread had one. Idempotent.
    pub fn close(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .unwrap_or(Err(ServeError::Worker(SchedulerError::WorkerGone))),
            None => Ok(()),
        }
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn borrow_failure(error: crate::execution::BorrowError) -> ExecutionError {
    ExecutionError::Device {
        operation: "graph handoff",
        source: Arc::new(error),
    }
}

/// Starts serving the graphs `execs` (in `manifest`'s graph order) with the
/// buffers and frontend `manifest` describes; returns once the socket is
/// bound, or with the startup failure (nothing then listens).
///
/// # Safety
///
/// As [`BorrowedGraphs::new`]: every handle is a live executable graph of
/// device `config.device`'s primary context, and the graphs, buffers and
/// window stay alive and unchanged until [`InProcessServer::close`] returned.
pub unsafe fn start_in_process(
    manifest: Vec<u8>,
    execs: Vec<u64>,
    config: InProcessConfig,
) -> Result<InProcessServer, ServeError> {
    let core = decode_manifest(&manifest)?;
    let admission = Admission {
        model: config.model.clone(),
        aliases: Vec::new(),
        api_key: config.api_key.clone(),
        max_body_bytes: config.max_body_bytes,
        queue_capacity: config.queue_capacity,
        prefix_cache: config.prefix_cache,
        message_checkpoints: None,
        idle_spin: std::time::Duration::ZERO,
    };
    let plan = plan(&core, admission)?;
    drop(core);
    let geometry = plan.geometry;
    let device = config.device;
    let worker = Worker::spawn_with(plan.scheduler, move || {
        // SAFETY: the caller's contract, forwarded.
        let graphs =
            unsafe { BorrowedGraphs::new(&manifest, &execs, device) }.map_err(borrow_failure)?;
        Ok((GpuExecutor::new(graphs)?, geometry))
    })
    .map_err(ServeError::Start)?;
    let handle = worker.handle();
    let app = router(AppState::new(handle.clone(), plan.frontend, plan.http));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound_tx, bound_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let address = format!("{}:{}", config.host, config.port);
    let thread = std::thread::Builder::new()
        .name("helios-serve".to_owned())
        .spawn(move || {
            let shutdown = async move {
                let _ = stopped.await;
                handle.begin_shutdown(ShutdownMode::Finish);
            };
            let served = serve_http_with(&address, app, shutdown, |bound| {
                let _ = bound_tx.send(bound);
            });
            let joined = worker.shutdown(ShutdownMode::Finish);
            let _ = done_tx.send(());
            served?;
            joined.map_err(ServeError::Worker)
        })
        .map_err(|error| ServeError::Server(std::io::Error::other(error)))?;
    match bound_rx.recv() {
        Ok(address) => Ok(InProcessServer {
            address,
            stop: Some(stop),
            done,
            thread: Some(thread),
        }),
        // The thread ended before binding: its result says why.
        Err(_) => Err(thread
            .join()
            .unwrap_or(Err(ServeError::Worker(SchedulerError::WorkerGone)))
            .err()
            .unwrap_or(ServeError::Worker(SchedulerError::WorkerGone))),
    }
}
