//! What several subcommands share: the flag groups flattened into them
//! (where the segments are, how NVML is read, which process), the
//! collector's configuration and runtime, and an exit status that is a
//! verdict rather than a failure.

use std::path::PathBuf;

use super::value;

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
