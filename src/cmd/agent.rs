//! `vramscope agent path`: the embedded PyTorch agent.
use clap::Subcommand;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Print the directory of the extracted agent package (for PYTHONPATH),
    /// extracting it first if needed. (`pip install ./assets/agent` from a
    /// clone installs the same package.)
    Path,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Path => super::out::line(&vramscope::agent::extract()?.display().to_string())?,
    }
    Ok(())
}
