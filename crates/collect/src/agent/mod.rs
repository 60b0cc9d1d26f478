//! The in-process PyTorch agent, embedded in the binary.
//!
//! `assets/agent/` (a small Python package, the C++ tracker source and the C
//! ring writer) is compiled into the binary and extracted on demand to
//! `$XDG_CACHE_HOME/vramscope/agent-<version>-<hash>/`, so users need no pip
//! install. From there:
//!
//! - [`run`] / [`exec`] run a user's command with the agent injected (a
//!   `sitecustomize.py` on `PYTHONPATH` that attaches when the script
//!   imports torch, chaining any sitecustomize it shadows);
//! - [`extract`] gives the directory to put on `PYTHONPATH` for
//!   `import vramscope; vramscope.attach()`;
//! - [`doctor`] checks what the agent and the dashboard need, running the
//!   agent's own search (`python3 -m vramscope.doctor`) for the Python side.
//!
//! - [`build`] builds the tracker before a job needs it (`run` does so
//!   before it starts the command; `vramscope agent build` ahead of time).
//!
//! No `unsafe` here: process spawning and files only.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

pub mod build;
pub(crate) use build::prebuild_for;

/// The agent's files: (path inside the extracted directory, contents).
/// The C++ sources sit inside the package, where `vramscope/_build.py`
/// looks for them first.
pub const FILES: &[(&str, &str)] = &[
    (
        "sitecustomize.py",
        include_str!("../../../../assets/agent/sitecustomize.py"),
    ),
    (
        "vramscope/__init__.py",
        include_str!("../../../../assets/agent/vramscope/__init__.py"),
    ),
    (
        "vramscope/_attrib.py",
        include_str!("../../../../assets/agent/vramscope/_attrib.py"),
    ),
    (
        "vramscope/_remote.py",
        include_str!("../../../../assets/agent/vramscope/_remote.py"),
    ),
    (
        "vramscope/_roles.py",
        include_str!("../../../../assets/agent/vramscope/_roles.py"),
    ),
    (
        "vramscope/_build.py",
        include_str!("../../../../assets/agent/vramscope/_build.py"),
    ),
    (
        "vramscope/_ensure.py",
        include_str!("../../../../assets/agent/vramscope/_ensure.py"),
    ),
    (
        "vramscope/_sampled.py",
        include_str!("../../../../assets/agent/vramscope/_sampled.py"),
    ),
    (
        "vramscope/_segment.py",
        include_str!("../../../../assets/agent/vramscope/_segment.py"),
    ),
    (
        "vramscope/doctor.py",
        include_str!("../../../../assets/agent/vramscope/doctor.py"),
    ),
    (
        "vramscope/fastcall.cpp",
        include_str!("../../../../assets/agent/fastcall.cpp"),
    ),
    (
        "vramscope/tracker.cpp",
        include_str!("../../../../assets/agent/tracker.cpp"),
    ),
    (
        "vramscope/vramscope_ring.h",
        include_str!("../../../../assets/agent/vramscope_ring.h"),
    ),
];

/// Environment variables the agent reads (see `vramscope/__init__.py`).
pub(crate) const ENV_AUTO: &str = "VRAMSCOPE_AUTO";
pub(crate) const ENV_SHM_DIR: &str = "VRAMSCOPE_SHM_DIR";
pub(crate) const ENV_PYTHON: &str = "VRAMSCOPE_PYTHON";

/// FNV-1a over every file name and content: names the extracted directory,
/// so two builds with different agents never share one.
pub(crate) fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, body) in FILES {
        for b in name.bytes().chain([0u8]).chain(body.bytes()).chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// `agent-<crate version>-<hash>`.
pub fn dir_name() -> String {
    format!(
        "agent-{}-{:016x}",
        env!("CARGO_PKG_VERSION"),
        content_hash()
    )
}

/// `$XDG_CACHE_HOME/vramscope`, else `$HOME/.cache/vramscope`, else a
/// per-user directory under the temporary directory. Only ever used when
/// private to this user (see [`extract_to`]).
pub(crate) fn cache_root() -> PathBuf {
    let abs = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(x) = abs(std::env::var_os("XDG_CACHE_HOME")) {
        return x.join("vramscope");
    }
    if let Some(h) = abs(std::env::var_os("HOME")) {
        return h.join(".cache").join("vramscope");
    }
    std::env::temp_dir().join(format!(
        "vramscope-cache-{}",
        vramscope_wire::ring::discover::current_uid()
    ))
}

/// Extracts the agent under [`cache_root`] and returns the directory to put
/// on `PYTHONPATH`. Idempotent and safe against concurrent callers. When the
/// cache cannot be trusted (not private to this user, see [`extract_to`]) or
/// written, the agent goes into a fresh private directory instead, and one
/// `vramscope:` line on stderr says so.
pub fn extract() -> Result<PathBuf> {
    let root = cache_root();
    match extract_to(&root) {
        Ok(dir) => Ok(dir),
        Err(e) => {
            let dir = extract_fresh().with_context(|| format!("{e:#}"))?;
            vramscope_text::stderr_line(format_args!(
                "vramscope: not using the agent cache ({e:#}); using a fresh private copy in {}",
                dir.display()
            ));
            Ok(dir)
        }
    }
}

const S_ISVTX: u32 = 0o1000;

/// A directory on the way to a private one: owned by root or `uid`, and not
/// writable by anyone else unless sticky (where only an entry's owner may
/// rename or remove it; the entry below is then checked as ours).
fn ancestor_problem(p: &Path, m: &fs::Metadata, uid: u32) -> Option<String> {
    if !m.is_dir() {
        return Some(format!("{} is not a directory", p.display()));
    }
    if m.uid() != 0 && m.uid() != uid {
        return Some(format!("{} is owned by uid {}", p.display(), m.uid()));
    }
    if m.mode() & 0o022 != 0 && m.mode() & S_ISVTX == 0 {
        return Some(format!(
            "{} is writable by other users (mode {:o})",
            p.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// A private entry (from `symlink_metadata`): no symbolic link, owned by
/// `uid`, writable by no one else.
fn private_problem(p: &Path, m: &fs::Metadata, uid: u32) -> Option<String> {
    if m.file_type().is_symlink() {
        return Some(format!("{} is a symbolic link", p.display()));
    }
    if m.uid() != uid {
        return Some(format!(
            "{} is owned by uid {}, not {uid}",
            p.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Some(format!(
            "{} is writable by group or others (mode {:o})",
            p.display(),
            m.mode() & 0o7777
        ));
    }
    None
}

/// Every directory from `/` to `path` (which must exist), symbolic links
/// followed one component at a time: each link must belong to root or
/// `uid`, and every directory passed through must satisfy
/// [`ancestor_problem`]. Then no other user can change where `path` leads.
fn check_chain(path: &Path, uid: u32) -> std::result::Result<(), String> {
    let comps = |p: &Path| -> Vec<OsString> {
        p.components()
            .filter_map(|c| match c {
                std::path::Component::Normal(s) => Some(s.to_os_string()),
                std::path::Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect()
    };
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let root = Path::new("/");
    let m = fs::metadata(root).map_err(|e| format!("/: {e}"))?;
    if let Some(p) = ancestor_problem(root, &m, uid) {
        return Err(p);
    }
    let mut cur = PathBuf::from("/");
    let mut todo: Vec<OsString> = comps(path).into_iter().rev().collect();
    let mut links = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        let m = fs::symlink_metadata(&next).map_err(|e| format!("{}: {e}", next.display()))?;
        if m.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return Err(format!("{}: too many symbolic links", path.display()));
            }
            if m.uid() != 0 && m.uid() != uid {
                return Err(format!(
                    "{} is a symbolic link owned by uid {}",
                    next.display(),
                    m.uid()
                ));
            }
            let target = fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
            if target.is_absolute() {
                cur = PathBuf::from("/");
            }
            todo.extend(comps(&target).into_iter().rev());
            continue;
        }
        if let Some(p) = ancestor_problem(&next, &m, uid) {
            return Err(p);
        }
        cur = next;
    }
    Ok(())
}

/// Makes sure `root` is a directory private to this user: every directory
/// leading to it passes [`check_chain`] (missing ones are created, mode
/// 0700), and `root` itself is ours, no symbolic link, writable by no one
/// else. Returns why not otherwise.
pub(crate) fn private_root(root: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let uid = vramscope_wire::ring::discover::current_uid();
    let parent = root
        .parent()
        .filter(|p| root.is_absolute() && !p.as_os_str().is_empty())
        .ok_or_else(|| format!("{} is not an absolute path", root.display()))?;
    if fs::symlink_metadata(parent).is_err() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    check_chain(parent, uid)?;
    match fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", root.display())),
    }
    let m = fs::symlink_metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    if let Some(p) = private_problem(root, &m, uid) {
        return Err(p);
    }
    if !m.is_dir() {
        return Err(format!("{} is not a directory", root.display()));
    }
    Ok(())
}

/// The directories of an extraction: the top, the package, and the
/// `__pycache__` of each (made by us, so that Python never creates one with
/// a group-writable umask).
const DIRS: &[&str] = &["", "__pycache__", "vramscope", "vramscope/__pycache__"];

/// Checks an extraction by content: every directory and file ours, no
/// symbolic links, writable by no one else, every file byte for byte the
/// embedded one, nothing else there but Python's own byte-code caches.
fn verify(dir: &Path) -> std::result::Result<(), String> {
    use std::io::Read;
    let uid = vramscope_wire::ring::discover::current_uid();
    for d in DIRS {
        let p = dir.join(d);
        let m = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(_) if d.ends_with("__pycache__") => continue,
            Err(e) => return Err(format!("{}: {e}", p.display())),
        };
        if let Some(problem) = private_problem(&p, &m, uid) {
            return Err(problem);
        }
        if !m.is_dir() {
            return Err(format!("{} is not a directory", p.display()));
        }
        for entry in fs::read_dir(&p).map_err(|e| format!("{}: {e}", p.display()))? {
            let entry = entry.map_err(|e| format!("{}: {e}", p.display()))?;
            let rel = Path::new(d).join(entry.file_name());
            let known = DIRS.iter().any(|x| Path::new(x) == rel)
                || FILES.iter().any(|(n, _)| Path::new(n) == rel);
            if known {
                continue;
            }
            // Python's byte code: ours, private (it is in a private directory).
            let m = entry
                .metadata()
                .map_err(|e| format!("{}: {e}", rel.display()))?;
            if !d.ends_with("__pycache__") || !m.is_file() {
                return Err(format!("unexpected {} in the agent", rel.display()));
            }
            if let Some(problem) = private_problem(&entry.path(), &m, uid) {
                return Err(problem);
            }
        }
    }
    for (name, body) in FILES {
        let p = dir.join(name);
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        let m = f.metadata().map_err(|e| format!("{}: {e}", p.display()))?;
        if let Some(problem) = private_problem(&p, &m, uid) {
            return Err(problem);
        }
        if !m.is_file() || m.len() != body.len() as u64 {
            return Err(format!("{} differs from the embedded file", p.display()));
        }
        let mut got = Vec::with_capacity(body.len());
        f.read_to_end(&mut got)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if got != body.as_bytes() {
            return Err(format!("{} differs from the embedded file", p.display()));
        }
    }
    Ok(())
}

/// Whether `dir` holds exactly this build's agent, private to this user
/// (see [`extract_to`]).
pub fn verified(dir: &Path) -> bool {
    verify(dir).is_ok()
}

/// Creates a new directory `parent/<prefix>-<pid>-<nanos>-<n>`, mode 0700,
/// failing rather than reusing anything that exists (mkdir is exclusive).
fn fresh_dir(parent: &Path, prefix: &str) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..16 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = parent.join(format!("{prefix}-{}-{nanos}-{n}", std::process::id()));
        match fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(anyhow!(e).context(format!("creating {}", p.display()))),
        }
    }
    Err(anyhow!(last.unwrap()).context(format!("creating a directory in {}", parent.display())))
}

/// Writes every file (and the directories of [`DIRS`]) into `dir`, which
/// must be new and empty.
fn write_files(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    for d in DIRS.iter().filter(|d| !d.is_empty()) {
        let p = dir.join(d);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .with_context(|| format!("creating {}", p.display()))?;
    }
    for (name, body) in FILES {
        let path = dir.join(name);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(body.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Removes what earlier [`extract_fresh`] calls left in `parent`: our own
/// `vramscope-agent-<uid>-<pid>-…` directories whose process (the job that
/// vramscope became) is gone and that are over an hour old.
fn remove_old_fresh(parent: &Path, uid: u32) {
    let prefix = format!("vramscope-agent-{uid}-");
    let Ok(rd) = fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let old = e.metadata().is_ok_and(|m| {
            m.is_dir()
                && m.uid() == uid
                && m.modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(3600))
        });
        if old && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The agent in a fresh private directory under the temporary directory
/// (the first of `$TMPDIR`, `/tmp`, `/dev/shm` whose path no other user can
/// change), never reused: for when the cache cannot be trusted.
pub(crate) fn extract_fresh() -> Result<PathBuf> {
    let uid = vramscope_wire::ring::discover::current_uid();
    let mut why = Vec::new();
    let mut tried: Vec<PathBuf> = Vec::new();
    for parent in [std::env::temp_dir(), "/tmp".into(), "/dev/shm".into()] {
        if tried.contains(&parent) {
            continue;
        }
        tried.push(parent.clone());
        if let Err(e) = check_chain(&parent, uid) {
            why.push(e);
            continue;
        }
        remove_old_fresh(&parent, uid);
        let dir = match fresh_dir(&parent, &format!("vramscope-agent-{uid}")) {
            Ok(d) => d,
            Err(e) => {
                why.push(format!("{e:#}"));
                continue;
            }
        };
        match write_files(&dir)
            .map_err(|e| format!("{e:#}"))
            .and_then(|()| verify(&dir))
        {
            Ok(()) => return Ok(dir),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                why.push(e);
            }
        }
    }
    bail!("no private directory for the agent: {}", why.join("; "))
}

/// [`extract`] into `root` (created, mode 0700, if missing). `root` must be
/// private to this user ([`private_root`]: ours, no symbolic link, writable
/// by no one else, on a path no other user can change); an error says why
/// not. An extraction already there is reused only when [`verified`] by
/// content, and replaced otherwise: the files are written into a fresh
/// private directory that is then renamed into place.
pub fn extract_to(root: &Path) -> Result<PathBuf> {
    private_root(root)
        .map_err(|why| anyhow!("{} is not private to this user: {why}", root.display()))?;
    let dest = root.join(dir_name());
    if verified(&dest) {
        return Ok(dest);
    }
    let tmp = fresh_dir(root, &format!(".{}.tmp", dir_name()))?;
    if let Err(e) = write_files(&tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if fs::symlink_metadata(&dest).is_ok() && !verified(&dest) {
        // Damaged or tampered with: move it aside, then remove it.
        if let Ok(junk) = fresh_dir(root, &format!(".{}.old", dir_name())) {
            let _ = fs::rename(&dest, junk.join("old"));
            let _ = fs::remove_dir_all(&junk);
        }
    }
    match fs::rename(&tmp, &dest) {
        Ok(()) => Ok(dest),
        Err(_) if verified(&dest) => {
            // Another process won the race with identical content.
            let _ = fs::remove_dir_all(&tmp);
            Ok(dest)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(anyhow!(e).context(format!("renaming into {}", dest.display())))
        }
    }
}

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

/// `PYTHONPATH` with `dir` first, then what this process has.
pub(crate) fn pythonpath_with(dir: &Path) -> OsString {
    let mut pp = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
        pp.push(":");
        pp.push(old);
    }
    pp
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_walked_component_by_component() {
        let uid = vramscope_wire::ring::discover::current_uid();
        assert!(check_chain(Path::new("relative/dir"), uid).is_err());
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", tmp.path().join("rel")).unwrap();
        assert_eq!(check_chain(&tmp.path().join("rel"), uid), Ok(()));
        assert_eq!(check_chain(&tmp.path().join("real/../real"), uid), Ok(()));
        assert!(check_chain(&tmp.path().join("missing"), uid).is_err());
        fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_chain(&tmp.path().join("rel"), uid).unwrap_err();
        assert!(e.contains("writable by other users"), "{e}");
        fs::set_permissions(&real, fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(check_chain(&tmp.path().join("rel"), uid), Ok(()));
        // The root itself must be private, not merely sticky.
        let e = private_root(&real).unwrap_err();
        assert!(e.contains("writable by group or others"), "{e}");
    }

    #[test]
    fn files_are_embedded_and_hashed() {
        assert!(FILES.iter().all(|(_, b)| !b.is_empty()));
        // Every module of the package is embedded (`vramscope run` extracts
        // only these).
        let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/agent/vramscope");
        for entry in fs::read_dir(pkg).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".py") {
                let want = format!("vramscope/{name}");
                assert!(
                    FILES.iter().any(|(n, _)| *n == want),
                    "{want} is not embedded"
                );
            }
        }
        assert!(dir_name().starts_with("agent-"));
        assert_eq!(content_hash(), content_hash());
    }

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
