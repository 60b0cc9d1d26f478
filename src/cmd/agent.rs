//! `vramscope agent path`: the embedded PyTorch agent.
use clap::Subcommand;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Print the directory of the extracted agent package (for PYTHONPATH,
    /// or `pip install` from it), extracting it first if needed.
    Path,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Path => super::out::line(&vramscope::agent::extract()?.display().to_string())?,
    }
    Ok(())
}
