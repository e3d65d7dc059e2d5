//! `flare run`: a runtime core served over HTTP.
//!
//! Startup reads and validates the core on the host, builds its frontend,
//! loads it onto the GPU on the model thread (window, initial contents,
//! modules, graphs, then as many KV pages as fit beside the configured
//! reserve), and only then binds the socket: a core that cannot load never
//! answers a request. SIGINT or SIGTERM stops admission, lets the requests
//! in flight finish (a second signal cancels them), drains the GPU, joins
//! the model thread and returns.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;

mod in_process;
mod load;
mod plan;

pub use in_process::{start_in_process, InProcessConfig, InProcessServer};

use self::plan::{plan, Admission};
use crate::core::{load_manifest, CoreError};
use crate::frontend::FrontendError;
use crate::http::{router, AppState};
use crate::replay::{KvBacking, LoadOptions};
use crate::scheduler::{
    ExecutionError, GeometryError, SchedulerError, SchedulerHandle, ShutdownMode, Worker,
};

const MIB: u64 = 1 << 20;

/// What `flare run` serves and how.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The runtime core directory.
    pub core: PathBuf,
    /// Address or host name to listen on.
    pub host: String,
    /// TCP port (0 picks a free one; the bound address is printed).
    pub port: u16,
    /// When set, every `/v1` route requires it.
    pub api_key: Option<String>,
    /// CUDA device ordinal (rank 0's, for a tensor-parallel core).
    pub device: i32,
    /// For a tensor-parallel core: every rank's device, rank 0's first;
    /// empty: rank `r` on `device + r`.
    pub rank_devices: Vec<i32>,
    /// The longest a rank's collective waits for its peer before its step
    /// fails (at most [`crate::scheduler::COLLECTIVES_WAIT_LIMIT_MAX`]: a
    /// drained rank's memory goes after a longer teardown wait).
    pub collectives_wait_limit: Duration,
    /// GPU memory left free after the KV pages are backed, in MiB.
    pub gpu_reserve_mib: u64,
    /// The model id `/v1/models` lists (default: the core directory's name).
    pub model: Option<String>,
    /// Other names requests may give the model.
    pub aliases: Vec<String>,
    /// The largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Requests the admission queue holds.
    pub queue_capacity: usize,
    /// Reuse exact prefix checkpoints across requests (when the core has
    /// snapshot rows).
    pub prefix_cache: bool,
    /// Offer the prefix cache the endpoints of at most this many last
    /// messages of a chat (None: as many as one request may capture). Each
    /// offered endpoint ends a prefill chunk; 0 keeps only the prompt's and
    /// the answer's ends.
    pub message_checkpoints: Option<usize>,
    /// How long the model thread polls for work once idle before it sleeps
    /// (a request arriving within it skips the thread's wake-up; zero
    /// sleeps at once).
    pub idle_spin: Duration,
}

/// Why the server could not start or stopped with a failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The core's manifest is unreadable or invalid.
    #[error("invalid runtime core: {0}")]
    Core(#[from] CoreError),
    /// The core's frontend assets (tokenizer, template) are unusable.
    #[error("the core's frontend cannot be built: {0}")]
    Frontend(#[from] FrontendError),
    /// The core's contract cannot be scheduled.
    #[error("the core's contract cannot be scheduled: {0}")]
    Geometry(#[from] GeometryError),
    /// The model thread could not start (the core did not load onto the
    /// GPU, or the executor could not be built).
    #[error("cannot start serving: {0}")]
    Start(SchedulerError),
    /// The socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The async runtime or the server failed.
    #[error("the HTTP server failed: {0}")]
    Server(#[source] std::io::Error),
    /// The model thread failed while serving.
    #[error("the model thread failed: {0}")]
    Worker(SchedulerError),
}

/// The model id of a core served without `--model`: its directory's name.
fn default_model_name(core: &std::path::Path) -> String {
    core.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(core)
        .file_name()
        .map_or_else(|| "flare".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// Loads the core, serves it until a shutdown signal, then drains and
/// joins. Blocks the calling thread.
pub fn run(options: RunOptions) -> Result<(), ServeError> {
    let core = load_manifest(&options.core)?;
    let admission = Admission {
        model: (options.model.clone()).unwrap_or_else(|| default_model_name(&options.core)),
        aliases: options.aliases.clone(),
        api_key: options.api_key.clone(),
        max_body_bytes: options.max_body_bytes,
        queue_capacity: options.queue_capacity,
        prefix_cache: options.prefix_cache,
        message_checkpoints: options.message_checkpoints,
        idle_spin: options.idle_spin,
    };
    let plan = plan(&core, admission)?;
    drop(core);
    let prepared = plan.geometry;

    let path = options.core.clone();
    let load = LoadOptions {
        device: options.device,
        kv: KvBacking::FromFreeMemory {
            reserve_bytes: options.gpu_reserve_mib * MIB,
        },
        rank_devices: options.rank_devices.clone(),
        collectives_wait_limit: Some(options.collectives_wait_limit),
    };
    let worker = Worker::spawn_with(plan.scheduler, move || {
        let loaded = load::load(&path, &load)?;
        for report in &loaded.reports {
            let rank = if loaded.reports.len() > 1 {
                format!(" rank {} on device {}", report.rank, report.device.ordinal)
            } else {
                String::new()
            };
            eprintln!(
                "flare: loaded {}{rank} in {:.0} ms: {} graphs ({} nodes), {} KV pages, {} MiB free",
                path.display(),
                report.total_ms,
                report.graphs,
                report.nodes,
                report.kv_pages,
                report.free_after_load / MIB,
            );
        }
        if loaded.reports.len() > 1 {
            eprintln!(
                "flare: serving {} ranks with {} KV pages each (the fewest any rank backs)",
                loaded.reports.len(),
                loaded.kv_pages()
            );
        }
        let geometry =
            prepared
                .with_kv_pages(loaded.kv_pages())
                .map_err(|error| ExecutionError::Device {
                    operation: "core load",
                    source: Arc::new(error),
                })?;
        Ok((loaded.executor, geometry))
    })
    .map_err(ServeError::Start)?;

    let handle = worker.handle();
    let app = router(AppState::new(handle.clone(), plan.frontend, plan.http));
    let address = format!("{}:{}", options.host, options.port);
    let served = serve_http(&address, app, handle);
    // Requests still running were finished by the model thread (or
    // cancelled by a second signal); join it whatever the server did.
    let joined = worker.shutdown(ShutdownMode::Finish);
    served?;
    joined.map_err(ServeError::Worker)
}

/// Binds `address`, prints the bound address on stderr (`flare: serving on
/// http://ADDR`) and serves `app` until SIGINT or SIGTERM, telling the model
/// thread behind `handle` to stop admitting first. Blocks the calling
/// thread; the caller joins the model thread afterwards.
pub fn serve_http(
    address: &str,
    app: axum::Router,
    handle: SchedulerHandle,
) -> Result<(), ServeError> {
    serve_http_with(address, app, shutdown_signal(handle), |bound| {
        eprintln!("flare: serving on http://{bound} (Ctrl-C stops)");
    })
}

/// The HTTP runtime's threads: a bounded number whatever the load, since no
/// thread is held per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerThreads {
    /// Async workers: sockets, SSE formatting, detokenization.
    pub workers: usize,
    /// The blocking pool: prompt rendering and tokenization
    /// ([`crate::http`]'s preparation), one prompt per thread.
    pub preparation: usize,
}

impl ServerThreads {
    /// At most this many of each kind.
    pub const MAX: usize = 8;

    /// One of each per core, between 2 and [`Self::MAX`].
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let bounded = cores.clamp(2, Self::MAX);
        Self {
            workers: bounded,
            preparation: bounded,
        }
    }
}

/// The least cores for which [`idle_spin_for`] polls.
pub const IDLE_SPIN_CORES: usize = 8;
/// The model thread's poll where it polls.
pub const IDLE_SPIN: Duration = Duration::from_millis(50);

/// The model thread's idle poll ([`RunOptions::idle_spin`]) by default on a
/// host of `cores` cores: [`IDLE_SPIN`] from [`IDLE_SPIN_CORES`] up, where a
/// busy core leaves the HTTP threads and the client theirs (on a 16-core
/// host the fake server's TTFT was 0.94 to 0.96x parking at once), else
/// none (on 2 cores the poll took one from them: 0.95 to 1.12x;
/// `bench/results/issue23/2026-12-07g-h100-host-spin`).
pub fn idle_spin_for(cores: usize) -> Duration {
    if cores >= IDLE_SPIN_CORES {
        IDLE_SPIN
    } else {
        Duration::ZERO
    }
}

/// [`idle_spin_for`] this machine's cores.
pub fn idle_spin_for_this_machine() -> Duration {
    idle_spin_for(std::thread::available_parallelism().map_or(1, usize::from))
}

/// Binds `address`, calls `on_bound` with the bound address and serves
/// `app` until `shutdown` resolves, then lets open responses finish, on a
/// runtime of [`ServerThreads::for_this_machine`]. Blocks the calling
/// thread.
pub fn serve_http_with<S, B>(
    address: &str,
    app: axum::Router,
    shutdown: S,
    on_bound: B,
) -> Result<(), ServeError>
where
    S: std::future::Future<Output = ()> + Send + 'static,
    B: FnOnce(SocketAddr),
{
    let threads = ServerThreads::for_this_machine();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("helios-http")
        .worker_threads(threads.workers)
        .max_blocking_threads(threads.preparation)
        .build()
        .map_err(ServeError::Server)?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| ServeError::Bind {
                address: address.to_owned(),
                source,
            })?;
        let bound: SocketAddr = listener.local_addr().map_err(ServeError::Server)?;
        on_bound(bound);
        // Every SSE event is its own small write: with Nagle's algorithm the
        // second one waits for the client's delayed ACK (about 40 ms), which
        // stalls the first content delta behind the role event.
        let listener = listener.tap_io(|stream| {
            if let Err(error) = stream.set_nodelay(true) {
                eprintln!("flare: cannot set TCP_NODELAY on an accepted socket: {error}");
            }
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ServeError::Server)
    })
}

/// Resolves on the first SIGINT or SIGTERM, after telling the model thread
/// to stop admitting; a second signal cancels the requests still running.
async fn shutdown_signal(handle: SchedulerHandle) {
    wait_for_signal().await;
    eprintln!("flare: stopping: finishing the requests in flight (a second signal cancels them)");
    handle.begin_shutdown(ShutdownMode::Finish);
    tokio::spawn(async move {
        wait_for_signal().await;
        eprintln!("flare: cancelling the requests in flight");
        handle.begin_shutdown(ShutdownMode::Cancel);
    });
}

async fn wait_for_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(core: PathBuf) -> RunOptions {
        RunOptions {
            core,
            host: "127.0.0.1".to_owned(),
            port: 0,
            api_key: None,
            device: 0,
            rank_devices: Vec::new(),
            collectives_wait_limit: crate::replay::COLLECTIVES_WAIT_LIMIT,
            gpu_reserve_mib: 0,
            model: None,
            aliases: Vec::new(),
            max_body_bytes: 1 << 20,
            queue_capacity: 16,
            prefix_cache: true,
            message_checkpoints: None,
            idle_spin: Duration::ZERO,
        }
    }

    #[test]
    fn the_model_thread_polls_by_default_only_on_hosts_of_many_cores() {
        assert_eq!(idle_spin_for(16), IDLE_SPIN);
        assert_eq!(idle_spin_for(IDLE_SPIN_CORES), Duration::from_millis(50));
        assert_eq!(idle_spin_for(IDLE_SPIN_CORES - 1), Duration::ZERO);
        assert_eq!(idle_spin_for(2), Duration::ZERO);
    }

    #[test]
    fn an_unreadable_core_fails_before_anything_starts() {
        let error = run(options(PathBuf::from("/nonexistent/core"))).unwrap_err();
        assert!(matches!(error, ServeError::Core(_)), "{error}");
    }

    #[test]
    fn the_model_id_defaults_to_the_core_directory_name() {
        assert_eq!(
            default_model_name(std::path::Path::new("cores/smollm2-135m")),
            "smollm2-135m"
        );
    }
}
