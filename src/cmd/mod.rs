//! The command line: one file per subcommand, each with its flags (an `Args`
//! struct) and its `run`. Flags belong to the commands they mean something
//! for; an unknown flag is an error (one line, exit 2).
//!
//! Shared flag groups: [`ShmFlag`](common::ShmFlag) (where the segments are), [`NvmlFlag`](common::NvmlFlag)
//! (whether and how often NVML is read) and [`dashboard::UiFlags`] (how the
//! dashboard looks), each flattened into the commands that use it.
//!
//! Every number a flag takes is one of the types of [`value`] (checked while
//! parsing: one line naming the flag and the accepted range, exit 2), and
//! everything a command prints for its reader goes through [`out`] (a
//! closed pipe ends the output quietly).

pub(crate) mod advise;
pub(crate) mod agent;
pub(crate) mod attach;
mod cli;
mod common;
pub(crate) mod completions;
pub(crate) mod config;
pub(crate) mod dashboard;
pub(crate) mod demo;
pub(crate) mod diff;
pub(crate) mod doctor;
pub(crate) mod empty_cache;
pub(crate) mod export;
pub(crate) mod fit;
pub(crate) mod fleet;
pub(crate) mod open;
pub(crate) mod out;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod rings;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod sim;
pub(crate) mod snapshot;
pub(crate) mod stacks;
pub(crate) mod value;

pub(crate) use cli::{Cli, Command};
pub(crate) use common::ExitStatus;

/// Runs the command line's job.
pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    use clap::CommandFactory;
    match cli.command {
        None => dashboard::run(cli.dashboard),
        Some(Command::Demo(a)) => demo::run(a),
        Some(Command::Snapshot(a)) => snapshot::run(a),
        Some(Command::Sim(a)) => sim::run(a),
        Some(Command::Advise(a)) => advise::run(a),
        Some(Command::Fit(a)) => fit::run(a),
        Some(Command::Diff(a)) => diff::run(a),
        Some(Command::Run(a)) => run::run(a),
        Some(Command::Agent(a)) => agent::run(a),
        Some(Command::Attach(a)) => attach::run(a),
        Some(Command::Doctor(a)) => doctor::run(a),
        Some(Command::Record(a)) => record::run(a),
        Some(Command::Replay(a)) => replay::run(a),
        Some(Command::Open(a)) => open::run(a),
        Some(Command::Export(a)) => export::run(a),
        Some(Command::EmptyCache(a)) => empty_cache::run(a),
        Some(Command::Stacks(a)) => stacks::run(a),
        Some(Command::Rings(a)) => rings::run(a),
        Some(Command::Completions(a)) => completions::run(a, Cli::command()),
        Some(Command::Man(a)) => completions::man(a, Cli::command()),
        Some(Command::Serve(a)) => serve::run(a),
        Some(Command::Fleet(a)) => fleet::run(a),
    }
}
