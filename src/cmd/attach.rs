//! `vramscope attach PID`: the agent put into a running Python process
//! (`crates/collect/src/attach/`), then one line saying what mode it is in. Already
//! instrumented: that line, exit 0, nothing touched. Any refusal or
//! failure: one line, exit 1.
use super::common::ShmFlag;
use super::value::Seconds;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The process id of the running Python job.
    pid: u32,
    /// Seconds to wait for the job to run the agent (it runs when the
    /// job's main thread next runs Python code).
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "30",
        value_name = "SECS"
    )]
    timeout: Seconds,
    #[command(flatten)]
    shm: ShmFlag,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let opts = vramscope_collect::attach::Options {
        shm_dir: args.shm.shm_dir.clone(),
        timeout: args.timeout.duration(),
    };
    let (who, outcome) = vramscope_collect::attach::attach(args.pid, &opts)?;
    super::out::line(&outcome.line(&who))
}
