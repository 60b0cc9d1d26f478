//! `vramscope doctor`: what the dashboard and the agent need, checked
//! (NVML, the segment directory, and the agent's own checks in Python).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

use super::env::{pythonpath_with, ENV_AUTO, ENV_PYTHON};
use super::extract::extract;

/// How a doctor check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of `vramscope doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when nothing).
    pub fix: String,
}

impl Check {
    fn new(name: &str, level: Level, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            level,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

/// Every check: the dashboard's own (NVML, segment directory, permissions)
/// and the agent's (Python, torch, compiler, headers, what is built — from
/// `python3 -m vramscope.doctor --json`, Python being `$VRAMSCOPE_PYTHON`
/// or `python3`). Builds nothing: `vramscope agent build` does.
pub fn doctor(shm_dir: Option<&Path>) -> Vec<Check> {
    let python = std::env::var_os(ENV_PYTHON).unwrap_or_else(|| OsString::from("python3"));
    doctor_with(&python, shm_dir, false)
}

/// [`doctor`] with an explicit Python; `build` also builds what is missing
/// first (as `vramscope agent build`).
pub fn doctor_with(python: &OsStr, shm_dir: Option<&Path>, build: bool) -> Vec<Check> {
    let mut out = vec![nvml_check()];
    let dir = vramscope_wire::ring::discover::segment_dir(shm_dir);
    out.extend(segment_dir_checks(&dir));
    out.extend(python_checks(python, build));
    out
}

/// Directories searched for `libnvidia-ml.so.1` besides `ldconfig -p`.
const NVML_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
    "/usr/local/cuda/lib64/stubs",
];

fn nvml_check() -> Check {
    const LIB: &str = "libnvidia-ml.so.1";
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(NVML_DIRS.iter().map(PathBuf::from));
    let mut found = dirs
        .iter()
        .map(|d| d.join(LIB))
        .find(|p| p.exists() && !p.to_string_lossy().contains("/stubs/"));
    if found.is_none() {
        for ldconfig in ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"] {
            if let Ok(o) = Command::new(ldconfig)
                .arg("-p")
                .stderr(Stdio::null())
                .output()
            {
                found = String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .filter(|l| l.trim_start().starts_with(LIB))
                    .filter_map(|l| l.rsplit("=> ").next())
                    .map(|p| PathBuf::from(p.trim()))
                    .next();
                break;
            }
        }
    }
    let gpus = fs::read_dir("/dev")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.strip_prefix("nvidia")
                        .is_some_and(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0);
    match found {
        Some(p) => Check::new(
            "NVML",
            Level::Ok,
            format!("{} ({gpus} GPU device nodes in /dev)", p.display()),
            "",
        ),
        None => Check::new(
            "NVML",
            Level::Warn,
            format!("{LIB} not found (ldconfig -p, LD_LIBRARY_PATH, usual paths); {gpus} GPU device nodes in /dev"),
            "install the NVIDIA driver's user-space libraries (or mount them into the container); without NVML the dashboard shows no device totals or per-process usage",
        ),
    }
}

/// Free bytes at `dir`, from `df -Pk` (no libc call needed).
fn free_bytes(dir: &Path) -> Option<u64> {
    let o = Command::new("df")
        .arg("-Pk")
        .arg(dir)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().nth(1)?;
    let kib: u64 = line.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// A process with `n` GPUs needs about (1 + n) × 4 MiB with the default
/// 65536-slot rings.
const SEGMENT_BYTES_8_GPUS: u64 = 9 * 4 * 1024 * 1024 + 64 * 1024;

fn segment_dir_checks(dir: &Path) -> Vec<Check> {
    let name = "segment directory";
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) => {
            return vec![Check::new(
                name,
                Level::Fail,
                format!("{}: {e}", dir.display()),
                "create it, or point VRAMSCOPE_SHM_DIR / --shm-dir at a writable tmpfs directory shared by the job and the dashboard",
            )]
        }
    };
    if !meta.is_dir() {
        return vec![Check::new(
            name,
            Level::Fail,
            format!("{} is not a directory", dir.display()),
            "point VRAMSCOPE_SHM_DIR / --shm-dir at a directory",
        )];
    }
    let mut out = Vec::new();
    // Writable, and files made there keep mode 0600 (what producers create).
    let probe = dir.join(format!(".vramscope-doctor-{}", std::process::id()));
    let made = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&probe);
    match made {
        Ok(_) => {
            let mode = fs::metadata(&probe)
                .map(|m| m.permissions().mode() & 0o777)
                .unwrap_or(0);
            let _ = fs::remove_file(&probe);
            out.push(Check::new(
                name,
                Level::Ok,
                format!("{} exists and is writable", dir.display()),
                "",
            ));
            if mode == 0o600 {
                out.push(Check::new(
                    "permissions",
                    Level::Ok,
                    "new segments are private to this user (mode 0600)",
                    "",
                ));
            } else {
                out.push(Check::new(
                    "permissions",
                    Level::Warn,
                    format!("a file created with mode 0600 there has mode {mode:o}; readers refuse group/world-accessible segments"),
                    "use a directory without default ACLs that widen permissions",
                ));
            }
        }
        Err(e) => out.push(Check::new(
            name,
            Level::Fail,
            format!("{} is not writable: {e}", dir.display()),
            "the agent warns and stays off; point VRAMSCOPE_SHM_DIR / --shm-dir at a writable directory",
        )),
    }
    match free_bytes(dir) {
        Some(b) if b < SEGMENT_BYTES_8_GPUS => out.push(Check::new(
            "free space",
            Level::Warn,
            format!("{} MiB free in {}; a process with 8 GPUs needs about 37 MiB", b >> 20, dir.display()),
            "free space there (stale segments: vramscope cleans its own), enlarge the tmpfs (docker --shm-size), or set VRAMSCOPE_SLOTS lower",
        )),
        Some(b) => out.push(Check::new(
            "free space",
            Level::Ok,
            format!("{} MiB free in {}", b >> 20, dir.display()),
            "",
        )),
        None => out.push(Check::new(
            "free space",
            Level::Warn,
            format!("could not measure free space in {} (df failed)", dir.display()),
            "",
        )),
    }
    if let Ok((found, others)) = vramscope_wire::ring::discover::list(dir) {
        let stale = found
            .iter()
            .filter(|f| {
                vramscope_wire::ring::discover::inspect(&f.path)
                    .map(|i| {
                        use vramscope_wire::ring::discover::Liveness;
                        matches!(i.liveness, Liveness::Dead | Liveness::Reused)
                    })
                    .unwrap_or(false)
            })
            .count();
        out.push(Check::new(
            "segments",
            if stale > 0 { Level::Warn } else { Level::Ok },
            format!(
                "{} of yours ({stale} stale), {others} of other users",
                found.len()
            ),
            if stale > 0 {
                "the dashboard removes stale segments of yours when it starts"
            } else {
                ""
            },
        ));
    }
    out
}

#[derive(serde::Deserialize)]
struct PyCheck {
    name: String,
    level: String,
    detail: String,
    #[serde(default)]
    fix: String,
}

fn python_checks(python: &OsStr, build: bool) -> Vec<Check> {
    let dir = match extract() {
        Ok(d) => d,
        Err(e) => {
            return vec![Check::new(
                "agent files",
                Level::Fail,
                format!("cannot extract the agent: {e:#}"),
                "set XDG_CACHE_HOME to a writable directory",
            )]
        }
    };
    let mut cmd = Command::new(python);
    cmd.args(["-m", "vramscope.doctor", "--json"]);
    if build {
        cmd.arg("--build");
    }
    let pp = pythonpath_with(&dir);
    cmd.env("PYTHONPATH", pp)
        .env_remove(ENV_AUTO)
        .stdin(Stdio::null());
    let out = match output_with_timeout(cmd, Duration::from_secs(600)) {
        Ok(o) => o,
        Err(e) => {
            return vec![Check::new(
                "python",
                Level::Fail,
                format!("cannot run {}: {e:#}", python.to_string_lossy()),
                "install python3, or set VRAMSCOPE_PYTHON to your training environment's Python",
            )]
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed: Option<Vec<PyCheck>> = text
        .lines()
        .rev()
        .find(|l| l.starts_with('['))
        .and_then(|l| serde_json::from_str(l).ok());
    match parsed {
        Some(list) => list
            .into_iter()
            .map(|c| Check {
                name: c.name,
                level: match c.level.as_str() {
                    "ok" => Level::Ok,
                    "warn" => Level::Warn,
                    _ => Level::Fail,
                },
                detail: c.detail,
                fix: c.fix,
            })
            .collect(),
        None => vec![Check::new(
            "python",
            Level::Fail,
            format!(
                "{} -m vramscope.doctor failed: {}",
                python.to_string_lossy(),
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("no output")
            ),
            "check that this Python runs (VRAMSCOPE_PYTHON picks another)",
        )],
    }
}

fn output_with_timeout(mut cmd: Command, limit: Duration) -> Result<std::process::Output> {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => Ok(r?),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            bail!("no answer within {limit:?}")
        }
    }
}
