use anyhow::Result;
use clap::Parser;

mod cli;

fn main() -> Result<()> {
    let cli = cli::Cli::parse();
    cli::run(cli)
}
