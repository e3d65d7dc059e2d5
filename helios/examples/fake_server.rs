//! The real HTTP server over the deterministic test executor, for client
//! tests that need sockets and no GPU (`tests/test_http_clients.py` runs the
//! `openai` and `anthropic` Python clients against it).
//!
//! It serves the frontend of the tiny core fixture with the fake model behind
//! the scheduler, exactly as `flare run` serves a loaded core, and prints
//! `flare: serving on http://ADDR` on stderr once bound.
//!
//! ```text
//! cargo run -p flare-helios --example fake_server -- [--port 0] [--api-key KEY]
//!     [--launch-ms MS] [--fail-after LAUNCHES] [--stop-every N] [--message-checkpoints N]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use helios::core::load_manifest;
use helios::frontend::Frontend;
use helios::http::{marked_messages, router, AppState, SamplingPolicy, ServeConfig};
use helios::scheduler::test_executor::{FakeModel, TestExecutor};
use helios::scheduler::{
    Completion, ExecutionError, Executor, Geometry, Launch, PrefixConfig, SchedulerConfig,
    ShutdownMode, Ticket, Worker,
};
use helios::serve::serve_http;

#[derive(Debug, Default)]
struct Args {
    port: u16,
    api_key: Option<String>,
    launch_time: Option<Duration>,
    fail_after: Option<u64>,
    stop_every: Option<u64>,
    message_checkpoints: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args::default();
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let mut value = || words.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| text.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--port" => args.port = number(value()?)? as u16,
            "--api-key" => args.api_key = Some(value()?),
            "--launch-ms" => args.launch_time = Some(Duration::from_millis(number(value()?)?)),
            "--fail-after" => args.fail_after = Some(number(value()?)?),
            "--stop-every" => args.stop_every = Some(number(value()?)?),
            "--message-checkpoints" => {
                args.message_checkpoints = Some(number(value()?)? as usize);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// The test executor, optionally slowed down and failing after some launches.
struct Fake {
    inner: TestExecutor,
    launch_time: Option<Duration>,
    fail_after: Option<u64>,
    launches: u64,
}

impl Executor for Fake {
    fn submit(&mut self, launch: &Launch) -> Result<Ticket, ExecutionError> {
        if let Some(time) = self.launch_time {
            std::thread::sleep(time);
        }
        self.launches += 1;
        if self.fail_after == Some(self.launches) {
            self.inner.fail_next();
        }
        self.inner.submit(launch)
    }

    fn poll(&mut self, ticket: Ticket) -> Result<Option<Completion>, ExecutionError> {
        self.inner.poll(ticket)
    }

    fn wait(&mut self, ticket: Ticket) -> Result<Completion, ExecutionError> {
        self.inner.wait(ticket)
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("fake_server: {error}");
            return ExitCode::from(2);
        }
    };
    let core_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core");
    let core = load_manifest(&core_dir).expect("the tiny core fixture loads");
    let frontend = Arc::new(Frontend::from_core(core.frontend()).expect("its frontend builds"));
    // The fixture's pool is tiny; clients need room for long outputs.
    let mut contract = core.contract().clone();
    contract.kv_pages = 129;
    contract.context_limit = 1024;
    let geometry = Geometry::from_contract(&contract, frontend.eos_token_ids())
        .expect("the fixture's geometry is valid");
    let model = FakeModel::new(&geometry, args.stop_every);
    let executor_geometry = geometry.clone();
    let (launch_time, fail_after) = (args.launch_time, args.fail_after);
    // The prefix cache over 16 snapshot rows, as a prepared core has them.
    let rows = 16;
    let prefix = Some(PrefixConfig {
        snapshot_rows: rows,
        ..PrefixConfig::from_core(&core).expect("the fixture declares its rows")
    });
    let marked = marked_messages(
        prefix.as_ref(),
        geometry.max_concurrency(),
        args.message_checkpoints,
    );
    let config = SchedulerConfig {
        prefix,
        ..SchedulerConfig::default()
    };
    let worker = Worker::spawn(geometry.clone(), config, move || {
        Ok(Fake {
            inner: TestExecutor::with_snapshot_rows(&executor_geometry, model, rows),
            launch_time,
            fail_after,
            launches: 0,
        })
    })
    .expect("the worker starts");
    let handle = worker.handle();
    let config = ServeConfig {
        model: "tiny".to_owned(),
        aliases: vec!["tiny-alias".to_owned()],
        sampling: SamplingPolicy::from_core(core.sampling()),
        context_limit: geometry.context_limit(),
        max_body_bytes: 64 * 1024,
        api_key: args.api_key,
        marked_messages: marked,
    };
    let app = router(AppState::new(handle.clone(), frontend, config));
    let served = serve_http(&format!("127.0.0.1:{}", args.port), app, handle);
    let joined = worker.shutdown(ShutdownMode::Finish);
    match (served, joined) {
        (Ok(()), _) => ExitCode::SUCCESS,
        (Err(error), _) => {
            eprintln!("fake_server: {error}");
            ExitCode::from(2)
        }
    }
}
