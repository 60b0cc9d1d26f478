//! Process identity from `/proc`: name, command line, user, start time, and
//! the host pid of a process that runs in another pid namespace (NSpid).

use std::collections::HashMap;

use crate::ring::discover;
use crate::ring::layout::printable;

use crate::input::Identity;

/// Reads who `pid` (a pid in our namespace) is. None if it is gone.
pub fn identity(pid: u32) -> Option<Identity> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    // Names and command lines are chosen by whoever runs the process:
    // made printable here, where they enter.
    let name = printable(&field("Name:").unwrap_or_default());
    let uid = field("Uid:").and_then(|v| v.split_whitespace().next().and_then(|u| u.parse().ok()));
    let ns_pid = field("NSpid:")
        .and_then(|v| v.split_whitespace().last().and_then(|p| p.parse().ok()))
        .unwrap_or(pid);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .map(|s| printable(&s))
        .unwrap_or_default();
    Some(Identity {
        host_pid: pid,
        ns_pid,
        name,
        cmdline,
        user: uid.map(user_name).unwrap_or_default(),
        uid,
        label: String::new(),
        alive: true,
    })
}

/// The user name for `uid` from `/etc/passwd`, else the number.
pub fn user_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id: u32 = f.nth(1)?.parse().ok()?;
                (id == uid).then(|| name.to_string())
            })
        })
        .unwrap_or_else(|| uid.to_string())
}

/// The real uid of process `pid` (a pid here), from `/proc/<pid>/status`.
pub fn owner(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().next()?.parse().ok()
}

/// Whether process `pid` (a pid here) has the file `file` mapped, from
/// `/proc/<pid>/maps`: a producer writes its segment through a mapping, so
/// a process that does not map it is not its producer. None if the maps
/// cannot be read.
pub fn maps_file(pid: u32, file: discover::FileId) -> Option<bool> {
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

/// The pid in our namespace of a process that calls itself `ns_pid` and
/// started at `start_time` (see [`discover::locate`]).
pub fn host_pid(ns_pid: u32, start_time: u64) -> Option<u32> {
    match discover::locate(ns_pid, start_time) {
        discover::Located::Here(pid) => Some(pid),
        _ => None,
    }
}

/// Identities by pid, cached for processes already seen (pid + start time).
#[derive(Default)]
pub struct IdentityCache {
    known: HashMap<(u32, u64), Identity>,
}

impl IdentityCache {
    pub fn get(&mut self, pid: u32, start_time: u64) -> Option<Identity> {
        if let Some(id) = self.known.get(&(pid, start_time)) {
            return Some(id.clone());
        }
        let id = identity(pid)?;
        self.known.insert((pid, start_time), id.clone());
        Some(id)
    }

    /// Forget processes not in `keep`.
    pub fn retain(&mut self, keep: impl Fn(u32, u64) -> bool) {
        self.known.retain(|&(p, t), _| keep(p, t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::discover::proc_start_time;

    #[test]
    fn maps_tell_a_mapped_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let id = discover::file_id(&p).unwrap();
        let me = std::process::id();
        assert_eq!(maps_file(me, id), Some(false));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let m = crate::ring::shm::Shared::map(&f, 4096).unwrap();
        assert_eq!(maps_file(me, id), Some(true));
        drop(m);
    }

    #[test]
    fn own_identity() {
        let me = std::process::id();
        let id = identity(me).unwrap();
        assert_eq!(id.host_pid, me);
        assert_eq!(id.ns_pid, me);
        assert!(!id.name.is_empty());
        assert!(!id.cmdline.is_empty());
        assert_eq!(host_pid(me, proc_start_time(me).unwrap()), Some(me));
        assert_eq!(host_pid(me, 1), None);
    }
}
