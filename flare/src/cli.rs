//! Command-line definition and dispatch.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
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
    /// Serve a runtime core over HTTP.
    ///
    /// Loads the runtime core at CORE and serves it over HTTP, streaming
    /// generated tokens with server-sent events.
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
    Inspect {
        /// Path to the runtime core exported by Ignition.
        core: PathBuf,
    },
    /// Rebuild a runtime core's graphs and check their replay.
    ///
    /// Rebuilds every graph recorded in the core and compares its replay
    /// bitwise with the replay Ignition recorded in Python.
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
/// No subcommand can succeed yet: every one needs a loaded runtime core, and
/// the runtime-core loader is not part of this build.
pub fn execute(command: Command) -> Result<(), HeliosError> {
    match command {
        Command::Run { core, .. } | Command::Inspect { core } | Command::Replay { core, .. } => {
            Err(HeliosError::CoreUnavailable { path: core })
        }
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
    fn every_subcommand_reports_the_missing_loader() {
        for args in [
            &["flare", "run", "tiny.core", "--port", "9000"][..],
            &["flare", "inspect", "tiny.core"][..],
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
}
