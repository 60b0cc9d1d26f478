use anyhow::Result;
use clap::Parser;

mod cli;
mod record;
mod report;
mod rings;

fn main() -> Result<()> {
    let cli = cli::Cli::parse();
    cli::run(cli)
}
