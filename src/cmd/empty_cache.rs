//! `vramscope empty-cache PID`: asks an instrumented process to run
//! `torch.cuda.empty_cache()` and prints what was released.
use anyhow::{bail, Context, Result};

use vramscope::ring::client::Client;
use vramscope::ring::{Command, Outcome, Status};
use vramscope::text::format::bytes;

use super::value::Seconds;
use super::ShmFlag;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process id (as this machine sees it, or as the process sees itself).
    pid: u32,
    /// Seconds to wait for the answer.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "10",
        value_name = "SECS"
    )]
    timeout: Seconds,
    #[command(flatten)]
    shm: ShmFlag,
}

pub fn run(args: Args) -> Result<()> {
    let pid = args.pid;
    let out = ask(
        pid,
        &args.shm,
        Command::EmptyCache { device: None },
        args.timeout,
    )
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

/// Sends `command` to the instrumented process `pid` through its segment's
/// control block and waits for the answer (`empty-cache`, `stacks`): the
/// segment is found in the directory by its producer's pid and mapped
/// once; nothing else is read.
pub(super) fn ask(pid: u32, shm: &ShmFlag, command: Command, timeout: Seconds) -> Result<Outcome> {
    let dir = shm.dir();
    let Some(client) = Client::find(&dir, pid)? else {
        bail!(
            "process {pid} has no vramscope agent segment in {} (start it with `vramscope run -- ...`, or see `vramscope rings`)",
            dir.display()
        )
    };
    Ok(client.send(command, timeout.duration())?)
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
