//! Command-line interface: one subcommand per job; each hands off to the library.
use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use vramscope::ring::discover;

#[derive(Debug, Parser)]
#[command(
    name = "vramscope",
    version,
    about = "GPU memory inside PyTorch processes, live"
)]
pub struct Cli {
    /// Directory of the shared-memory segments [env: VRAMSCOPE_SHM_DIR; default: /dev/shm]
    #[arg(long, global = true, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List this user's segments (instrumented processes) and their health.
    Rings {
        /// Remove segments whose process is gone.
        #[arg(long)]
        clean: bool,
        /// One JSON object per segment instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: Cli) -> Result<()> {
    let dir = discover::segment_dir(cli.shm_dir.as_deref());
    match cli.command {
        Command::Rings { clean, json } => crate::rings::run(&dir, clean, json),
    }
}
