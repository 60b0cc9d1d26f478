//! The `vramscope` binary: parses the command line and hands off to the
//! subcommand (`src/cmd/`). A bad command line is one line on stderr and
//! exit 2 (every number a flag takes is checked then: `src/cmd/value.rs`);
//! a failure is its error and causes on one line and exit 1; a closed
//! standard output is the end of the output, exit 0 (`src/cmd/out.rs`).
use std::process::ExitCode;

use clap::Parser;

mod cmd;

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = match cmd::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if cmd::out::is_closed(&e) => ExitCode::SUCCESS,
        Err(e) if e.is::<cmd::ExitStatus>() => {
            ExitCode::from(e.downcast_ref::<cmd::ExitStatus>().map_or(1, |s| s.0))
        }
        Err(e) => {
            vramscope_text::stderr_line(format_args!("vramscope: {}", message(&e)));
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
    let line = one_line(&text);
    // "Usage: vramscope doctor [OPTIONS]" names the command the help is for;
    // an invalid value has no usage block: the first argument that is a
    // subcommand's name does.
    let command: Vec<String> = match text.lines().find_map(|l| l.trim().strip_prefix("Usage: ")) {
        Some(usage) => usage
            .split_whitespace()
            .take_while(|w| !w.starts_with(['[', '<', '-']))
            .map(str::to_string)
            .collect(),
        None => {
            use clap::CommandFactory;
            let cli = cmd::Cli::command();
            let sub = std::env::args().skip(1).find(|a| {
                cli.get_subcommands()
                    .any(|c| c.get_name() == a || c.get_all_aliases().any(|n| n == a))
            });
            std::iter::once("vramscope".to_string())
                .chain(sub)
                .collect()
        }
    };
    vramscope_text::stderr_line(format_args!(
        "vramscope: {line} (see `{} --help`)",
        command.join(" ")
    ));
    ExitCode::from(2)
}

/// clap's error on one line: its first line, the lines that continue it
/// (the arguments a "required arguments were not provided" names), and its
/// tips ("a similar subcommand exists: 'snapshot'") as "did you mean".
fn one_line(text: &str) -> String {
    let mut lines = text.lines().skip_while(|l| l.trim().is_empty());
    let first = lines.next().unwrap_or("invalid command line");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_string();
    let mut continued = Vec::new();
    for l in lines.by_ref() {
        if l.trim().is_empty() {
            break;
        }
        continued.push(l.trim());
    }
    if !continued.is_empty() {
        line = format!("{} {}", line.trim_end(), continued.join(", "));
    }
    let tips: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tip: "))
        .filter(|t| t.contains("similar"))
        .collect();
    for tip in tips {
        // "a similar subcommand exists: 'snapshot'" -> did you mean 'snapshot'?
        let what = tip.rsplit_once(": ").map_or(tip, |(_, w)| w);
        line.push_str(&format!("; did you mean {what}?"));
    }
    line
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

/// A safety net for output not written through `cmd::out` (the standard
/// library's `println!` panics on a closed pipe): that panic ends the
/// program quietly with status 0, as `cmd::out` would. Any other panic
/// goes to the default hook.
fn quiet_on_closed_stdout() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(0);
        }
        previous(info);
    }));
}
