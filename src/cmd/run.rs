//! `vramscope run -- CMD...`: a command with the PyTorch agent injected.
use std::ffi::OsString;

use super::common::ShmFlag;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    shm: ShmFlag,
    /// The command and its arguments.
    #[arg(required = true, allow_hyphen_values = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    // `exec` only returns on failure.
    Err(vramscope_collect::agent::exec(
        &args.command,
        args.shm.shm_dir.as_deref(),
    ))
}
