//! The whole command line: the global flags and one variant per
//! subcommand, each carrying that subcommand's own `Args`.

use clap::{Parser, Subcommand};

use super::{
    advise, agent, attach, completions, dashboard, demo, diff, doctor, empty_cache, export, fit,
    fleet, open, record, replay, rings, run, serve, sim, snapshot, stacks,
};

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
    /// Will it fit: a recorded job's peak memory at other batch sizes, and
    /// the largest batch that fits a limit (one recording, or two at two
    /// batch sizes).
    Fit(fit::Args),
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
    /// Replay a recording made by `vramscope record`: its final state, the
    /// dashboard on it, or a step diff.
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
