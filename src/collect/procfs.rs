//! Process identity from `/proc`: name, command line, user, start time, and
//! the host pid of a process that runs in another pid namespace (NSpid).

use std::collections::HashMap;

use crate::ring::discover::proc_start_time;

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
    let name = field("Name:").unwrap_or_default();
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

/// The pid in our namespace of a process that calls itself `ns_pid` and
/// started at `start_time`: itself if that matches here, else found by
/// scanning `/proc/*/status` for an `NSpid` line ending in `ns_pid`.
pub fn host_pid(ns_pid: u32, start_time: u64) -> Option<u32> {
    if proc_start_time(ns_pid) == Some(start_time) {
        return Some(ns_pid);
    }
    let dir = std::fs::read_dir("/proc").ok()?;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let last = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| {
                v.split_whitespace()
                    .last()
                    .and_then(|p| p.parse::<u32>().ok())
            });
        if last == Some(ns_pid) && proc_start_time(pid) == Some(start_time) {
            return Some(pid);
        }
    }
    None
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
