//! `flare`: the command-line front end of Flare.
//!
//! All behaviour lives in the `helios` library; this binary only parses the
//! command line, dispatches to it and turns errors into an exit status.

mod cli;

use std::process::ExitCode;

use clap::Parser;

/// Exit status for a command that was understood but could not be carried out.
const EXIT_FAILURE: u8 = 2;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("flare: error: {err}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}
