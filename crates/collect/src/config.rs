//! How the collector runs: where the segments are, how often NVML is read.

use std::path::PathBuf;
use std::time::Duration;

/// How the collector runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub shm_dir: PathBuf,
    /// NVML poll period (default 1 s).
    pub nvml_interval: Duration,
    /// Ring drain period (default 50 ms).
    pub ring_interval: Duration,
    /// Segment directory scan period (default 500 ms).
    pub discover_interval: Duration,
    /// How long an exited process stays visible (default 60 s).
    pub exited_linger: Duration,
    /// Read NVML at all.
    pub nvml: bool,
    /// Remove segments left by dead processes of this user.
    pub clean_stale: bool,
    /// Send nothing to any process (`--readonly`): no resync snapshots,
    /// and a [`Live`](crate::collector::Live) whose [`Live::refusal`](crate::collector::Live::refusal) refuses every command.
    pub readonly: bool,
    /// Segments already present at the first scan are read from their
    /// oldest record (the dashboard's way: it shows what the rings still
    /// hold); when false, from their head, so only what is written from
    /// now on is read (`record` without `--backlog`), and the model
    /// anchors on a snapshot it asks for (FORMAT.md, "Attaching
    /// mid-run"). Segments that appear later are always read from their
    /// oldest record: their whole life is after the start; so are those
    /// whose producer takes no commands (nothing could ask it for the
    /// snapshot to anchor on; its backlog may hold one).
    pub backlog: bool,
}

impl Config {
    pub fn new(shm_dir: PathBuf) -> Self {
        Config {
            shm_dir,
            nvml_interval: Duration::from_secs(1),
            ring_interval: Duration::from_millis(50),
            discover_interval: Duration::from_millis(500),
            exited_linger: Duration::from_secs(60),
            nvml: true,
            clean_stale: true,
            readonly: false,
            backlog: true,
        }
    }
}
