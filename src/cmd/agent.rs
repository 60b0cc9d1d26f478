//! `vramscope agent path|build`: the embedded PyTorch agent.
use std::ffi::OsString;

use anyhow::Result;
use clap::Subcommand;

use vramscope_collect::agent::build::{self, Outcome};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Print the directory of the extracted agent package (for PYTHONPATH),
    /// extracting it first if needed. (`pip install ./assets/agent` from a
    /// clone installs the same package.)
    Path,
    /// Build the tracker and the native module call path for a Python and
    /// its torch now (about 20 s, once per torch, Python and compiler;
    /// cached), so that the first job is exact from its first allocation.
    /// `vramscope run` does this before it starts a job; this is for jobs
    /// started another way (`import vramscope`, a pip-installed agent) and
    /// for images built ahead. Exits 0 when built (or already), 1 when a
    /// build failed, 3 when there is nothing to build with that Python (no
    /// torch, a CPU-only torch).
    Build {
        /// The Python of the training environment (default:
        /// $VRAMSCOPE_PYTHON, else python3).
        #[arg(long, value_name = "PYTHON")]
        python: Option<OsString>,
        /// Build again, also what failed before.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.what {
        What::Path => {
            super::out::line(&vramscope_collect::agent::extract()?.display().to_string())?
        }
        What::Build { python, force } => {
            let python = python
                .or_else(|| std::env::var_os("VRAMSCOPE_PYTHON").filter(|p| !p.is_empty()))
                .unwrap_or_else(|| OsString::from("python3"));
            let dir = vramscope_collect::agent::extract()?;
            let report = build::ensure(&python, &dir, force, false)?;
            let why = report.reason.unwrap_or_else(|| "?".into());
            let (code, line) = match report.outcome {
                Outcome::Ready => (
                    0,
                    format!(
                        "the tracker is {}: {}",
                        if report.status == "built" {
                            "built"
                        } else {
                            "already built"
                        },
                        report.tracker.unwrap_or_default()
                    ),
                ),
                Outcome::Failed => (1, format!("the build failed: {why}")),
                Outcome::Nothing => (
                    3,
                    format!("nothing to build with {}: {why}", python.to_string_lossy()),
                ),
            };
            vramscope_text::stderr_line(format_args!("vramscope: {line}"));
            if code != 0 {
                return Err(super::common::ExitStatus(code).into());
            }
        }
    }
    Ok(())
}
