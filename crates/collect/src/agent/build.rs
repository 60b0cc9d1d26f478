//! Building the agent's native parts before a job needs them.
//!
//! The tracker (and the native module call path) are compiled against the
//! job's own torch and Python headers, about 20 s the first time. Built
//! inside the job, a short first job ended before the build did and was
//! never seen. So `vramscope run` (and `vramscope agent build`, and
//! `vramscope attach`) run the agent's own builder, `python -m
//! vramscope._ensure`, with the job's Python first: the job then finds
//! the build cached and is exact from its first allocation.
//!
//! The builder does the work (the search for a compiler and headers, the
//! cache's build lock, the stamp that makes the common case cheap, the
//! progress line); this module picks the Python and runs it, bounded in
//! time.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::env::{ENV_AUTO, ENV_PYTHON};

/// How long a build may take before `run` gives up on it and starts the
/// job anyway (the builder waits up to 15 minutes on another's lock, and
/// each compile is bounded at 5 minutes).
pub(crate) const BUILD_LIMIT: Duration = Duration::from_secs(20 * 60);

/// What the builder found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Built now, or already cached.
    Ready,
    /// A build failed; the builder said why on stderr (the job runs
    /// sampled and says so too).
    Failed,
    /// Nothing to build with this Python (no torch, a CPU-only torch,
    /// `VRAMSCOPE_MODE` sampled or off, an allocator that refuses trackers).
    Nothing,
}

/// The builder's answer: its outcome, and what its JSON line said.
#[derive(Debug, Clone)]
pub struct Report {
    pub outcome: Outcome,
    /// "cached", "built", "failed" or "nothing".
    pub status: String,
    /// Where the tracker is, when built.
    pub tracker: Option<String>,
    /// Why not, when it is not.
    pub reason: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct Doc {
    #[serde(default)]
    status: String,
    #[serde(default)]
    tracker: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// The Python a command will run: `$VRAMSCOPE_PYTHON`; the command itself
/// when it is a Python (`python3.12`, `/venv/bin/python`); the interpreter
/// of its `#!` line when that is a Python (`torchrun`, `accelerate`, a
/// script run directly, `#!/usr/bin/env python3`); else `python3`.
pub(crate) fn python_for(argv: &[OsString]) -> OsString {
    if let Some(p) = std::env::var_os(ENV_PYTHON).filter(|p| !p.is_empty()) {
        return p;
    }
    argv.first()
        .and_then(|prog| {
            let path = resolve(prog)?;
            if is_python_name(&path) {
                return Some(path.into_os_string());
            }
            shebang_python(&path)
        })
        .unwrap_or_else(|| OsString::from("python3"))
}

fn is_python_name(path: &Path) -> bool {
    path.file_name()
        .and_then(OsStr::to_str)
        .and_then(|n| n.strip_prefix("python"))
        .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
}

/// `prog` as a path: as given when it names a directory part, else the
/// first executable of that name on `PATH`.
fn resolve(prog: &OsStr) -> Option<PathBuf> {
    let p = Path::new(prog);
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// The Python named by `path`'s `#!` line (its first 256 bytes), if any.
fn shebang_python(path: &Path) -> Option<OsString> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let first = words.next()?;
    let interp = if Path::new(first).file_name() == Some(OsStr::new("env")) {
        // `#!/usr/bin/env [-S] python3 ...`
        let name = words.find(|w| !w.starts_with('-'))?;
        resolve(OsStr::new(name))?
    } else {
        PathBuf::from(first)
    };
    is_python_name(&interp).then(|| interp.into_os_string())
}

/// Runs the builder with `python` (the agent extracted into `agent_dir`):
/// builds what is missing, under the cache's build lock, printing its one
/// progress line on stderr; silent when all is cached. `force` tries again
/// what failed before. Bounded by [`BUILD_LIMIT`].
pub fn ensure(python: &OsStr, agent_dir: &Path, force: bool, quiet: bool) -> Result<Report> {
    let mut cmd = Command::new(python);
    cmd.args(["-m", "vramscope._ensure", "--json"]);
    if force {
        cmd.arg("--force");
    }
    if quiet {
        cmd.arg("--quiet");
    }
    cmd.env("PYTHONPATH", super::env::pythonpath_with(agent_dir))
        .env_remove(ENV_AUTO)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        // No such Python: nothing to build for (the job says what it finds).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Report {
                outcome: Outcome::Nothing,
                status: "nothing".into(),
                tracker: None,
                reason: Some(format!("{} not found", python.to_string_lossy())),
            })
        }
        Err(e) => {
            return Err(anyhow::anyhow!(e).context(format!("starting {}", python.to_string_lossy())))
        }
    };
    // Its JSON line (the first 64 KiB of its output; the rest is drained).
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut out) = stdout {
            let _ = (&mut out).take(1 << 16).read_to_end(&mut text);
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        }
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the build")? {
            break status;
        }
        if start.elapsed() > BUILD_LIMIT {
            // SIGTERM first: the builder removes its temporary file.
            let _ = Command::new("kill")
                .arg(child.id().to_string())
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_secs(2));
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "the build did not finish within {} min",
                BUILD_LIMIT.as_secs() / 60
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap_or_default();
    let doc: Doc = String::from_utf8_lossy(&text)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    let outcome = match status.code() {
        Some(0) => Outcome::Ready,
        Some(3) => Outcome::Nothing,
        _ => Outcome::Failed,
    };
    let reason = doc.reason.or_else(|| {
        (outcome == Outcome::Failed).then(|| match status.code() {
            Some(c) => format!("the builder exited with status {c}"),
            None => "the builder was killed by a signal".to_string(),
        })
    });
    Ok(Report {
        outcome,
        status: doc.status,
        tracker: doc.tracker,
        reason,
    })
}

/// [`ensure`] for the Python at `python` (e.g. a running job's
/// `/proc/PID/exe`), with the agent extracted as `run` does.
pub(crate) fn prebuild_for(python: &Path) -> Result<Report> {
    let dir = super::extract::extract()?;
    ensure(python.as_os_str(), &dir, false, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn python_names_are_recognised() {
        for yes in ["python", "python3", "python3.12", "/v/bin/python3.11"] {
            assert!(is_python_name(Path::new(yes)), "{yes}");
        }
        for no in ["pythonista", "bash", "torchrun", "python3-config"] {
            assert!(!is_python_name(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn a_script_s_interpreter_is_read_from_its_shebang() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let p = tmp.path().join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let direct = write("torchrun", "#!/opt/venv/bin/python3.12 -u\nimport x\n");
        assert_eq!(
            shebang_python(&direct),
            Some(OsString::from("/opt/venv/bin/python3.12"))
        );
        let shell = write("job.sh", "#!/bin/bash\necho\n");
        assert_eq!(shebang_python(&shell), None);
        let binary = write("blob", "\x7fELF....");
        assert_eq!(shebang_python(&binary), None);
        // `env` resolves the name on PATH (python3 is on every test machine
        // that runs the agent tests; without it the answer is None).
        let env = write("tool", "#!/usr/bin/env -S python3 -u\n");
        if let Some(p) = resolve(OsStr::new("python3")) {
            assert_eq!(shebang_python(&env), Some(p.into_os_string()));
        }
    }
}
