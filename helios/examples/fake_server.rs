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
//!     [--launch-ms MS | --launch-us US] [--fail-after LAUNCHES] [--stop-every N]
//!     [--message-checkpoints N] [--frontend FRONTEND.pb] [--script SCRIPT.json] [--no-masks]
//!     [--core DIR] [--idle-spin-ms MS]
//! ```
//!
//! `--idle-spin-ms` has the model thread poll for work that long once idle
//! before it sleeps, as `flare run --idle-spin-ms` (default 0: it sleeps at
//! once).
//!
//! `--core` loads the tiny core fixture from DIR instead of the source tree's
//! `tests/fixtures/tiny-core` (a binary run away from the tree it was built in,
//! as on the GPU machine).
//!
//! `--launch-ms` and `--launch-us` hold the model thread that long at every
//! launch, as a device taking time would.
//!
//! `--no-masks` serves as an executor whose sampling takes no grammar mask
//! does (as `flare run` does today): structured output is refused and
//! required tool calls are validated after completion.
//!
//! `--frontend` serves another frontend (a serialized `flare.core.v1.Frontend`,
//! as Ignition writes it into a core: tokenizer, template, output protocol)
//! in place of the fixture's. `--script` makes the model say scripted
//! replies instead of random tokens: a JSON list of `{"when": TEXT, "reply":
//! TEXT}`; a request is answered with the reply of the entry whose `when`
//! occurs latest in its prompt (an empty `when` matches at the start), then
//! EOS; with no match it ends at once. An entry `{"when": TEXT, "reply_with":
//! "prompt_sha256"}` replies with the SHA-256 (hex) of the prompt's token ids
//! written as decimals joined by commas, so a client test can compare the
//! server's prompt with Transformers' exactly.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use helios::core::prost::Message;
use helios::core::{load_manifest, proto};
use helios::frontend::{Frontend, Tokenizer};
use helios::http::{marked_messages, router, AppState, SamplingPolicy, ServeConfig};
use helios::scheduler::test_executor::{FakeModel, Script, TestExecutor};
use helios::scheduler::{
    Completion, ExecutionError, Executor, Geometry, Launch, PrefixConfig, SchedulerConfig,
    ShutdownMode, Ticket, Worker,
};
use helios::serve::serve_http;

/// The allocator `flare` serves with (`flare/src/main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Default)]
struct Args {
    port: u16,
    api_key: Option<String>,
    launch_time: Option<Duration>,
    fail_after: Option<u64>,
    stop_every: Option<u64>,
    message_checkpoints: Option<usize>,
    frontend: Option<PathBuf>,
    script: Option<PathBuf>,
    no_masks: bool,
    core: Option<PathBuf>,
    idle_spin: Duration,
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
            "--launch-us" => args.launch_time = Some(Duration::from_micros(number(value()?)?)),
            "--fail-after" => args.fail_after = Some(number(value()?)?),
            "--stop-every" => args.stop_every = Some(number(value()?)?),
            "--message-checkpoints" => {
                args.message_checkpoints = Some(number(value()?)? as usize);
            }
            "--frontend" => args.frontend = Some(PathBuf::from(value()?)),
            "--script" => args.script = Some(PathBuf::from(value()?)),
            "--no-masks" => args.no_masks = true,
            "--core" => args.core = Some(PathBuf::from(value()?)),
            "--idle-spin-ms" => args.idle_spin = Duration::from_millis(number(value()?)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// What a scripted entry says.
#[derive(Debug)]
enum Reply {
    Tokens(Vec<u32>),
    PromptDigest,
}

/// Scripted replies ([`Script`]): each entry's trigger text and reply.
#[derive(Debug)]
struct Replies {
    tokenizer: Tokenizer,
    entries: Vec<(String, Reply)>,
    eos: u32,
}

impl Replies {
    fn load(path: &PathBuf, frontend: &proto::Frontend) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let entries: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let tokenizer =
            Tokenizer::from_json(&frontend.tokenizer_json).map_err(|e| e.to_string())?;
        let entries = (entries.iter())
            .map(|entry| {
                let when = entry["when"].as_str().unwrap_or_default().to_owned();
                if entry["reply_with"] == "prompt_sha256" {
                    return Ok((when, Reply::PromptDigest));
                }
                let reply = entry["reply"].as_str().ok_or("an entry without a reply")?;
                let tokens = tokenizer.encode(reply, false).map_err(|e| e.to_string())?;
                Ok((when, Reply::Tokens(tokens)))
            })
            .collect::<Result<_, String>>()?;
        let eos = *frontend
            .eos_token_ids
            .first()
            .ok_or("the frontend has no EOS id")?;
        Ok(Self {
            tokenizer,
            entries,
            eos,
        })
    }
}

impl Script for Replies {
    fn next_token(&self, history: &[u32], counter: u64) -> u32 {
        let prompt = &history[..history.len().saturating_sub(counter as usize)];
        let text = self.tokenizer.decode(prompt, false).unwrap_or_default();
        let latest = |when: &str| match when {
            "" => Some(0),
            when => text.rfind(when),
        };
        let reply = (self.entries.iter())
            .filter_map(|(when, reply)| Some((latest(when)?, reply)))
            .max_by_key(|(at, _)| *at)
            .map(|(_, reply)| reply);
        let tokens = match reply {
            None => return self.eos,
            Some(Reply::Tokens(tokens)) => tokens.clone(),
            Some(Reply::PromptDigest) => {
                use sha2::{Digest, Sha256};
                let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
                let digest = Sha256::digest(ids.join(",").as_bytes());
                let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
                self.tokenizer.encode(&hex, false).unwrap_or_default()
            }
        };
        tokens.get(counter as usize).copied().unwrap_or(self.eos)
    }
}

/// The test executor, optionally slowed down and failing after some launches.
struct Fake {
    inner: TestExecutor,
    /// Whether to apply grammar masks (`--no-masks`: not).
    masks: bool,
    launch_time: Option<Duration>,
    fail_after: Option<u64>,
    launches: u64,
}

impl Executor for Fake {
    fn applies_masks(&self) -> bool {
        self.masks && self.inner.applies_masks()
    }

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
    let core_dir = args.core.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-core")
    });
    let core = load_manifest(&core_dir)
        .unwrap_or_else(|error| panic!("the tiny core at {} loads: {error}", core_dir.display()));
    let core_frontend = match &args.frontend {
        None => core.frontend().clone(),
        Some(path) => {
            let bytes = std::fs::read(path).expect("the --frontend file reads");
            proto::Frontend::decode(bytes.as_slice()).expect("the --frontend file decodes")
        }
    };
    let frontend = Arc::new(Frontend::from_core(&core_frontend).expect("its frontend builds"));
    // The fixture's pool is tiny; clients need room for long outputs.
    let mut contract = core.contract().clone();
    contract.kv_pages = 129;
    contract.context_limit = 1024;
    let vocab = frontend.tokenizer().vocab_size() as u32;
    contract.vocab_size = contract.vocab_size.max(vocab);
    let geometry = Geometry::from_contract(&contract, frontend.eos_token_ids())
        .expect("the fixture's geometry is valid");
    let mut model = FakeModel::new(&geometry, args.stop_every);
    if let Some(path) = &args.script {
        match Replies::load(path, &core_frontend) {
            Ok(replies) => model = model.with_script(Arc::new(replies)),
            Err(error) => {
                eprintln!("fake_server: --script {error}");
                return ExitCode::from(2);
            }
        }
    }
    let executor_geometry = geometry.clone();
    let (launch_time, fail_after) = (args.launch_time, args.fail_after);
    let masks = !args.no_masks;
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
        idle_spin: args.idle_spin,
        ..SchedulerConfig::default()
    };
    let worker = Worker::spawn(geometry.clone(), config, move || {
        Ok(Fake {
            inner: TestExecutor::with_snapshot_rows(&executor_geometry, model, rows),
            masks,
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
        constrained: !args.no_masks,
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
