//! `flare`: the command-line front end of Flare.
//!
//! All behaviour lives in the `helios` library; this binary only parses the
//! command line, dispatches to it and turns its outcome into an exit status:
//! 0 success, 1 a replayed digest differs, 2 an error.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc, not glibc's malloc: on the tool chats of `bench/http_overhead.py
/// --tool-chats`, glibc's allocator took a fifth of the serving path's CPU, and the
/// fake server's TTFT fell about a fifth with mimalloc
/// (`bench/results/issue23/2026-12-06l-cpu-allocator/`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status for a check that ran and found a difference.
const EXIT_MISMATCH: u8 = 1;
/// Exit status for a command that was understood but could not be carried out.
const EXIT_FAILURE: u8 = 2;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::execute(cli.command) {
        Ok(cli::Outcome::Success) => ExitCode::SUCCESS,
        Ok(cli::Outcome::Mismatch) => ExitCode::from(EXIT_MISMATCH),
        Err(err) => {
            eprintln!("flare: error: {err}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
