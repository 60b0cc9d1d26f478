//! The command line: one file per subcommand, each with its flags (an `Args`
//! struct) and its `run`. Flags belong to the commands they mean something
//! for; an unknown flag is an error (one line, exit 2).
//!
//! Shared flag groups: [`ShmFlag`] (where the segments are), [`NvmlFlag`]
//! (whether and how often NVML is read) and [`dashboard::UiFlags`] (how the
//! dashboard looks), each flattened into the commands that use it.
//!
//! Every number a flag takes is one of the types of [`value`] (checked while
//! parsing: one line naming the flag and the accepted range, exit 2), and
//! everything a command prints for its reader goes through [`out`] (a
//! closed pipe ends the output quietly).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub(crate) mod advise;
pub(crate) mod agent;
pub(crate) mod attach;
pub(crate) mod completions;
pub(crate) mod config;
pub(crate) mod dashboard;
pub(crate) mod demo;
pub(crate) mod diff;
pub(crate) mod doctor;
pub(crate) mod empty_cache;
pub(crate) mod export;
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

#[derive(Debug, Parser)]
#[command(
    name = "vramscope",
    version,
    about = "GPU memory inside PyTorch processes, live",
    long_about = "GPU memory inside PyTorch processes, live.\n\n\
                  Without a subcommand, opens the dashboard on every process of this user \
                  (instrumented with `vramscope run`) and every GPU process NVML reports.",
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub dashboard: dashboard::Args,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a simulated training job (no GPU needed) and watch it.
    Demo(demo::Args),
    /// Print the state of every GPU and process once.
    Snapshot(snapshot::Args),
    /// Replay allocation requests under any allocator configuration.
    Sim(sim::Args),
    /// Which allocator setting a recorded job should use: its requests
    /// replayed under each candidate, best first.
    Advise(advise::Args),
    /// Compare two runs (recordings or snapshot files): peaks, steady
    /// state, by phase, role and module, and where they part; a CI gate
    /// with --fail-over.
    Diff(diff::Args),
    /// Run a command (e.g. `python train.py`) with the PyTorch agent injected;
    /// the script needs no change.
    #[command(trailing_var_arg = true)]
    Run(run::Args),
    /// The embedded PyTorch agent.
    Agent(agent::Args),
    /// Instrument a running PyTorch job (no restart): from then on it
    /// runs the agent as under `vramscope run`.
    Attach(attach::Args),
    /// Check and explain every requirement (NVML, segment directory, compiler,
    /// torch and CUDA headers), with what to do about each missing one.
    Doctor(doctor::Args),
    /// Record NVML readings and every process's events to a file, until Ctrl-C.
    Record(record::Args),
    /// Replay a recording (see `crates/core/src/recording.rs` for the format).
    Replay(replay::Args),
    /// Open a PyTorch memory snapshot file (torch.cuda.memory._dump_snapshot)
    /// in the dashboard, or print it as JSON.
    Open(open::Args),
    /// Write a recording as a PyTorch memory snapshot file, for PyTorch's
    /// own viewer and torch.cuda.memory._memory_viz.
    Export(export::Args),
    /// Ask a process to release its cached memory (torch.cuda.empty_cache()).
    EmptyCache(empty_cache::Args),
    /// Ask a process to capture the Python stacks of its allocations for
    /// the next N steps (code locations in the dashboard and snapshot --json).
    Stacks(stacks::Args),
    /// List this user's segments (instrumented processes) and their health.
    Rings(rings::Args),
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions(completions::Args),
    /// Print the man page (roff), subcommands included.
    Man(completions::ManArgs),
    /// Watch many machines through a Prometheus that scrapes their
    /// `vramscope serve` exporters: nodes, GPUs, jobs, one node's history.
    ///
    /// The keys are the dashboard's for the same things (`?` lists them):
    /// Tab nodes/jobs, Up/Down (j/k) select, Enter open, Esc back, o/O sort
    /// column/reverse, / filter, r refresh now, L legend, S screenshot, q
    /// quit.
    Fleet(fleet::Args),
    /// Serve every GPU's and instrumented process's figures as Prometheus
    /// metrics (read-only; loopback unless --listen says otherwise).
    Serve(serve::Args),
}

/// A command's verdict that is not a failure to run: exit with this status,
/// its line already printed (`diff --fail-over`).
#[derive(Debug)]
pub(crate) struct ExitStatus(pub u8);

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}

impl std::error::Error for ExitStatus {}

/// Runs the command line's job.
pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => dashboard::run(cli.dashboard),
        Some(Command::Demo(a)) => demo::run(a),
        Some(Command::Snapshot(a)) => snapshot::run(a),
        Some(Command::Sim(a)) => sim::run(a),
        Some(Command::Advise(a)) => advise::run(a),
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
        Some(Command::Completions(a)) => completions::run(a),
        Some(Command::Man(a)) => completions::man(a),
        Some(Command::Serve(a)) => serve::run(a),
        Some(Command::Fleet(a)) => fleet::run(a),
    }
}

/// Where the segments of instrumented processes are.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ShmFlag {
    /// Directory of the shared-memory segments [env: VRAMSCOPE_SHM_DIR; default: /dev/shm]
    #[arg(long, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
}

impl ShmFlag {
    /// The directory in force: the flag, else the environment, else `/dev/shm`.
    pub(crate) fn dir(&self) -> PathBuf {
        vramscope_wire::ring::discover::segment_dir(self.shm_dir.as_deref())
    }
}

/// The instrumented process a command talks to through its segment's
/// control block (`empty-cache`, `stacks`), and how long to wait.
#[derive(Debug, clap::Args)]
pub(crate) struct ProcessTarget {
    /// The process id (as this machine sees it, or as the process sees itself).
    pub pid: u32,
    /// Seconds to wait for the answer.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "10",
        value_name = "SECS"
    )]
    timeout: value::Seconds,
    #[command(flatten)]
    shm: ShmFlag,
}

impl ProcessTarget {
    /// Sends `command` to the process and waits for the answer: the
    /// segment is found in the directory by its producer's pid and mapped
    /// once; nothing else is read.
    pub(crate) fn ask(
        &self,
        command: vramscope_wire::ring::Command,
    ) -> anyhow::Result<vramscope_wire::ring::Outcome> {
        let (pid, dir) = (self.pid, self.shm.dir());
        let Some(client) = vramscope_wire::ring::client::Client::find(&dir, pid)? else {
            anyhow::bail!(
                "process {pid} has no vramscope agent segment in {} (start it with `vramscope run -- ...`, or see `vramscope rings`)",
                dir.display()
            )
        };
        Ok(client.send(command, self.timeout.duration())?)
    }
}

/// What a live collector reads: the segments, and NVML how often.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CollectFlags {
    #[command(flatten)]
    pub shm: ShmFlag,
    #[command(flatten)]
    pub nvml: NvmlFlag,
    #[command(flatten)]
    pub interval: IntervalFlag,
}

impl CollectFlags {
    /// The collector's configuration.
    pub(crate) fn config(&self) -> vramscope_collect::Config {
        collect_config(&self.shm, &self.nvml, Some(&self.interval))
    }
}

/// Whether NVML is read.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct NvmlFlag {
    /// Do not read NVML.
    #[arg(long)]
    pub no_nvml: bool,
}

/// How often NVML is read.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct IntervalFlag {
    /// NVML poll period in milliseconds (at least 100).
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "1000",
        value_name = "MS"
    )]
    pub interval: value::Millis<100>,
}

/// The collector's configuration from the flags a command has.
pub(crate) fn collect_config(
    shm: &ShmFlag,
    nvml: &NvmlFlag,
    interval: Option<&IntervalFlag>,
) -> vramscope_collect::Config {
    let mut cfg = vramscope_collect::Config::new(shm.dir());
    cfg.nvml = !nvml.no_nvml;
    if let Some(i) = interval {
        cfg.nvml_interval = i.interval.duration();
    }
    cfg
}

/// A tokio runtime for a headless command's collector.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    vramscope_collect::runtime().context("starting the collector's runtime")
}
