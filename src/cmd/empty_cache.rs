//! `vramscope empty-cache PID`: asks an instrumented process to run
//! `torch.cuda.empty_cache()` and prints what was released.
use anyhow::{bail, Context, Result};

use vramscope_text::format::bytes;
use vramscope_wire::ring::{Command, Status};

use super::common::ProcessTarget;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    target: ProcessTarget,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let pid = args.target.pid;
    let out = (args.target)
        .ask(Command::EmptyCache { device: None })
        .with_context(|| format!("asking process {pid} to empty its cache"))?;
    match out.status {
        Status::Ok => {
            let (before, after) = (out.result0, out.result1);
            if let Some(why) = implausible(before, after) {
                bail!(
                    "process {pid} answered an implausible result: reserved {before} B -> {after} B ({why}); the cache may or may not have been emptied"
                );
            }
            super::out::line(&format!(
                "process {pid}: released {} (reserved {} -> {})",
                bytes(before - after),
                bytes(before),
                bytes(after)
            ))
        }
        s => bail!("process {pid} answered {s:?}: the cache was not emptied"),
    }
}

/// More reserved memory than any device has (1 PiB).
const ABSURD: u64 = 1 << 50;

/// Why an empty-cache answer (reserved bytes before, after) cannot be true.
fn implausible(before: u64, after: u64) -> Option<&'static str> {
    if after > before {
        Some("more reserved after emptying the cache than before")
    } else if before > ABSURD {
        Some("more than 1 PiB reserved")
    } else {
        None
    }
}
