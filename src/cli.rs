//! Command-line interface: one subcommand per job; each hands off to the library.
use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "vramscope", version, about = "GPU memory inside PyTorch processes, live")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {}
}
