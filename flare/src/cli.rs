//! Command-line definition and dispatch.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use helios::core::proto::FloatRange;
use helios::core::CoreSummary;
use helios::HeliosError;

/// Flare: serve a runtime core prepared by Ignition, without Python.
#[derive(Debug, Parser)]
#[command(name = "flare", version = helios::ENGINE_VERSION, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve a runtime core over HTTP (not in this build yet).
    ///
    /// Loads the runtime core at CORE and serves it over HTTP, streaming
    /// generated tokens with server-sent events. This build cannot load a core
    /// onto the GPU yet: it exits with status 2.
    Run {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
        /// Address or host name to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// TCP port to listen on.
        #[arg(long, default_value_t = 8080)]
        port: u16,
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
    /// Rebuild a runtime core's graphs and check their replay (not in this build yet).
    ///
    /// Rebuilds every graph recorded in the core and compares its replay
    /// bitwise with the replay Ignition recorded in Python. This build cannot
    /// rebuild graphs yet: it exits with status 2.
    Replay {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
        /// Compare the replay bitwise with the recorded Python replay
        /// (currently the only replay mode, so it must be given).
        #[arg(long, required = true)]
        check: bool,
    },
}

/// Carries out one subcommand.
///
/// `inspect` loads and validates the core's manifest (no CUDA) and prints it.
/// `run` and `replay` cannot succeed yet: they need the CUDA side of the
/// runtime-core loader, which is not part of this build.
pub fn execute(command: Command) -> Result<(), HeliosError> {
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
            Ok(())
        }
        Command::Run { core, .. } | Command::Replay { core, .. } => {
            Err(HeliosError::CoreUnavailable { path: core })
        }
    }
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
        writeln!(
            f,
            "  tool_parser           {}",
            short(fe.tool_parser.as_str_name())
        )?;
        writeln!(
            f,
            "  reasoning_parser      {}",
            short(fe.reasoning_parser.as_str_name())
        )
    }
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
            Command::Run { core, host, port } => {
                assert_eq!(core, PathBuf::from("tiny.core"));
                assert_eq!(host, "127.0.0.1");
                assert_eq!(port, 8080);
            }
            other => panic!("expected run, got {other:?}"),
        }
    }

    #[test]
    fn replay_requires_check() {
        let err = Cli::try_parse_from(["flare", "replay", "tiny.core"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn run_and_replay_report_the_missing_loader() {
        for args in [
            &["flare", "run", "tiny.core", "--port", "9000"][..],
            &["flare", "replay", "tiny.core", "--check"][..],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let err = execute(cli.command).unwrap_err();
            assert!(matches!(
                err,
                HeliosError::CoreUnavailable { ref path } if path == &PathBuf::from("tiny.core")
            ));
        }
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
}
