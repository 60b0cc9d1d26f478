//! `vramscope empty-cache PID`: asks an instrumented process to run
//! `torch.cuda.empty_cache()` and prints what was released.
use std::time::Duration;

use anyhow::{bail, Context, Result};

use vramscope::collect::Collector;
use vramscope::ring::{Command, Status};
use vramscope::ui::format::bytes;

use super::ShmFlag;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The process id (as this machine sees it, or as the process sees itself).
    pid: u32,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    #[command(flatten)]
    shm: ShmFlag,
}

pub fn run(args: Args) -> Result<()> {
    let pid = args.pid;
    let dir = args.shm.dir();
    let mut cfg = vramscope::collect::Config::new(dir.clone());
    cfg.nvml = false;
    cfg.clean_stale = false;
    let mut collector = Collector::new(cfg);
    collector.step();
    let Some(key) = collector
        .find_pid(pid)
        .filter(|k| collector.hub().segment_of(*k).is_some())
    else {
        bail!(
            "process {pid} has no vramscope agent segment in {} (start it with `vramscope run -- ...`, or see `vramscope rings`)",
            dir.display()
        )
    };
    let ask = collector.requester().request(
        key,
        Command::EmptyCache { device: None },
        Duration::from_secs_f64(args.timeout),
    );
    let out = super::runtime()?
        .block_on(ask)
        .with_context(|| format!("asking process {pid} to empty its cache"))?;
    match out.status {
        Status::Ok => {
            println!(
                "process {pid}: released {} (reserved {} -> {})",
                bytes(out.result0.saturating_sub(out.result1)),
                bytes(out.result0),
                bytes(out.result1)
            );
            Ok(())
        }
        s => bail!("process {pid} answered {s:?}: the cache was not emptied"),
    }
}
