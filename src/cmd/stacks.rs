//! `vramscope stacks PID`: asks an instrumented process to capture the
//! Python stacks of its allocations for the next steps (control command 5,
//! FORMAT 1.1), then to stop by itself; prints what it granted.
use anyhow::{bail, Context, Result};

use vramscope_ui::popup::capture_line;
use vramscope_wire::ring::{Command, Status};

use super::common::ProcessTarget;
use super::value::{CaptureSteps, StackDepth};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Steps to capture stacks for (0 stops a capture under way).
    #[arg(long, default_value = "10", value_name = "N")]
    steps: CaptureSteps,
    /// Frames kept per stack, innermost first (0: the producer's default).
    #[arg(long, default_value = "0", value_name = "FRAMES")]
    depth: StackDepth,
    #[command(flatten)]
    target: ProcessTarget,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let pid = args.target.pid;
    let steps = args.steps.get();
    let command = Command::CaptureStacks {
        steps,
        depth: args.depth.get(),
    };
    let out = (args.target)
        .ask(command)
        .with_context(|| format!("asking process {pid} to capture stacks"))?;
    match out.status {
        Status::Ok => super::out::line(&format!(
            "process {pid}: {}",
            capture_line(steps, out.result0, out.result1)
        )),
        Status::Unsupported => {
            bail!("process {pid} does not capture stacks (its producer is older than FORMAT 1.1)")
        }
        s => bail!("process {pid} answered {s:?}: no stacks are captured"),
    }
}
