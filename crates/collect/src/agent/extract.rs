//! The agent's files, embedded in the binary, and where they go: a
//! directory private to this user (the cache, else a fresh one), checked
//! by content before it is reused.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

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
        "vramscope/_outside.py",
        include_str!("../../../../assets/agent/vramscope/_outside.py"),
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
        "vramscope/outside.cpp",
        include_str!("../../../../assets/agent/outside.cpp"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
}
