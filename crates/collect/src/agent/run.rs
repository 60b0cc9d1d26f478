//! A user's command run with the agent injected: `PYTHONPATH`, the
//! environment the agent reads, and the tracker built first.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus};

use anyhow::{anyhow, bail, Context, Result};

use super::build;
use super::env::{pythonpath_with, ENV_AUTO, ENV_SHM_DIR};
use super::extract::extract;

/// The command `argv` prepared to run with the agent: `PYTHONPATH` starts
/// with the extracted directory (its `sitecustomize.py` attaches when torch
/// is imported and then runs any sitecustomize it shadows),
/// `VRAMSCOPE_AUTO=1`, and `VRAMSCOPE_SHM_DIR` when `shm_dir` is given.
/// Python started with `-S` or `-I` skips sitecustomize and is not
/// instrumented.
/// Before that, what the agent needs is built with the command's own Python
/// ([`build::python_for`]) if it is not cached yet: one progress line on
/// stderr, then the job starts and finds it. A build that fails or is not
/// possible is said by the builder (or, later, by the job) and the job
/// starts anyway.
pub(crate) fn command(argv: &[OsString], shm_dir: Option<&Path>) -> Result<Command> {
    let Some((prog, args)) = argv.split_first() else {
        bail!("no command given: vramscope run <command> [args...]");
    };
    let dir = extract()?;
    let python = build::python_for(argv);
    if let Err(e) = build::ensure(&python, &dir, false, false) {
        vramscope_text::stderr_line(format_args!(
            "vramscope: building the tracker with {}: {e:#}; the job starts anyway",
            python.to_string_lossy()
        ));
    }
    Ok(command_with(&dir, prog, args, shm_dir))
}

fn command_with(dir: &Path, prog: &OsStr, args: &[OsString], shm_dir: Option<&Path>) -> Command {
    let pp = pythonpath_with(dir);
    let mut cmd = Command::new(prog);
    cmd.args(args).env("PYTHONPATH", pp).env(ENV_AUTO, "1");
    if let Some(d) = shm_dir {
        cmd.env(ENV_SHM_DIR, d);
    }
    cmd
}

/// Runs `argv` with the agent injected and waits for it. The child inherits
/// stdin/stdout/stderr and the process group, so a terminal's Ctrl-C reaches
/// it directly; its exit status (code or signal) is returned unchanged.
/// For the CLI prefer [`exec`], which also passes through signals sent to
/// vramscope's own pid.
pub fn run(argv: &[OsString], shm_dir: Option<&Path>) -> Result<ExitStatus> {
    let mut cmd = command(argv, shm_dir)?;
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", argv[0].to_string_lossy()))?;
    child.wait().context("waiting for the command")
}

/// Replaces this process with `argv`, the agent injected: signals, exit
/// code and pid are the command's own. Returns only on failure.
pub fn exec(argv: &[OsString], shm_dir: Option<&Path>) -> anyhow::Error {
    match command(argv, shm_dir) {
        Ok(mut cmd) => {
            let e = cmd.exec();
            anyhow!(e).context(format!("starting {}", argv[0].to_string_lossy()))
        }
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_prepends_pythonpath() {
        let cmd = command_with(
            Path::new("/x/agent"),
            OsStr::new("python3"),
            &[OsString::from("t.py")],
            Some(Path::new("/shm")),
        );
        let envs: Vec<_> = cmd.get_envs().collect();
        let get = |k: &str| {
            envs.iter()
                .find(|(n, _)| *n == OsStr::new(k))
                .and_then(|(_, v)| *v)
                .map(|v| v.to_string_lossy().into_owned())
        };
        assert!(get("PYTHONPATH").unwrap().starts_with("/x/agent"));
        assert_eq!(get(ENV_AUTO).as_deref(), Some("1"));
        assert_eq!(get(ENV_SHM_DIR).as_deref(), Some("/shm"));
    }
}
