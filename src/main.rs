//! The `vramscope` binary: parses the command line and hands off to the
//! subcommand (`src/cmd/`). A bad command line is one line on stderr and
//! exit 2; a failure is its error and causes on one line and exit 1.
use std::process::ExitCode;

use clap::Parser;

mod cmd;

fn main() -> ExitCode {
    let cli = match cmd::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramscope: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// `--help` and `--version` print as clap writes them; any other parse error
/// is its first line, without clap's usage block, and exit 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
    }
    let text = e.render().to_string();
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid command line");
    let line = line.strip_prefix("error: ").unwrap_or(line);
    // "Usage: vramscope doctor [OPTIONS]" names the command the help is for.
    let command: Vec<&str> = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .unwrap_or("vramscope")
        .split_whitespace()
        .take_while(|w| !w.starts_with(['[', '<', '-']))
        .collect();
    eprintln!("vramscope: {line} (see `{} --help`)", command.join(" "));
    ExitCode::from(2)
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
