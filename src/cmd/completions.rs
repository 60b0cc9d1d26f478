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

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// `cli` is the whole command line (`Cli::command()`), given by the
/// dispatch so that this file does not stand on the definition it documents.
pub(crate) fn run(args: Args, mut cli: clap::Command) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cli, "vramscope", &mut out);
    super::out::print(&String::from_utf8_lossy(&out))
}

#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {}

/// The man page (roff) of `vramscope`: one page, its commands as
/// subsections of COMMANDS, then KEYS (from the key table), ENVIRONMENT and
/// FILES.
pub(crate) fn man(_: ManArgs, cmd: clap::Command) -> Result<()> {
    let mut out = Vec::new();
    let page = clap_mangen::Man::new(cmd.clone());
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    out.extend_from_slice(b".SH COMMANDS\n");
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("vramscope {}", sub.get_name());
        let sub = sub.clone().display_name(&name).bin_name(&name);
        let m = clap_mangen::Man::new(sub.clone());
        out.extend_from_slice(format!(".SS \"{name}\"\n").as_bytes());
        if let Some(about) = sub.get_long_about().or(sub.get_about()) {
            out.extend_from_slice(format!("{}\n.PP\n", roff(&about.to_string())).as_bytes());
        }
        let mut part = Vec::new();
        m.render_synopsis_section(&mut part)?;
        if sub.get_arguments().any(|a| !a.is_hide_set()) {
            m.render_options_section(&mut part)?;
        }
        if sub.has_subcommands() {
            m.render_subcommands_section(&mut part)?;
        }
        // The parts' own headings become paragraphs of this subsection.
        let part = String::from_utf8_lossy(&part)
            .lines()
            .map(|l| match l.strip_prefix(".SH ") {
                Some(h) => {
                    let h = h.trim_matches('"').to_lowercase();
                    format!(".PP\n\\fI{}{}:\\fR\n.br", h[..1].to_uppercase(), &h[1..])
                }
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        out.extend_from_slice(part.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(
        b".SH KEYS\nIn the dashboard (and the fleet view); press ? there for the same list.\n",
    );
    for (title, keys) in vramscope_ui::keys::manual() {
        out.extend_from_slice(format!(".SS {}\n", roff(title)).as_bytes());
        for (k, what) in keys {
            out.extend_from_slice(format!(".TP\n\\fB{}\\fR\n{}\n", roff(k), roff(what)).as_bytes());
        }
    }
    out.extend_from_slice(b".SH ENVIRONMENT\n");
    for (var, what) in ENVIRONMENT {
        out.extend_from_slice(format!(".TP\n\\fB{var}\\fR\n{}\n", roff(what)).as_bytes());
    }
    out.extend_from_slice(b".SH FILES\n");
    for (file, what) in FILES {
        out.extend_from_slice(format!(".TP\n\\fI{}\\fR\n{}\n", roff(file), roff(what)).as_bytes());
    }
    page.render_version_section(&mut out)?;
    super::out::print(&String::from_utf8_lossy(&out))
}

/// What the program and its agent read from the environment.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("VRAMSCOPE_SHM_DIR", "the segment directory (default /dev/shm); --shm-dir overrides it"),
    ("VRAMSCOPE_CONFIG", "the settings file (default $XDG_CONFIG_HOME/vramscope/config.toml); one that is not there is an error"),
    ("XDG_CONFIG_HOME", "where the settings file is looked for (default ~/.config)"),
    ("NO_COLOR", "any value: no colours, as --no-color"),
    ("VRAMSCOPE_SCREENSHOT_DIR", "where S writes vramscope-NNN.svg (default: the settings file's screenshot_dir, else the current directory)"),
    ("VRAMSCOPE_PYTHON", "the python3 that run and doctor use"),
    ("VRAMSCOPE_MODE", "the agent: auto (default), exact, sampled or off"),
    ("VRAMSCOPE_CXX", "the agent: the compiler that builds its tracker; a path that does not exist means none"),
    ("VRAMSCOPE_CUDA_INCLUDE", "the agent: where the CUDA headers are (else CUDA_HOME)"),
    ("VRAMSCOPE_SLOTS", "the agent: slots per ring (a power of two, default 65536)"),
    ("VRAMSCOPE_STATS_MS", "the agent: the statistics period in ms (default 100 exact, 250 sampled)"),
    ("VRAMSCOPE_ATTRIBUTION", "the agent: 0 turns module and phase attribution off"),
    ("VRAMSCOPE_ROLES", "the agent: 0 turns role lists off (which blocks are parameters, buffers, gradients, optimizer state)"),
    ("VRAMSCOPE_ATTRIBUTION_BACKWARD", "the agent: auto (default), params, all or none: which modules' backward is tracked"),
    ("VRAMSCOPE_ATTRIBUTION_NATIVE", "the agent: 0 keeps module calls in Python (default: the native path)"),
    ("VRAMSCOPE_RING_WRITE", "the agent: shared makes device rings use the any-writer path"),
    ("VRAMSCOPE_STEP_HOOKS", "the agent: 0 installs no optimizer step hook"),
    ("VRAMSCOPE_OUTSIDE", "the agent: 0 does not name the memory outside the caching allocator (CUPTI; it steps aside for torch.profiler)"),
];

/// What the program reads and writes.
const FILES: &[(&str, &str)] = &[
    ("/dev/shm/vramscope-UID-PID", "an instrumented process's segment (its allocator events, statistics and control block); `vramscope rings` lists them, `rings --clean` removes stale ones"),
    ("~/.config/vramscope/config.toml", "the settings file (dashboard sort, colours, ASCII, mouse, read-only); see assets/config/minimal.toml"),
    ("~/.cache/vramscope", "where the agent builds its tracker (XDG_CACHE_HOME)"),
];

/// `s` as roff text: backslashes escaped, and a leading dot or quote kept
/// from being read as a request.
fn roff(s: &str) -> String {
    s.lines()
        .map(|l| format!("\\&{}", l.replace('\\', "\\e")))
        .collect::<Vec<_>>()
        .join("\n")
}
