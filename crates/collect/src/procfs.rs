//! Process identity from `/proc`: name, command line, user, start time, and
//! the host pid of a process that runs in another pid namespace (NSpid).

use std::collections::HashMap;

use vramscope_text::printable;
use vramscope_wire::ring::discover;

use vramscope_core::input::Identity;

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
pub(crate) fn user_name(uid: u32) -> String {
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

/// Whether process `pid` (a pid here) has the file `file` mapped (see
/// [`discover::maps_file`]).
pub(crate) fn maps_file(pid: u32, file: discover::FileId) -> Option<bool> {
    discover::maps_file(pid, file)
}

#[cfg(test)]
/// The pid in our namespace of a process that calls itself `ns_pid` and
/// started at `start_time` (see [`discover::locate`]).
pub(crate) fn host_pid(ns_pid: u32, start_time: u64) -> Option<u32> {
    match discover::locate(ns_pid, start_time) {
        discover::Located::Here(pid) => Some(pid),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_wire::ring::discover::proc_start_time;

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
        let m = vramscope_wire::ring::shm::Shared::map(&f, 4096).unwrap();
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

/// Reads the host figures of processes (CPU use between two readings,
/// resident memory, age) from `/proc/PID/stat`, through the procfs crate.
#[derive(Debug, Default)]
pub(crate) struct HostSampler {
    /// Per pid: (its start time, its CPU ticks so far, when read (ns)).
    prev: HashMap<u32, (u64, u64, u64)>,
}

impl HostSampler {
    /// The figures of `pids` at `now_ns` (collector clock). CPU use is
    /// absent at a process's first reading.
    pub(crate) fn sample(
        &mut self,
        pids: &[u32],
        now_ns: u64,
    ) -> Vec<vramscope_core::input::HostProcess> {
        let ticks = procfs::ticks_per_second().max(1);
        let page = procfs::page_size();
        use procfs::Current;
        let uptime_ns = procfs::Uptime::current()
            .ok()
            .map(|u| (u.uptime * 1e9) as u64);
        let mut out = Vec::with_capacity(pids.len());
        let mut prev = HashMap::with_capacity(pids.len());
        for &pid in pids {
            let Ok(stat) = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) else {
                continue;
            };
            let cpu = stat.utime.saturating_add(stat.stime);
            let cpu_percent = self
                .prev
                .get(&pid)
                .filter(|(start, _, t)| *start == stat.starttime && now_ns > *t)
                .map(|(_, was, t)| {
                    let used_ns = cpu.saturating_sub(*was) as f64 * 1e9 / ticks as f64;
                    100.0 * used_ns / (now_ns - t) as f64
                });
            prev.insert(pid, (stat.starttime, cpu, now_ns));
            let started_ns = stat.starttime.saturating_mul(1_000_000_000) / ticks;
            out.push(vramscope_core::input::HostProcess {
                pid,
                cpu_percent,
                rss: Some(stat.rss.saturating_mul(page)),
                elapsed_ns: uptime_ns.map(|u| u.saturating_sub(started_ns)),
            });
        }
        // Processes no longer asked about are forgotten.
        self.prev = prev;
        out
    }
}

#[cfg(test)]
mod host_tests {
    use super::*;

    #[test]
    fn this_process_has_host_figures_and_cpu_use_after_two_readings() {
        let me = std::process::id();
        let mut s = HostSampler::default();
        let first = s.sample(&[me, u32::MAX - 1], 1_000_000_000);
        assert_eq!(first.len(), 1, "a pid that does not exist is left out");
        let h = &first[0];
        assert_eq!(h.pid, me);
        assert!(h.cpu_percent.is_none(), "no CPU use before two readings");
        assert!(h.rss.unwrap() > 1 << 20, "{h:?}");
        assert!(h.elapsed_ns.is_some());
        // Burn some CPU, then read again 100 ms of clock later.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(120) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let second = s.sample(&[me], 1_000_000_000 + t.elapsed().as_nanos() as u64);
        let cpu = second[0].cpu_percent.unwrap();
        assert!(cpu > 10.0, "{cpu}");
    }
}
