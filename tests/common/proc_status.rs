//! Figures of a process's `/proc/PID/status`, for the tests that watch
//! memory (`tests/hostile`, through `common`) and the fuzz target that
//! bounds it (`fuzz/fuzz_targets/snapshot_shared.rs`, which includes this
//! file by path): std only.

/// The figure `field` (`"VmHWM:"`, `"VmRSS:"`: kB) of the process `pid`
/// (`"self"`, or a number), in bytes; None when the process is gone or
/// has no such field.
pub(crate) fn status_bytes(pid: impl std::fmt::Display, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
