//! Command-line definition and dispatch.

mod replay;

use std::fmt;
use std::io::Write;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use helios::core::proto::FloatRange;
use helios::core::CoreSummary;
use helios::replay::{
    check_core, isolate_core, CheckOptions, KvBacking, LoadOptions, COLLECTIVES_WAIT_LIMIT,
};
use helios::scheduler::COLLECTIVES_WAIT_LIMIT_MAX;
use helios::HeliosError;

/// `flare run --collectives-timeout-ms`'s largest value.
const SERVED_WAIT_LIMIT_MAX_MS: u64 = COLLECTIVES_WAIT_LIMIT_MAX.as_millis() as u64;
/// The default wait limit in milliseconds, as the command line takes it.
const WAIT_LIMIT_MS: u64 = COLLECTIVES_WAIT_LIMIT.as_millis() as u64;
/// `flare run --idle-spin-ms`'s largest value.
const IDLE_SPIN_MAX_MS: u64 = 1000;

/// Flare: serve a runtime core prepared by Ignition, without Python.
#[derive(Debug, Parser)]
#[command(name = "flare", version = helios::ENGINE_VERSION, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a runtime core over OpenAI- and Anthropic-compatible HTTP.
    ///
    /// Loads the runtime core at CORE onto the GPU (no Python: window at its
    /// recorded base, initial contents, kernel images, every graph rebuilt,
    /// then as many KV pages as the prepared count allows beside
    /// --gpu-reserve) and serves POST /v1/chat/completions, /v1/completions,
    /// /v1/messages and /v1/responses (streamed as server-sent events or
    /// not; tool calls and reasoning parsed by the core's output protocol),
    /// GET /v1/models, /health and /metrics. A tensor-parallel core loads each
    /// rank on its device (--rank-devices), driven by an execution thread of its
    /// own; every step runs on every rank. A core that cannot load fails before
    /// the socket is bound (exit status 2). SIGINT or SIGTERM stops
    /// admission, lets running requests finish (a second signal cancels
    /// them), drains the GPU and exits 0.
    Run {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
        /// Address or host name to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// TCP port to listen on (0 picks a free one; the address is printed).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Require this key on the /v1 routes (`Authorization: Bearer KEY` or
        /// `x-api-key: KEY`); /health and /metrics stay open.
        #[arg(long, value_name = "KEY")]
        api_key: Option<String>,
        /// The model id /v1/models lists (default: the core directory's name).
        /// A request naming another model is 404.
        #[arg(long)]
        model: Option<String>,
        /// Another name requests may give the model (repeatable).
        #[arg(long = "alias", value_name = "NAME")]
        aliases: Vec<String>,
        /// GPU memory to leave free after backing the KV pages, in MiB.
        #[arg(long, value_name = "MIB", default_value_t = 2048)]
        gpu_reserve: u64,
        /// The largest request body accepted, in bytes (a larger one is 400).
        #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
        max_body_bytes: usize,
        /// Requests the admission queue holds (more are refused with 503).
        #[arg(long, default_value_t = 1024)]
        queue_capacity: usize,
        /// CUDA device ordinal (rank 0's, for a tensor-parallel core).
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// For a tensor-parallel core: the device of every rank, rank 0's
        /// first, comma-separated (ranks may share one: `0,0`), in place of
        /// --device. Default: rank R on device --device + R. Each rank loads on an execution thread of
        /// its own and backs the KV pages its device holds; the server uses
        /// the fewest.
        #[arg(long, value_name = "DEVICES", value_delimiter = ',')]
        rank_devices: Vec<i32>,
        /// For a tensor-parallel core: the longest a rank's collective waits
        /// for its peer before its step fails with a device error, in
        /// milliseconds, from 1 to 20000 (a peer that faulted then fails the
        /// step on every rank instead of hanging it; at shutdown a rank waits
        /// longer than that for its peers before releasing its memory).
        #[arg(
            long,
            value_name = "MS",
            default_value_t = WAIT_LIMIT_MS,
            value_parser = clap::value_parser!(u64).range(1..=SERVED_WAIT_LIMIT_MAX_MS)
        )]
        collectives_timeout_ms: u64,
        /// Do not reuse exact prefix checkpoints across requests (every
        /// prompt is prefilled from its first token).
        #[arg(long)]
        no_prefix_cache: bool,
        /// Offer the prefix cache the endpoints of at most the last N
        /// messages of a chat (default: as many as one request may capture;
        /// 0: only the prompt's and the answer's ends). On a core whose
        /// request state is positional K/V alone they are captured after
        /// the chunk that holds them; otherwise each ends a prefill chunk,
        /// and fewer trade branch points for fewer prefill launches.
        #[arg(long, value_name = "N")]
        message_checkpoints: Option<usize>,
        /// Once no request is left, the model thread polls for the next one
        /// this many milliseconds (keeping a core busy) before it sleeps: a
        /// request arriving within them skips the thread's wake-up, as an
        /// agent's next turn after a short tool call does. 0 sleeps at once.
        /// Default: 50 on a host of 8 or more cores, else 0 (with fewer the
        /// poll takes a core from the HTTP threads). At most 1000.
        #[arg(
            long,
            value_name = "MS",
            value_parser = clap::value_parser!(u64).range(0..=IDLE_SPIN_MAX_MS)
        )]
        idle_spin_ms: Option<u64>,
    },
    /// Print a runtime core's identity, regions, graphs and contract.
    ///
    /// Loads and validates the manifest of the runtime core at CORE (no GPU
    /// is needed) and prints its identity, memory window and regions, buffers
    /// by role, graphs by kind, the prepared contract and the frontend facts.
    /// An invalid core is reported with exit status 2.
    Inspect {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
    },
    /// Load a runtime core onto the GPU, rebuild its graphs and check or time
    /// their replay.
    ///
    /// Loads the runtime core at CORE with no Python: reserves its window at
    /// the recorded base address, backs it (the KV pages at their prepared
    /// extent unless --gpu-reserve is given), uploads the initial contents,
    /// loads the kernel images and rebuilds and instantiates every graph,
    /// reporting how long each part took and how many KV pages are backed.
    /// --check then replays the qualification sequence recorded from Python
    /// replay at export and compares every recorded digest bitwise.
    /// --bench-decode CAPACITY runs the qualification (when the core has one
    /// and every prepared KV page is backed) and then times STEPS replays of
    /// the decode graph of that capacity, each launching it, waiting and
    /// copying the completion records to the host, as the Python replay
    /// harness does; then, for a core with snapshot rows, it reports a
    /// checkpoint's cost: a snapshot row's bytes and the snapshot and
    /// restore graphs' device time per replay. --isolate runs the qualification sequence with every
    /// graph node launched alone and waited for, and names the first node
    /// the device rejects (a kernel fault poisons the process's CUDA
    /// context, so only the first can be seen). A tensor-parallel core loads
    /// every rank, each on its device (--rank-devices), and --check replays
    /// the ranks' sequences in lockstep, every rank's digests compared;
    /// --isolate and --bench-decode take one-rank cores. Exit status: 0 when every digest matches (or no node faults),
    /// 1 when one differs (or a node faults), 2 when the core cannot be
    /// loaded or replayed.
    #[command(group(
        ArgGroup::new("mode").required(true).args(["check", "bench_decode", "isolate"])
    ))]
    Replay {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
        /// Replay the recorded qualification sequence and compare every
        /// digest bitwise with the recorded Python replay.
        #[arg(long)]
        check: bool,
        /// Run the qualification node by node and name the first node that
        /// faults.
        #[arg(long)]
        isolate: bool,
        /// Time native replay of the decode graph of this capacity.
        #[arg(long, value_name = "CAPACITY")]
        bench_decode: Option<u32>,
        /// Decode steps to time.
        #[arg(long, default_value = "256", conflicts_with = "check")]
        steps: NonZeroU32,
        /// With --bench-decode: back only as many KV pages as fit once
        /// everything else is loaded, leaving MIB MiB plus a 64 MiB driver
        /// margin of device memory free (at most the prepared pages, at
        /// least one request of the context limit). The qualification is
        /// skipped when fewer pages than prepared are backed: its digests
        /// cover them all. --check and --isolate always back every prepared
        /// page.
        #[arg(long, value_name = "MIB", conflicts_with_all = ["check", "isolate"])]
        gpu_reserve: Option<u64>,
        /// Also write the report as JSON to PATH.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// CUDA device ordinal (rank 0's, for a tensor-parallel core).
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// For a tensor-parallel core: the device of every rank, rank 0's
        /// first, comma-separated (ranks may share one: `0,0`), in place of
        /// --device. Default: rank R on device --device + R. --check replays the ranks' qualification
        /// sequences in lockstep (their collectives wait for each other).
        #[arg(long, value_name = "DEVICES", value_delimiter = ',')]
        rank_devices: Vec<i32>,
        /// For a tensor-parallel core: the longest a rank's collective waits
        /// for its peer before the replay fails with a device error, in
        /// milliseconds (0 waits forever: for runs slowed down by a debugger
        /// or sanitizer).
        #[arg(long, value_name = "MS", default_value_t = WAIT_LIMIT_MS)]
        collectives_timeout_ms: u64,
    },
}

/// How a command that ran to the end turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything it checked matched.
    Success,
    /// A replayed digest differs from the recorded one.
    Mismatch,
}

/// Carries out one subcommand.
///
/// `inspect` loads and validates the core's manifest (no CUDA) and prints it.
/// `replay` loads the core onto the GPU and checks or times its replay.
/// `run` loads the core and serves it until SIGINT or SIGTERM.
pub fn execute(command: Command) -> Result<Outcome, HeliosError> {
    match command {
        Command::Inspect { core } => {
            let summary = helios::core::load_manifest(&core)?.summary();
            let report = Inspection {
                path: &core,
                summary: &summary,
            };
            // A closed stdout (`flare inspect CORE | head`) is no failure of
            // the core, so write errors are not reported.
            let _ = write!(std::io::stdout().lock(), "{report}");
            Ok(Outcome::Success)
        }
        Command::Replay {
            core,
            isolate: true,
            json,
            device,
            ..
        } => run_isolation(&core, json, device),
        Command::Replay {
            core,
            check,
            bench_decode,
            steps,
            gpu_reserve,
            json,
            device,
            rank_devices,
            collectives_timeout_ms,
            ..
        } => {
            let options = CheckOptions {
                load: LoadOptions {
                    device,
                    kv: kv_backing(gpu_reserve),
                    rank_devices,
                    collectives_wait_limit: replay_wait_limit(collectives_timeout_ms),
                },
                qualification: check,
                bench_decode: bench_decode.map(|c| (c, steps)),
            };
            run_replay(&core, &options, json)
        }
        Command::Run {
            core,
            host,
            port,
            api_key,
            model,
            aliases,
            gpu_reserve,
            max_body_bytes,
            queue_capacity,
            device,
            rank_devices,
            collectives_timeout_ms,
            no_prefix_cache,
            message_checkpoints,
            idle_spin_ms,
        } => {
            helios::serve::run(helios::serve::RunOptions {
                core,
                host,
                port,
                api_key,
                device,
                rank_devices,
                collectives_wait_limit: Duration::from_millis(collectives_timeout_ms),
                gpu_reserve_mib: gpu_reserve,
                model,
                aliases,
                max_body_bytes,
                queue_capacity,
                prefix_cache: !no_prefix_cache,
                message_checkpoints,
                idle_spin: idle_spin_ms.map_or_else(
                    helios::serve::idle_spin_for_this_machine,
                    Duration::from_millis,
                ),
            })?;
            Ok(Outcome::Success)
        }
    }
}

/// `flare replay --collectives-timeout-ms MS` as a wait limit: 0 waits
/// forever (for runs a debugger or sanitizer slows down).
fn replay_wait_limit(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// `--gpu-reserve MIB` as a KV backing: absent, the prepared extent.
fn kv_backing(gpu_reserve_mib: Option<u64>) -> KvBacking {
    match gpu_reserve_mib {
        None => KvBacking::Prepared,
        Some(mib) => KvBacking::FromFreeMemory {
            reserve_bytes: mib.saturating_mul(1 << 20),
        },
    }
}

/// `flare replay --isolate`: load (every prepared KV page, which the
/// qualification covers), then the qualification node by node.
fn run_isolation(path: &Path, json: Option<PathBuf>, device: i32) -> Result<Outcome, HeliosError> {
    let report = isolate_core(path, device)?;
    let text = report.to_json().map_err(std::io::Error::other);
    let text = text.map_err(|source| HeliosError::WriteReport {
        path: json.clone().unwrap_or_default(),
        source,
    })?;
    let mut out = std::io::stdout().lock();
    let _ = match &report.failure {
        None => writeln!(
            out,
            "isolation: {} steps, {} nodes run alone, none faulted",
            report.steps_run, report.nodes_run
        ),
        Some(f) => writeln!(
            out,
            "isolation: step {} ({} at capacity {}), node {} after {} nodes of the step \
             faulted: {}\n{text}",
            f.step, f.kind, f.capacity, f.node.index, f.nodes_before, f.error
        ),
    };
    if let Some(path) = json {
        std::fs::write(&path, text + "\n")
            .map_err(|source| HeliosError::WriteReport { path, source })?;
    }
    Ok(if report.failure.is_some() {
        Outcome::Mismatch
    } else {
        Outcome::Success
    })
}

/// `flare replay`: [`check_core`] (load, then the qualification check,
/// always with `--check` and before the bench when the core has one and
/// every prepared KV page is backed, then the bench), printed.
fn run_replay(
    path: &Path,
    options: &CheckOptions,
    json: Option<PathBuf>,
) -> Result<Outcome, HeliosError> {
    let report = check_core(path, options)?;
    // As for inspect, a closed stdout is no failure of the replay.
    let _ = write!(std::io::stdout().lock(), "{}", replay::Text(&report));
    if let Some(path) = json {
        let written = report
            .to_json()
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(&path, text + "\n"));
        written.map_err(|source| HeliosError::WriteReport { path, source })?;
    }
    Ok(if report.passed() {
        Outcome::Success
    } else {
        Outcome::Mismatch
    })
}

const MIB: f64 = (1u64 << 20) as f64;

/// Bytes as MiB with two decimals.
struct Mib(u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.2} MiB", self.0 as f64 / MIB)
    }
}

/// An enum value's schema name without its prefix, in lower case:
/// `GRAPH_KIND_DECODE` -> `decode`.
fn short(name: &str) -> String {
    const PREFIXES: [&str; 6] = [
        "REGION_KIND_",
        "BUFFER_ROLE_",
        "GRAPH_KIND_",
        "TOOL_PARSER_",
        "REASONING_PARSER_",
        "SEMANTIC_",
    ];
    let stripped = PREFIXES
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    stripped.to_ascii_lowercase()
}

/// A sampling parameter's default and, when it may be changed, its range.
fn sampling_value(name: &str, value: String, range: Option<&FloatRange>) -> String {
    match range {
        Some(range) => format!("{name} {value} (range {}..{})", range.min, range.max),
        None => format!("{name} {value} (fixed)"),
    }
}

/// An identity string, or `-` when the exporter left it empty.
fn or_none(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

/// What `flare inspect` prints about a core.
struct Inspection<'a> {
    path: &'a Path,
    summary: &'a CoreSummary,
}

impl fmt::Display for Inspection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary;
        writeln!(f, "runtime core  {}", self.path.display())?;
        writeln!(
            f,
            "abi           {} (this engine supports up to {})",
            s.abi_version,
            helios::core::ENGINE_ABI
        )?;

        let id = &s.identity;
        writeln!(f, "identity")?;
        writeln!(f, "  engine_version        {}", or_none(&id.engine_version))?;
        writeln!(f, "  recipe                {}", or_none(&id.recipe))?;
        writeln!(
            f,
            "  checkpoint            {}",
            or_none(&id.checkpoint_fingerprint)
        )?;
        writeln!(
            f,
            "  config                {}",
            or_none(&id.config_fingerprint)
        )?;
        writeln!(
            f,
            "  tokenizer             {}",
            or_none(&id.tokenizer_fingerprint)
        )?;
        writeln!(
            f,
            "  device                {} (compute capability {}.{}, {} SMs)",
            id.device_name, id.compute_capability_major, id.compute_capability_minor, id.sm_count
        )?;
        writeln!(
            f,
            "  driver / cuda         {} / {}",
            id.driver_version, id.cuda_version
        )?;

        writeln!(
            f,
            "window        base {:#x}, size {}",
            s.window_base,
            Mib(s.window_size)
        )?;
        for region in &s.regions {
            writeln!(
                f,
                "  region {:<14} offset {:>12}  size {:>12}",
                short(region.kind.as_str_name()),
                Mib(region.offset).to_string(),
                Mib(region.size).to_string()
            )?;
        }
        if !s.peer_windows.is_empty() {
            writeln!(
                f,
                "ranks         {} (tensor parallel; rank 0's window above)",
                1 + s.peer_windows.len()
            )?;
            for (rank, base, size) in &s.peer_windows {
                writeln!(
                    f,
                    "  rank {rank:<3} window base {base:#x}, size {}",
                    Mib(*size)
                )?;
            }
        }

        writeln!(
            f,
            "buffers       {} buffers, {}",
            s.buffer_count,
            Mib(s.buffer_bytes)
        )?;
        for role in &s.buffers_by_role {
            writeln!(
                f,
                "  {:<20} {:>5} x  {:>12}",
                short(role.role.as_str_name()),
                role.count,
                Mib(role.bytes).to_string()
            )?;
        }
        writeln!(
            f,
            "images        {} kernel images, {}",
            s.image_count,
            Mib(s.image_bytes)
        )?;

        writeln!(f, "graphs")?;
        for kind in &s.graphs_by_kind {
            writeln!(
                f,
                "  {:<20} capacities {:?}, nodes {}",
                short(kind.kind.as_str_name()),
                kind.capacities,
                kind.nodes
            )?;
        }

        let c = &s.contract;
        writeln!(f, "contract")?;
        writeln!(f, "  page_size             {}", c.page_size)?;
        writeln!(f, "  max_concurrency       {}", c.max_concurrency)?;
        writeln!(f, "  context_limit         {}", c.context_limit)?;
        writeln!(f, "  prefill_chunk_size    {}", c.prefill_chunk_size)?;
        writeln!(f, "  decode_capacities     {:?}", c.decode_capacities)?;
        writeln!(f, "  prefill_capacities    {:?}", c.prefill_capacities)?;
        writeln!(
            f,
            "  kv_pages              {} of {} bytes",
            c.kv_pages, c.bytes_per_page
        )?;
        writeln!(f, "  snapshot_rows         {}", c.snapshot_rows)?;
        writeln!(
            f,
            "  continuation          {}",
            c.continuation.as_str_name()
        )?;
        writeln!(f, "  vocab_size            {}", c.vocab_size)?;
        writeln!(f, "  bindings              {}", c.bindings)?;
        writeln!(
            f,
            "  completion_fields     {}",
            c.completion_fields.join(", ")
        )?;

        let fe = &s.frontend;
        let sp = &fe.sampling;
        writeln!(f, "frontend")?;
        writeln!(
            f,
            "  tokenizer_json        {} bytes",
            fe.tokenizer_json_bytes
        )?;
        match fe.chat_template_bytes {
            0 => writeln!(f, "  chat_template         none")?,
            n => writeln!(f, "  chat_template         {n} bytes")?,
        }
        writeln!(f, "  eos_token_ids         {:?}", fe.eos_token_ids)?;
        writeln!(f, "  special_tokens        {}", fe.special_tokens)?;
        writeln!(f, "  sampling defaults")?;
        for line in [
            sampling_value(
                "temperature",
                sp.temperature.to_string(),
                sp.temperature_range.as_ref(),
            ),
            sampling_value("top_k", sp.top_k.to_string(), sp.top_k_range.as_ref()),
            sampling_value("top_p", sp.top_p.to_string(), sp.top_p_range.as_ref()),
            sampling_value("min_p", sp.min_p.to_string(), sp.min_p_range.as_ref()),
            sampling_value(
                "repetition_penalty",
                sp.repetition_penalty.to_string(),
                sp.repetition_penalty_range.as_ref(),
            ),
            sampling_value(
                "presence_penalty",
                sp.presence_penalty.to_string(),
                sp.presence_penalty_range.as_ref(),
            ),
            sampling_value(
                "frequency_penalty",
                sp.frequency_penalty.to_string(),
                sp.frequency_penalty_range.as_ref(),
            ),
        ] {
            writeln!(f, "    {line}")?;
        }
        let tool_markers = fe.tool_markers.as_ref();
        writeln!(
            f,
            "  tool_parser           {}{}",
            short(fe.tool_parser.as_str_name()),
            markers(&[
                tool_markers.and_then(|m| m.call_start.as_ref()),
                tool_markers.and_then(|m| m.call_end.as_ref()),
            ])
        )?;
        let reasoning_markers = fe.reasoning_markers.as_ref();
        writeln!(
            f,
            "  reasoning_parser      {}{}",
            short(fe.reasoning_parser.as_str_name()),
            markers(&[
                reasoning_markers.and_then(|m| m.start.as_ref()),
                reasoning_markers.and_then(|m| m.end.as_ref()),
            ])
        )
    }
}

/// A parser's markers as ` <tool_call> (token 641) </tool_call>`.
fn markers(markers: &[Option<&helios::core::proto::Marker>]) -> String {
    let mut text = String::new();
    for marker in markers.iter().flatten() {
        text.push_str(&format!(" {}", marker.text));
        if let Some(id) = marker.token_id {
            text.push_str(&format!(" (token {id})"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_defaults_to_loopback() {
        let cli = Cli::try_parse_from(["flare", "run", "tiny.core"]).unwrap();
        match cli.command {
            Command::Run {
                core,
                host,
                port,
                api_key,
                ..
            } => {
                assert_eq!(core, PathBuf::from("tiny.core"));
                assert_eq!(host, "127.0.0.1");
                assert_eq!(port, 8080);
                assert_eq!(api_key, None);
            }
            other => panic!("expected run, got {other:?}"),
        }
    }

    #[test]
    fn replay_requires_a_mode() {
        let err = Cli::try_parse_from(["flare", "replay", "tiny.core"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn replay_takes_one_mode() {
        let err = Cli::try_parse_from([
            "flare",
            "replay",
            "tiny.core",
            "--check",
            "--bench-decode",
            "4",
        ])
        .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn isolate_is_a_mode_of_its_own() {
        let cli = Cli::try_parse_from(["flare", "replay", "tiny.core", "--isolate"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Replay {
                isolate: true,
                check: false,
                ..
            }
        ));
        let err =
            Cli::try_parse_from(["flare", "replay", "c", "--isolate", "--check"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn the_idle_poll_is_the_machines_unless_given_and_is_bounded() {
        let run = |args: &[&str]| match Cli::try_parse_from(args).map(|cli| cli.command) {
            Ok(Command::Run { idle_spin_ms, .. }) => Ok(idle_spin_ms),
            Ok(other) => panic!("expected run, got {other:?}"),
            Err(error) => Err(error.kind()),
        };
        assert_eq!(run(&["flare", "run", "c"]), Ok(None));
        assert_eq!(
            run(&["flare", "run", "c", "--idle-spin-ms", "0"]),
            Ok(Some(0))
        );
        assert_eq!(
            run(&["flare", "run", "c", "--idle-spin-ms", "1000"]),
            Ok(Some(1000))
        );
        assert_eq!(
            run(&["flare", "run", "c", "--idle-spin-ms", "1001"]),
            Err(clap::error::ErrorKind::ValueValidation)
        );
    }

    #[test]
    fn message_checkpoints_default_to_the_capture_budget() {
        let run = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Run {
                message_checkpoints,
                ..
            } => message_checkpoints,
            other => panic!("expected run, got {other:?}"),
        };
        assert_eq!(run(&["flare", "run", "c"]), None);
        assert_eq!(
            run(&["flare", "run", "c", "--message-checkpoints", "0"]),
            Some(0)
        );
        assert!(Cli::try_parse_from(["flare", "run", "c", "--message-checkpoints", "-1"]).is_err());
    }

    #[test]
    fn a_replay_waits_forever_only_when_told_0() {
        assert_eq!(replay_wait_limit(0), None);
        assert_eq!(replay_wait_limit(1), Some(Duration::from_millis(1)));
        let cli = Cli::try_parse_from(["flare", "replay", "c", "--check"]).unwrap();
        match cli.command {
            Command::Replay {
                collectives_timeout_ms,
                ..
            } => assert_eq!(
                replay_wait_limit(collectives_timeout_ms),
                Some(COLLECTIVES_WAIT_LIMIT)
            ),
            other => panic!("expected replay, got {other:?}"),
        }
    }

    #[test]
    fn a_served_collectives_wait_is_bounded_below_the_teardown_wait() {
        // A rank releases its memory at most 30 s after it drained; a peer's
        // collective still polling it must have trapped by then.
        let timeout = |ms: &str| {
            Cli::try_parse_from(["flare", "run", "c", "--collectives-timeout-ms", ms]).map(|cli| {
                match cli.command {
                    Command::Run {
                        collectives_timeout_ms,
                        ..
                    } => collectives_timeout_ms,
                    other => panic!("expected run, got {other:?}"),
                }
            })
        };
        assert_eq!(timeout("20000").unwrap(), 20_000);
        for refused in ["0", "20001"] {
            let err = timeout(refused).unwrap_err().to_string();
            assert!(err.contains("is not in 1..=20000"), "{err}");
        }
    }

    #[test]
    fn bench_decode_defaults_to_256_steps() {
        let cli = Cli::try_parse_from(["flare", "replay", "c", "--bench-decode", "4"]).unwrap();
        match cli.command {
            Command::Replay {
                check,
                bench_decode,
                steps,
                json,
                device,
                ..
            } => {
                assert!(!check);
                assert_eq!(bench_decode, Some(4));
                assert_eq!(steps.get(), 256);
                assert_eq!(json, None);
                assert_eq!(device, 0);
            }
            other => panic!("expected replay, got {other:?}"),
        }
    }

    #[test]
    fn a_gpu_reserve_needs_the_bench() {
        let cli = Cli::try_parse_from([
            "flare",
            "replay",
            "c",
            "--bench-decode",
            "4",
            "--gpu-reserve",
            "1024",
        ])
        .unwrap();
        match cli.command {
            Command::Replay { gpu_reserve, .. } => {
                assert_eq!(gpu_reserve, Some(1024));
                assert_eq!(
                    kv_backing(gpu_reserve),
                    KvBacking::FromFreeMemory {
                        reserve_bytes: 1 << 30
                    }
                );
            }
            other => panic!("expected replay, got {other:?}"),
        }
        assert_eq!(kv_backing(None), KvBacking::Prepared);
        for mode in ["--check", "--isolate"] {
            let err = Cli::try_parse_from(["flare", "replay", "c", mode, "--gpu-reserve", "1"])
                .unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{mode}"
            );
        }
    }

    #[test]
    fn steps_need_the_bench_and_are_positive() {
        for args in [
            &["flare", "replay", "c", "--check", "--steps", "8"][..],
            &[
                "flare",
                "replay",
                "c",
                "--bench-decode",
                "1",
                "--steps",
                "0",
            ][..],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn run_refuses_an_unreadable_core_before_binding() {
        let cli = Cli::try_parse_from(["flare", "run", "missing.core", "--port", "9000"]).unwrap();
        let err = execute(cli.command).unwrap_err();
        assert!(
            matches!(err, HeliosError::Serve(helios::serve::ServeError::Core(_))),
            "{err}"
        );
    }

    #[test]
    fn replay_reports_an_unreadable_core_before_any_cuda_work() {
        let cli =
            Cli::try_parse_from(["flare", "replay", "/nonexistent/tiny.core", "--check"]).unwrap();
        let err = execute(cli.command).unwrap_err();
        assert!(matches!(
            err,
            HeliosError::Replay(helios::replay::ReplayError::Core(
                helios::core::CoreError::Io { .. }
            ))
        ));
    }

    #[test]
    fn inspect_reports_an_unreadable_manifest() {
        let cli = Cli::try_parse_from(["flare", "inspect", "/nonexistent/tiny.core"]).unwrap();
        let err = execute(cli.command).unwrap_err();
        assert!(matches!(
            err,
            HeliosError::Core(helios::core::CoreError::Io { .. })
        ));
    }

    #[test]
    fn inspection_lists_the_catalog() {
        let core = helios::core::ValidCore::new(helios::core::sample::tiny_core()).unwrap();
        let summary = core.summary();
        let text = Inspection {
            path: Path::new("tiny.core"),
            summary: &summary,
        }
        .to_string();
        assert!(text.contains("decode_capacities     [1, 2, 4]"), "{text}");
        assert!(text.contains("prefill_capacities    [128, 256]"), "{text}");
        assert!(text.contains("region kv_pages"), "{text}");
        assert!(text.contains("32.00 MiB"), "{text}");
        assert!(text.contains("eos_token_ids         [2]"), "{text}");
        assert!(text.contains("tool_parser           none"), "{text}");
    }

    #[test]
    fn markers_show_their_token_when_they_are_one() {
        use helios::core::proto::Marker;
        let start = Marker {
            text: "<think>".to_owned(),
            token_id: Some(7),
        };
        let end = Marker {
            text: "</think>".to_owned(),
            token_id: None,
        };
        assert_eq!(
            markers(&[Some(&start), Some(&end), None]),
            " <think> (token 7) </think>"
        );
    }
}
