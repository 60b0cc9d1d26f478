//! Finding segments and keeping the segment directory clean: names, the
//! checks made before a file is mapped, validation of what it holds,
//! liveness by pid, start time and state.
//!
//! This module sits below [`reader`](super::reader) and
//! [`writer`](super::writer): both use it, it uses neither (only `layout`
//! and `shm`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::error::RingError;
use super::layout::{self, Header, Parsed, HEADER_SIZE, OFF_STATE};
use super::shm::Shared;

/// The environment variable that moves the segment directory.
pub(crate) const DIR_ENV: &str = "VRAMSCOPE_SHM_DIR";
pub(crate) const DEFAULT_DIR: &str = "/dev/shm";
const PREFIX: &str = "vramscope-";

/// The segment directory: the flag if given, else `$VRAMSCOPE_SHM_DIR`, else `/dev/shm`.
pub fn segment_dir(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.to_path_buf();
    }
    match std::env::var_os(DIR_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// The effective uid of this process (the owner of the files it creates).
pub fn current_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

fn valid_tag(tag: &str) -> bool {
    (1..=32).contains(&tag.len()) && tag.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// `vramscope-<uid>-<pid>[-<tag>]`, or None for a bad tag.
pub fn segment_name(uid: u32, pid: u32, tag: Option<&str>) -> Option<String> {
    match tag {
        None => Some(format!("{PREFIX}{uid}-{pid}")),
        Some(t) if valid_tag(t) => Some(format!("{PREFIX}{uid}-{pid}-{t}")),
        Some(_) => None,
    }
}

/// The parts of a segment file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentName {
    pub uid: u32,
    pub pid: u32,
    pub tag: Option<String>,
}

/// Parses a file name; None if it is not a segment name.
pub fn parse_name(name: &str) -> Option<SegmentName> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let num = |s: &str| {
        (!s.is_empty() && s.len() <= 10 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let uid = num(parts.next()?)?;
    let pid = num(parts.next()?)?;
    let tag = match parts.next() {
        None => None,
        Some(t) if valid_tag(t) => Some(t.to_string()),
        Some(_) => return None,
    };
    Some(SegmentName { uid, pid, tag })
}

/// Start time of a process (field 22 of `/proc/<pid>/stat`), in clock ticks.
pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip past
    // its last ')'; field 3 follows.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the producer of a segment still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Liveness {
    Alive,
    /// No such process.
    Dead,
    /// The pid belongs to a newer process.
    Reused,
    /// Cannot tell: the producer cannot be checked from here (its start
    /// time is 0 or in the future, or it runs in a pid namespace this
    /// reader cannot see). Never deleted; shown with [`locate`]'s reason.
    CannotTell,
}

/// Where the producer of a segment is, as seen from this reader's pid
/// namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// Running, with this pid here (the host pid when it runs in a
    /// container, whose header names its pid in there).
    Here(u32),
    /// No process here has that pid and start time, and this reader sees
    /// every process (it runs in the root pid namespace).
    Dead,
    /// As `Dead`, but a process with that pid runs here (pid reused).
    Reused,
    /// Cannot tell, and why.
    CannotTell(String),
}

impl Located {
    pub fn liveness(&self) -> Liveness {
        match self {
            Located::Here(_) => Liveness::Alive,
            Located::Dead => Liveness::Dead,
            Located::Reused => Liveness::Reused,
            Located::CannotTell(_) => Liveness::CannotTell,
        }
    }
}

/// The kernel's inode number of the initial pid namespace (`PROC_PID_INIT_INO`).
const ROOT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Whether this process runs in the root pid namespace, where `/proc` shows
/// every process of the machine.
pub fn in_root_pid_namespace() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == ROOT_PID_NS_INO)
}

/// The `NSpid` line of `/proc/<pid>/status`: the pid in every namespace
/// from ours inward; its last entry is what the process calls itself.
pub fn proc_ns_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|p| p.parse().ok()).collect()
}

/// Clock ticks since boot: the clock of `start_time`.
fn ticks_now() -> Option<u64> {
    let up = std::fs::read_to_string("/proc/uptime").ok()?;
    let secs: f64 = up.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then_some((secs * hz as f64) as u64)
}

/// Whether the process `host` (a pid here) is the one that calls itself
/// `ns_pid` and started at `start_time`.
fn is_producer(host: u32, ns_pid: u32, start_time: u64) -> bool {
    proc_start_time(host) == Some(start_time)
        && match proc_ns_pids(host) {
            Some(v) => v.last() == Some(&ns_pid),
            // A kernel before 4.1 has no NSpid: only our namespace's pid.
            None => host == ns_pid,
        }
}

/// Host pids found for (namespace pid, start time), checked again on use:
/// scanning `/proc` each tick for a producer in a container would cost.
static FOUND: std::sync::Mutex<Vec<((u32, u64), u32)>> = std::sync::Mutex::new(Vec::new());

/// Finds the producer that calls itself `ns_pid` (the header's pid, in its
/// own pid namespace) and started at `start_time` (field 22 of its
/// `/proc/<pid>/stat`, ticks since boot: the same in every namespace), by
/// the `NSpid` lines of `/proc`. A start time of 0 or one in the future
/// cannot be checked; nor can a producer this reader does not see when it
/// does not run in the root pid namespace.
pub fn locate(ns_pid: u32, start_time: u64) -> Located {
    if start_time == 0 {
        return Located::CannotTell(
            "the segment's start time is 0: its producer cannot be verified".into(),
        );
    }
    if ticks_now().is_some_and(|now| start_time > now + 100) {
        return Located::CannotTell(format!(
            "the segment's start time ({start_time} ticks) is in the future: its producer cannot be verified"
        ));
    }
    if is_producer(ns_pid, ns_pid, start_time) {
        return Located::Here(ns_pid);
    }
    let key = (ns_pid, start_time);
    let cached = FOUND
        .lock()
        .ok()
        .and_then(|f| f.iter().find(|(k, _)| *k == key).map(|e| e.1));
    if let Some(host) = cached.filter(|&h| is_producer(h, ns_pid, start_time)) {
        return Located::Here(host);
    }
    let found = std::fs::read_dir("/proc").ok().and_then(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
            .find(|&pid| pid != ns_pid && is_producer(pid, ns_pid, start_time))
    });
    if let Some(host) = found {
        if let Ok(mut f) = FOUND.lock() {
            f.retain(|(k, h)| *k != key && is_producer(*h, k.0, k.1));
            if f.len() < 4096 {
                f.push((key, host));
            }
        }
        return Located::Here(host);
    }
    if !in_root_pid_namespace() {
        return Located::CannotTell(format!(
            "no process here is pid {ns_pid} with its start time, but this reader runs in a pid namespace of its own and cannot see every process: it may run elsewhere"
        ));
    }
    if Path::new(&format!("/proc/{ns_pid}")).exists() {
        Located::Reused
    } else {
        Located::Dead
    }
}

/// [`locate`] for a segment that was opened as `file`: when the process
/// found does not map it, another process that also calls itself `ns_pid`
/// and started at `start_time` and maps it is its producer. (Two pid-1
/// processes of their own pid namespaces that started in the same clock
/// tick share both; only the mapping tells them apart.)
pub fn locate_producer(ns_pid: u32, start_time: u64, file: FileId) -> Located {
    let found = locate(ns_pid, start_time);
    let Located::Here(host) = found else {
        return found;
    };
    if maps_file(host, file) != Some(false) {
        return found;
    }
    let other = std::fs::read_dir("/proc").ok().and_then(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
            .find(|&p| {
                p != host && is_producer(p, ns_pid, start_time) && maps_file(p, file) == Some(true)
            })
    });
    other.map_or(found, Located::Here)
}

pub(crate) fn liveness(pid: u32, start_time: u64) -> Liveness {
    locate(pid, start_time).liveness()
}

/// Whether the producer of a segment still runs, given the segment's header
/// `state`: the one place of the rule "a closed segment counts as dead"
/// (FORMAT.md, "Liveness and hygiene").
pub(crate) fn segment_liveness(pid: u32, start_time: u64, state: u32) -> Liveness {
    if state == layout::STATE_CLOSED {
        return Liveness::Dead;
    }
    liveness(pid, start_time)
}

/// Which file a path names: device and inode. Deletions check it, so that
/// only the file that was validated is ever removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    fn of(m: &std::fs::Metadata) -> Self {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// The file `path` names now (not following a symlink).
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| FileId::of(&m))
}

/// Whether process `pid` (a pid here) has the file `file` mapped, from
/// `/proc/<pid>/maps`: a producer keeps its segment mapped (FORMAT.md,
/// "Liveness and hygiene"), so a process that does not map it is not its
/// producer. None if the maps cannot be read.
pub fn maps_file(pid: u32, file: FileId) -> Option<bool> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let (major, minor) = (
        ((file.dev >> 8) & 0xfff) | ((file.dev >> 32) & !0xfff),
        (file.dev & 0xff) | ((file.dev >> 12) & !0xff),
    );
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some(maps.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (Some(dev), Some(ino)) = (f.nth(3), f.next()) else {
            return false;
        };
        let dev_ok = dev
            .split_once(':')
            .is_some_and(|(a, b)| hex(a) == Some(major) && hex(b) == Some(minor));
        dev_ok && ino.parse::<u64>().ok() == Some(file.ino)
    }))
}

/// Removes `path` only if it still names the file `id`: the path is first
/// renamed to a private name in the same directory (never replacing
/// anything), its inode checked there, then unlinked, or renamed back if a
/// different file had taken the path. Returns whether it was removed.
pub fn remove_if_same(path: &Path, id: FileId) -> bool {
    SegmentDir::of(path).is_ok_and(|(dir, name)| dir.remove_if_same(&name, id))
}

/// A segment directory, opened once. Every file in it is then reached
/// relative to this descriptor (`openat`, `renameat`, `unlinkat`), never by
/// resolving a path again: a container can change its own directories
/// while a reader looks at them, so a path that led into the container a
/// moment ago may lead out of it now.
#[derive(Debug)]
pub struct SegmentDir {
    /// Open for reading entries (`O_RDONLY | O_DIRECTORY`).
    fd: std::os::fd::OwnedFd,
    /// What it is called, for messages.
    path: PathBuf,
}

impl SegmentDir {
    /// A directory of the host (`--shm-dir`, `$VRAMSCOPE_SHM_DIR`,
    /// `/dev/shm`, the parent of a segment path given by the user), as its
    /// path resolves.
    pub fn open(path: &Path) -> std::io::Result<SegmentDir> {
        use rustix::fs::{openat, Mode, OFlags, CWD};
        let fd = openat(
            CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(SegmentDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory `rel` inside `root` (a container's root,
    /// `/proc/<pid>/root`), resolved as the container itself sees it and
    /// never out of it: a symbolic link on the way, absolute or with `..`,
    /// stays inside `root` (`openat2` with `RESOLVE_IN_ROOT`), and no
    /// magic link (`/proc/<pid>/...`) is followed. Where the kernel has no
    /// `openat2` (before 5.6, or a seccomp filter refuses it), every
    /// component is opened with `O_NOFOLLOW` instead: a link on the way is
    /// refused.
    pub(crate) fn open_in_root(root: &Path, rel: &Path) -> std::io::Result<SegmentDir> {
        use rustix::fs::{openat, openat2, Mode, OFlags, ResolveFlags, CWD};
        // Following the magic link `/proc/<pid>/root` itself is the point:
        // it is the container's root.
        let root_fd = openat(
            CWD,
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        let fd = match openat2(&root_fd, rel, flags, Mode::empty(), resolve) {
            Err(e) if e == rustix::io::Errno::NOSYS || e == rustix::io::Errno::PERM => {
                open_without_links(&root_fd, rel)?
            }
            other => other?,
        };
        Ok(SegmentDir {
            fd,
            path: root.join(rel),
        })
    }

    /// A segment path's directory, opened, and its file name.
    pub(crate) fn of(path: &Path) -> Result<(SegmentDir, String), RingError> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| RingError::invalid(path, "not a segment file name"))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = SegmentDir::open(parent).map_err(|e| RingError::io(path, e))?;
        Ok((dir, name.to_string()))
    }

    /// What the directory is called.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in it, for messages.
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Which directory this is (device and inode).
    pub fn id(&self) -> Option<FileId> {
        rustix::fs::fstat(&self.fd).ok().map(|st| FileId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// The UTF-8 names of its entries (never `.` and `..`).
    pub(crate) fn names(&self) -> std::io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&self.fd)? {
            let e = e?;
            if let Ok(n) = e.file_name().to_str() {
                if n != "." && n != ".." {
                    out.push(n.to_string());
                }
            }
        }
        Ok(out)
    }

    fn stat(&self, name: &str) -> Option<rustix::fs::Stat> {
        rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()
    }

    /// The file `name` names now (not following a symlink).
    pub fn file_id(&self, name: &str) -> Option<FileId> {
        self.stat(name).map(|st| FileId {
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Opens `name` for mapping after the hygiene checks of FORMAT.md: no
    /// symlinks, a regular file, owned by us, no group or world
    /// permissions. The checks come first, on a descriptor that opens
    /// nothing (`O_PATH`): a device, a FIFO or a socket named like a
    /// segment is refused without ever being opened; only a file that
    /// passed is then opened read-write, through that very descriptor.
    pub(crate) fn open_file(&self, name: &str) -> Result<(File, u64), RingError> {
        use rustix::fs::{fstat, openat, FileType, Mode, OFlags};
        use std::os::fd::AsRawFd;
        let path = self.join(name);
        let handle = openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| RingError::io(&path, e.into()))?;
        let st = fstat(&handle).map_err(|e| RingError::io(&path, e.into()))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Symlink => return Err(RingError::refused(&path, "is a symbolic link")),
            _ => return Err(RingError::refused(&path, "is not a regular file")),
        }
        let me = current_uid();
        if st.st_uid != me {
            return Err(RingError::refused(
                &path,
                format!("is owned by uid {}, not by this user (uid {me})", st.st_uid),
            ));
        }
        if st.st_mode & 0o077 != 0 {
            return Err(RingError::refused(
                &path,
                format!(
                    "has mode {:o}: group or others may access it (want 600)",
                    st.st_mode & 0o777
                ),
            ));
        }
        // Reopened through the descriptor's own entry in /proc: the inode
        // that was checked, whatever the name is by now.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .map_err(|e| RingError::io(&path, e))?;
        let meta = file.metadata().map_err(|e| RingError::io(&path, e))?;
        if FileId::of(&meta)
            != (FileId {
                dev: st.st_dev,
                ino: st.st_ino,
            })
        {
            return Err(RingError::refused(&path, "changed while it was opened"));
        }
        Ok((file, meta.len()))
    }

    /// [`open_mapped_id`] of `name`.
    pub(crate) fn open_mapped(&self, name: &str) -> Result<(Shared, Header, FileId), RingError> {
        let (file, size) = self.open_file(name)?;
        map_checked(&self.join(name), file, size)
    }

    /// [`remove_if_same`] of `name`: renamed to a private name in this
    /// directory (never replacing anything), checked there, then unlinked,
    /// or renamed back.
    pub fn remove_if_same(&self, name: &str, id: FileId) -> bool {
        use rustix::fs::{renameat_with, unlinkat, AtFlags, RenameFlags};
        if self.file_id(name) != Some(id) {
            return false;
        }
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = format!(
            ".vramscope-unlink-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        if renameat_with(&self.fd, name, &self.fd, &tmp, RenameFlags::NOREPLACE).is_err() {
            return false;
        }
        if self.file_id(&tmp) == Some(id) {
            return unlinkat(&self.fd, &tmp, AtFlags::empty()).is_ok();
        }
        // Another file took the name between the check and the rename: put it back.
        let _ = renameat_with(&self.fd, &tmp, &self.fd, name, RenameFlags::NOREPLACE);
        false
    }

    /// Files [`remove_if_same`](Self::remove_if_same) renamed away and did
    /// not get to unlink because its process died in between
    /// (`.vramscope-unlink-<pid>-<n>`): removed when they are ours, regular
    /// files, and that process is gone.
    fn remove_abandoned_unlinks(&self) -> Vec<PathBuf> {
        use rustix::fs::{unlinkat, AtFlags, FileType};
        let uid = current_uid();
        let mut removed = Vec::new();
        for name in self.names().unwrap_or_default() {
            let Some(pid) = name
                .strip_prefix(".vramscope-unlink-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let ours = self.stat(&name).is_some_and(|st| {
                FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_uid == uid
            });
            if ours
                && proc_start_time(pid).is_none()
                && unlinkat(&self.fd, name.as_str(), AtFlags::empty()).is_ok()
            {
                removed.push(self.join(&name));
            }
        }
        removed
    }
}

/// `rel` beneath `root`, each component opened with `O_NOFOLLOW`: a
/// symbolic link on the way (or a `..`) is refused.
fn open_without_links(
    root: &std::os::fd::OwnedFd,
    rel: &Path,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::fs::{openat, Mode, OFlags};
    use std::path::Component;
    let step = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut fd = openat(root, ".", step, Mode::empty())?;
    for c in rel.components() {
        match c {
            Component::Normal(name) => fd = openat(&fd, name, step, Mode::empty())?,
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(std::io::Error::other(
                    "`..` in a container's segment directory",
                ))
            }
        }
    }
    let last = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(openat(&fd, ".", last, Mode::empty())?)
}

/// Opens a segment file for mapping after the hygiene checks of FORMAT.md:
/// no symlinks, a regular file, owned by us, no group or world permissions
/// (see [`SegmentDir::open_file`]).
pub(crate) fn open_checked(path: &Path) -> Result<(File, u64), RingError> {
    let (dir, name) = SegmentDir::of(path)?;
    dir.open_file(&name)
}

/// Opens `path` after the hygiene checks, maps it, and validates a private
/// copy of its header and ring table: everything FORMAT.md says a reader
/// refuses is refused here, with the file named. Also says which file was
/// validated.
pub(crate) fn open_mapped_id(path: &Path) -> Result<(Shared, Header, FileId), RingError> {
    let (file, size) = open_checked(path)?;
    map_checked(path, file, size)
}

/// Maps `file` (`size` bytes, opened after the hygiene checks as `path`)
/// and validates a private copy of its header and ring table.
fn map_checked(path: &Path, file: File, size: u64) -> Result<(Shared, Header, FileId), RingError> {
    let id = file
        .metadata()
        .map(|m| FileId::of(&m))
        .map_err(|e| RingError::io(path, e))?;
    if size < HEADER_SIZE as u64 {
        return Err(RingError::invalid(
            path,
            format!("{size} bytes, smaller than the {HEADER_SIZE}-byte header"),
        ));
    }
    let len = usize::try_from(size)
        .map_err(|_| RingError::invalid(path, format!("{size} bytes is too large")))?;
    let shared = Shared::map(&file, len).map_err(|e| RingError::io(path, e))?;
    // Parse a private copy: first the fixed header, then as much as it asks for.
    let mut copy = shared.copy_prefix(HEADER_SIZE);
    let parsed = loop {
        match layout::parse_header(&copy, size) {
            Err(RingError::ShortCopy { needed }) if needed > copy.len() && needed <= len => {
                copy = shared.copy_prefix(needed);
            }
            Err(RingError::Invalid(why)) => return Err(RingError::invalid(path, why)),
            other => break other.map_err(|e| RingError::invalid(path, e.to_string()))?,
        }
    };
    let header = match parsed {
        Parsed::Initialising => return Err(RingError::Initialising(path.to_path_buf())),
        Parsed::Ready(h) => h,
    };
    // The magic was read with acquire ordering in `copy_prefix`, so the
    // writer's initialisation is visible from here on.
    if header.uid != current_uid() {
        return Err(RingError::refused(
            path,
            format!("header names uid {}, but the file is ours", header.uid),
        ));
    }
    Ok((shared, header, id))
}

/// What `inspect` learns about a segment without keeping it open.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SegmentInfo {
    pub(crate) path: PathBuf,
    pub(crate) pid: u32,
    pub liveness: Liveness,
    pub(crate) state: u32,
    pub(crate) label: String,
    /// The file that was validated (what a deletion must still find).
    #[serde(skip)]
    pub(crate) file: FileId,
    /// Why its liveness cannot be told, when it cannot.
    pub(crate) why: Option<String>,
}

/// Opens, validates and closes a segment: what is it, is its producer alive.
pub fn inspect(path: &Path) -> Result<SegmentInfo, RingError> {
    let (dir, name) = SegmentDir::of(path)?;
    inspect_in(&dir, &name)
}

/// [`inspect`] of `name` in `dir`.
pub(crate) fn inspect_in(dir: &SegmentDir, name: &str) -> Result<SegmentInfo, RingError> {
    let (shared, h, file) = dir.open_mapped(name)?;
    let state = shared.u32_at(OFF_STATE).load(Ordering::Acquire);
    let located = if state == layout::STATE_CLOSED {
        Located::Dead
    } else {
        locate(h.pid, h.start_time)
    };
    Ok(SegmentInfo {
        path: dir.join(name),
        pid: h.pid,
        liveness: located.liveness(),
        state,
        label: h.label,
        file,
        why: match located {
            Located::CannotTell(why) => Some(why),
            _ => None,
        },
    })
}

/// One directory entry that looks like a segment of this user.
#[derive(Debug, Clone)]
pub struct Found {
    /// What it is called (its directory's path and its name), for messages
    /// and as a key; it is opened, checked and removed through `dir`.
    pub path: PathBuf,
    pub name: SegmentName,
    /// The directory it was found in, opened.
    pub dir: std::sync::Arc<SegmentDir>,
    /// Its file name in `dir`.
    pub file: String,
}

/// Lists this user's segment files in `dir` (by name; nothing is opened).
/// Segments named for other users are not listed: their count is returned.
pub fn list(dir: &Path) -> Result<(Vec<Found>, usize), RingError> {
    let opened = SegmentDir::open(dir).map_err(|e| RingError::io(dir, e))?;
    list_in(std::sync::Arc::new(opened))
}

/// [`list`] of a directory already opened.
pub fn list_in(dir: std::sync::Arc<SegmentDir>) -> Result<(Vec<Found>, usize), RingError> {
    let me = current_uid();
    let mut found = Vec::new();
    let mut others = 0;
    let names = dir.names().map_err(|e| RingError::io(dir.path(), e))?;
    for file in names {
        let Some(name) = parse_name(&file) else {
            continue;
        };
        if name.uid != me {
            others += 1;
            continue;
        }
        found.push(Found {
            path: dir.join(&file),
            name,
            dir: dir.clone(),
            file,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((found, others))
}

/// At most this many other mount namespaces' segment directories are read.
pub(crate) const MAX_CONTAINER_DIRS: usize = 256;

/// The segment directories of containers: for each mount namespace other
/// than ours that a process of this user runs in, `dir` as that process
/// sees it, `/proc/<pid>/root/<dir>` (a container with its own `/dev/shm`),
/// opened without ever leaving that root ([`SegmentDir::open_in_root`]: a
/// container's links lead into the container, never into the host). Only
/// what this reader has the rights to see (the same user, or root): a
/// process whose root or namespace cannot be read is passed over. A
/// directory that is `dir` itself (a container given the host's
/// `/dev/shm`) is left out, and so is one seen twice. At most
/// [`MAX_CONTAINER_DIRS`].
pub fn container_dirs(dir: &Path) -> Vec<SegmentDir> {
    let ns_of = |pid: &str| std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino());
    let Ok(ours) = ns_of("self") else {
        return Vec::new();
    };
    let mut seen_dirs: Vec<FileId> = SegmentDir::open(dir)
        .ok()
        .and_then(|d| d.id())
        .into_iter()
        .collect();
    let mut seen_ns = std::collections::HashSet::from([ours]);
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    let me = current_uid();
    for e in procs.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if e.metadata().map_or(true, |m| m.uid() != me) {
            continue;
        }
        let Ok(ns) = ns_of(pid) else { continue };
        if !seen_ns.insert(ns) {
            continue;
        }
        let root = Path::new("/proc").join(pid).join("root");
        let Ok(candidate) = SegmentDir::open_in_root(&root, dir) else {
            continue;
        };
        let Some(id) = candidate.id() else {
            continue;
        };
        if seen_dirs.contains(&id) {
            continue;
        }
        seen_dirs.push(id);
        out.push(candidate);
        if out.len() >= MAX_CONTAINER_DIRS {
            break;
        }
    }
    out
}

/// Removes this user's segments whose producer is gone (dead, pid reused, or
/// closed). Only files that validate as this user's segments are removed,
/// and only the very file that was validated (same device and inode); a
/// producer that cannot be checked ([`Liveness::CannotTell`]) is left alone,
/// and so is anything unreadable. Returns what was removed.
pub fn remove_stale(dir: &Path) -> Result<Vec<PathBuf>, RingError> {
    let opened = std::sync::Arc::new(SegmentDir::open(dir).map_err(|e| RingError::io(dir, e))?);
    let (found, _) = list_in(opened.clone())?;
    let mut removed = Vec::new();
    for f in found {
        let Ok(info) = inspect_in(&f.dir, &f.file) else {
            continue;
        };
        if matches!(info.liveness, Liveness::Dead | Liveness::Reused)
            && f.dir.remove_if_same(&f.file, info.file)
        {
            removed.push(f.path);
        }
    }
    removed.extend(opened.remove_abandoned_unlinks());
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(segment_name(1000, 42, None).unwrap(), "vramscope-1000-42");
        assert_eq!(
            parse_name("vramscope-1000-42-demo_1").unwrap(),
            SegmentName {
                uid: 1000,
                pid: 42,
                tag: Some("demo_1".into())
            }
        );
        assert_eq!(parse_name("vramscope-1000-42").unwrap().tag, None);
        for bad in [
            "vramscope-",
            "vramscope-x-1",
            "vramscope-1-",
            "vramscope-1-2-",
            "vramscope-1-2-a.b",
            "vramscope-1-2-a-b",
            "other-1-2",
            "vramscope-99999999999-1",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        assert_eq!(segment_name(1, 2, Some("no/slash")), None);
    }

    #[test]
    fn abandoned_unlinks_of_dead_removers_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(".vramscope-unlink-999999999-0");
        let mine = dir
            .path()
            .join(format!(".vramscope-unlink-{}-0", std::process::id()));
        let other = dir.path().join("vramscope-unrelated");
        for p in [&dead, &mine, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(remove_stale(dir.path()).unwrap(), vec![dead.clone()]);
        assert!(!dead.exists() && mine.exists() && other.exists());
    }

    #[test]
    fn own_start_time_is_readable_and_alive() {
        let me = std::process::id();
        let t = proc_start_time(me).expect("own stat");
        assert_eq!(liveness(me, t), Liveness::Alive);
        assert_eq!(liveness(me, t + 1), Liveness::Reused);
        assert_eq!(liveness(u32::MAX - 1, 1), Liveness::Dead);
    }

    #[test]
    fn unverifiable_start_times_cannot_tell() {
        let me = std::process::id();
        assert_eq!(liveness(me, 0), Liveness::CannotTell);
        assert_eq!(liveness(me, u64::MAX / 2), Liveness::CannotTell);
        let t = proc_start_time(me).unwrap();
        assert_eq!(locate(me, t), Located::Here(me));
    }

    #[test]
    fn removal_checks_the_inode() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"first").unwrap();
        let first = file_id(&a).unwrap();
        std::fs::remove_file(&a).unwrap();
        let keep = dir.path().join("keep");
        std::fs::write(&keep, b"x").unwrap(); // holds the first inode's number apart
        std::fs::write(&a, b"second").unwrap();
        let second = file_id(&a).unwrap();
        if second != first {
            assert!(!remove_if_same(&a, first));
            assert_eq!(std::fs::read(&a).unwrap(), b"second");
        }
        assert!(remove_if_same(&a, second));
        assert!(!a.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no private name left behind");
    }

    /// A container's segment directory is resolved inside its root: an
    /// absolute link, or one climbing with `..`, leads to the root's own
    /// directory of that name, never to the host's; without `openat2`
    /// every link on the way is refused.
    #[test]
    fn a_containers_links_stay_inside_its_root() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        std::fs::create_dir(&host).unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("dev")).unwrap();
        symlink(&host, root.join("dev/shm")).unwrap();
        symlink("../../../../../../../host", root.join("dev/up")).unwrap();
        for rel in ["dev/shm", "/dev/shm", "dev/up"] {
            assert!(
                SegmentDir::open_in_root(&root, Path::new(rel)).is_err(),
                "{rel}"
            );
        }
        // The root's own directory of that name is what it leads to.
        let decoy = root.join(host.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&decoy).unwrap();
        let host_id = SegmentDir::open(&host).unwrap().id();
        let decoy_id = SegmentDir::open(&decoy).unwrap().id();
        let d = SegmentDir::open_in_root(&root, Path::new("/dev/shm")).unwrap();
        assert_eq!(d.id(), decoy_id);
        assert_ne!(d.id(), host_id);
        assert_eq!(d.path(), root.join("dev/shm"));
        // The fallback without openat2: no link followed at all.
        let root_fd = rustix::fs::openat(
            rustix::fs::CWD,
            &root,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        for rel in ["dev/shm", "dev/up", "dev/../dev"] {
            assert!(
                open_without_links(&root_fd, Path::new(rel)).is_err(),
                "{rel}"
            );
        }
        std::fs::create_dir(root.join("dev/real")).unwrap();
        let fd = open_without_links(&root_fd, Path::new("/dev/real")).unwrap();
        assert_eq!(
            rustix::fs::fstat(&fd).unwrap().st_ino,
            std::fs::metadata(root.join("dev/real")).unwrap().ino()
        );
    }

    #[test]
    fn segment_dir_prefers_flag() {
        assert_eq!(segment_dir(Some(Path::new("/x"))), PathBuf::from("/x"));
    }
}
