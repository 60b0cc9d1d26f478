//! The `vramscope` binary: parses the command line and hands off to the
//! library; errors are printed once, with their causes, and exit 1.
use std::process::ExitCode;

use clap::Parser;

mod cli;
mod record;
mod report;
mod rings;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramscope: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text the
/// message already carries (errors that name their file and their cause).
fn message(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}
