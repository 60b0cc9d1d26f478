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

use super::layout::{self, Header, Parsed, HEADER_SIZE, OFF_STATE};
use super::shm::Shared;
use super::RingError;

/// The environment variable that moves the segment directory.
pub const DIR_ENV: &str = "VRAMSCOPE_SHM_DIR";
pub const DEFAULT_DIR: &str = "/dev/shm";
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
}

pub fn liveness(pid: u32, start_time: u64) -> Liveness {
    match proc_start_time(pid) {
        None => Liveness::Dead,
        Some(t) if start_time != 0 && t != start_time => Liveness::Reused,
        Some(_) => Liveness::Alive,
    }
}

/// Whether the producer of a segment still runs, given the segment's header
/// `state`: the one place of the rule "a closed segment counts as dead"
/// (FORMAT.md, "Liveness and hygiene").
pub fn segment_liveness(pid: u32, start_time: u64, state: u32) -> Liveness {
    if state == layout::STATE_CLOSED {
        return Liveness::Dead;
    }
    liveness(pid, start_time)
}

/// Opens a segment file for mapping after the hygiene checks of FORMAT.md:
/// no symlinks, a regular file, owned by us, no group or world permissions.
pub fn open_checked(path: &Path) -> Result<(File, u64), RingError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                RingError::refused(path, "is a symbolic link")
            } else {
                RingError::io(path, e)
            }
        })?;
    let meta = file.metadata().map_err(|e| RingError::io(path, e))?;
    if !meta.file_type().is_file() {
        return Err(RingError::refused(path, "is not a regular file"));
    }
    let me = current_uid();
    if meta.uid() != me {
        return Err(RingError::refused(
            path,
            format!(
                "is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(RingError::refused(
            path,
            format!(
                "has mode {:o}: group or others may access it (want 600)",
                meta.mode() & 0o777
            ),
        ));
    }
    Ok((file, meta.len()))
}

/// Opens `path` after the hygiene checks, maps it, and validates a private
/// copy of its header and ring table: everything FORMAT.md says a reader
/// refuses is refused here, with the file named.
pub fn open_mapped(path: &Path) -> Result<(Shared, Header), RingError> {
    let (file, size) = open_checked(path)?;
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
    Ok((shared, header))
}

/// What `inspect` learns about a segment without keeping it open.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SegmentInfo {
    pub path: PathBuf,
    pub pid: u32,
    pub liveness: Liveness,
    pub state: u32,
    pub label: String,
}

/// Opens, validates and closes a segment: what is it, is its producer alive.
pub fn inspect(path: &Path) -> Result<SegmentInfo, RingError> {
    let (shared, h) = open_mapped(path)?;
    let state = shared.u32_at(OFF_STATE).load(Ordering::Acquire);
    Ok(SegmentInfo {
        path: path.to_path_buf(),
        pid: h.pid,
        liveness: segment_liveness(h.pid, h.start_time, state),
        state,
        label: h.label,
    })
}

/// One directory entry that looks like a segment of this user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub name: SegmentName,
}

/// Lists this user's segment files in `dir` (by name; nothing is opened).
/// Segments named for other users are not listed: their count is returned.
pub fn list(dir: &Path) -> Result<(Vec<Found>, usize), RingError> {
    let me = current_uid();
    let mut found = Vec::new();
    let mut others = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| RingError::io(dir, e))?;
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().and_then(parse_name) else {
            continue;
        };
        if name.uid != me {
            others += 1;
            continue;
        }
        found.push(Found {
            path: entry.path(),
            name,
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((found, others))
}

/// Removes this user's segments whose producer is gone (dead, pid reused, or
/// closed). Returns what was removed; files that fail the checks are left alone.
pub fn remove_stale(dir: &Path) -> Result<Vec<PathBuf>, RingError> {
    let (found, _) = list(dir)?;
    let mut removed = Vec::new();
    for f in found {
        if let Ok(info) = inspect(&f.path) {
            if info.liveness != Liveness::Alive && std::fs::remove_file(&f.path).is_ok() {
                removed.push(f.path);
            }
        } else if f.name.pid != 0 && proc_start_time(f.name.pid).is_none() {
            // Unreadable (e.g. truncated) and its named pid is gone: stale too,
            // but only if it is ours and a plain file.
            if open_checked(&f.path).is_ok() && std::fs::remove_file(&f.path).is_ok() {
                removed.push(f.path);
            }
        }
    }
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
    fn own_start_time_is_readable_and_alive() {
        let me = std::process::id();
        let t = proc_start_time(me).expect("own stat");
        assert_eq!(liveness(me, t), Liveness::Alive);
        assert_eq!(liveness(me, t + 1), Liveness::Reused);
        assert_eq!(liveness(u32::MAX - 1, 1), Liveness::Dead);
    }

    #[test]
    fn segment_dir_prefers_flag() {
        assert_eq!(segment_dir(Some(Path::new("/x"))), PathBuf::from("/x"));
    }
}
