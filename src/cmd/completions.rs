//! `vramscope completions SHELL` and `vramscope man`: shell completions
//! (clap_complete) and the man page (clap_mangen), both generated from the
//! one command-line definition, so they never disagree with `--help`.
//!
//! ```text
//! vramscope completions bash > ~/.local/share/bash-completion/completions/vramscope
//! vramscope completions zsh  > ~/.zfunc/_vramscope
//! vramscope man > ~/.local/share/man/man1/vramscope.1
//! ```
use anyhow::Result;
use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

pub fn run(args: Args) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(
        args.shell,
        &mut super::Cli::command(),
        "vramscope",
        &mut out,
    );
    super::out::print(&String::from_utf8_lossy(&out))
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {}

/// The man page (roff) of `vramscope`, with its subcommands.
pub fn man(_: ManArgs) -> Result<()> {
    let mut out = Vec::new();
    let cmd = super::Cli::command();
    clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
    // Each subcommand's own section, after the main page's.
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("vramscope-{}", sub.get_name());
        let sub = sub.clone().display_name(name);
        clap_mangen::Man::new(sub).render(&mut out)?;
    }
    super::out::print(&String::from_utf8_lossy(&out))
}
