//! What `/proc/PID` says about a process before anything touches it: its
//! memory map (`maps`), its owner, state and tracer (`status`). Pure
//! parsers over the files' bytes, so they are tested on fixed text.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) read: bool,
    pub(crate) write: bool,
    pub(crate) exec: bool,
    /// The offset in the file of the byte mapped at `start`.
    pub(crate) offset: u64,
    pub(crate) inode: u64,
    /// The file (or `[vdso]`, `[heap]`, ...); `None` for anonymous memory.
    /// A file deleted since it was mapped keeps its old path, without the
    /// kernel's " (deleted)" (see `deleted`).
    pub(crate) path: Option<PathBuf>,
    pub(crate) deleted: bool,
}

impl Mapping {
    /// The file name of the mapped file, when it is a file.
    pub(crate) fn file_name(&self) -> Option<&str> {
        let p = self.path.as_deref()?;
        if !p.is_absolute() {
            return None;
        }
        p.file_name()?.to_str()
    }

    /// A pseudo-mapping of the kernel's (`[vdso]`, `[stack]`, ...).
    pub(crate) fn special(&self) -> Option<&str> {
        let p = self.path.as_deref()?.to_str()?;
        (p.starts_with('[') && p.ends_with(']')).then_some(p)
    }
}

/// `/proc/PID/maps` read into [`Mapping`]s. Lines that do not parse are
/// skipped (the kernel's format has not changed since 2.6, but a reader
/// of another process's file never trusts it).
pub(crate) fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    text.split(|&b| b == b'\n')
        .filter_map(parse_maps_line)
        .collect()
}

fn parse_maps_line(line: &[u8]) -> Option<Mapping> {
    // start-end perms offset dev inode [path]; the path may hold spaces.
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let trimmed = trim_start(rest);
        if trimmed.is_empty() {
            return None;
        }
        let end = trimmed
            .iter()
            .position(|&b| b == b' ')
            .unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        Some(f)
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let inode = field()?;
    let path = trim_start(rest);
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    if perms.len() != 4 || end < start {
        return None;
    }
    let (mut path, mut deleted) = (path, false);
    if let Some(p) = path.strip_suffix(b" (deleted)") {
        path = p;
        deleted = true;
    }
    Some(Mapping {
        start,
        end,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        offset: hex(offset)?,
        inode: std::str::from_utf8(inode).ok()?.parse().ok()?,
        path: (!path.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(path))),
        deleted,
    })
}

fn trim_start(b: &[u8]) -> &[u8] {
    let i = b.iter().position(|&c| c != b' ').unwrap_or(b.len());
    &b[i..]
}

fn hex(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

/// What `/proc/PID/status` says that matters before a process is touched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Status {
    /// The command name (`Name:`, at most 15 bytes, as the kernel keeps it).
    pub(crate) name: String,
    /// `State:`'s letter: R, S, D, T (stopped), t (traced), Z, X ...
    pub(crate) state: char,
    /// Real, effective, saved and filesystem uids.
    pub(crate) uids: [u32; 4],
    /// The process tracing this one (0: none).
    pub(crate) tracer: u32,
}

/// `/proc/PID/status` read into a [`Status`]; `None` when it lacks the
/// lines every kernel writes.
pub(crate) fn parse_status(text: &str) -> Option<Status> {
    let mut st = Status::default();
    let (mut uids, mut state) = (false, false);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Name" => st.name = value.to_string(),
            "State" => {
                st.state = value.chars().next()?;
                state = true;
            }
            "Uid" => {
                let v: Vec<u32> = value
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .ok()?;
                st.uids = v.try_into().ok()?;
                uids = true;
            }
            "TracerPid" => st.tracer = value.parse().ok()?,
            _ => {}
        }
    }
    (uids && state).then_some(st)
}

/// Whether the process's effective capabilities (`CapEff:` of
/// `/proc/self/status`) include CAP_SYS_PTRACE (bit 19).
pub(crate) fn has_cap_sys_ptrace(status_text: &str) -> bool {
    const CAP_SYS_PTRACE: u32 = 19;
    status_text
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Whether a file name is one of PyTorch's core libraries, which every
/// process that imported torch maps (`torch/lib/libc10.so`,
/// `libtorch_cpu.so`, `libtorch_python.so`, ...).
pub(crate) fn is_torch_library(name: &str) -> bool {
    (name.starts_with("libc10.") || name.starts_with("libc10_") || name.starts_with("libtorch"))
        && name.contains(".so")
}

/// Whether a file name is a shared libpython (`libpython3.12.so.1.0`).
pub(crate) fn is_libpython(name: &str) -> bool {
    name.starts_with("libpython") && name.contains(".so")
}

/// Whether a file name is the C library (glibc's `libc.so.6`, musl's
/// `libc.musl-x86_64.so.1` / `ld-musl-*.so.1`).
pub(crate) fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so")
        || name.starts_with("libc-2.")
        || name.starts_with("libc.musl")
        || name.starts_with("ld-musl")
}

/// The distinct files of a map, in the order they first appear.
pub(crate) fn files(maps: &[Mapping]) -> Vec<&Path> {
    let mut out: Vec<&Path> = Vec::new();
    for m in maps {
        if let Some(p) = m.path.as_deref().filter(|p| p.is_absolute()) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &[u8] = b"\
55d0c6a00000-55d0c6a01000 r--p 00000000 fd:01 1835066                    /root/.pyenv/versions/3.11.7/bin/python3.11
55d0c6a01000-55d0c6a02000 r-xp 00001000 fd:01 1835066                    /root/.pyenv/versions/3.11.7/bin/python3.11
55d0c7c2e000-55d0c7f2f000 rw-p 00000000 00:00 0                          [heap]
7f1b2c000000-7f1b2c021000 rw-p 00000000 00:00 0 \n\
7f1b30a00000-7f1b30aaf000 r--p 00000000 fd:01 1836251                    /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f1b30aaf000-7f1b30d2e000 r-xp 000af000 fd:01 1836251                    /root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0
7f1b31000000-7f1b31028000 r--p 00000000 fd:01 1447                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f1b31028000-7f1b311bd000 r-xp 00028000 fd:01 1447                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f1b31400000-7f1b31401000 r--p 00000000 00:2e 99                         /tmp/a dir/with spaces/libc10.so (deleted)
7ffd1e5f0000-7ffd1e5f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
garbage line
";

    #[test]
    fn maps_lines_parse_with_paths_spaces_and_deleted_files() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 11, "{maps:#?}");
        let exe = &maps[1];
        assert_eq!(
            (exe.start, exe.end, exe.offset),
            (0x55d0c6a01000, 0x55d0c6a02000, 0x1000)
        );
        assert!(exe.read && exe.exec && !exe.write);
        assert_eq!(exe.inode, 1835066);
        assert_eq!(exe.file_name(), Some("python3.11"));
        assert_eq!(maps[2].special(), Some("[heap]"));
        assert_eq!(maps[2].file_name(), None);
        assert_eq!(maps[3].path, None);
        let spaced = &maps[8];
        assert_eq!(
            spaced.path.as_deref(),
            Some(Path::new("/tmp/a dir/with spaces/libc10.so"))
        );
        assert!(spaced.deleted);
        assert!(is_torch_library(spaced.file_name().unwrap()));
        assert_eq!(maps[9].special(), Some("[vdso]"));
        assert_eq!(maps[10].start, 0xffffffffff600000);
        assert_eq!(
            files(&maps)
                .iter()
                .map(|p| p.file_name().unwrap().to_str().unwrap())
                .collect::<Vec<_>>(),
            [
                "python3.11",
                "libpython3.11.so.1.0",
                "libc.so.6",
                "libc10.so"
            ]
        );
    }

    #[test]
    fn maps_refuses_malformed_lines() {
        for bad in [
            &b"zz-10 r-xp 0 fd:01 1 /x"[..],
            b"20-10 r-xp 0 fd:01 1 /x",
            b"10-20 r-x 0 fd:01 1 /x",
            b"10-20 r-xp 0 fd:01",
            b"10-20 r-xp 0 fd:01 notanumber /x",
            b"",
        ] {
            assert_eq!(parse_maps(bad), vec![], "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn status_gives_owner_state_and_tracer() {
        let text = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t42\nPid:\t42\n\
                    PPid:\t1\nTracerPid:\t0\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n";
        let st = parse_status(text).unwrap();
        assert_eq!(st.name, "python3");
        assert_eq!(st.state, 'S');
        assert_eq!(st.uids, [1000; 4]);
        assert_eq!(st.tracer, 0);
        let traced = text
            .replace("TracerPid:\t0", "TracerPid:\t77")
            .replace("S (sleeping)", "t (tracing stop)");
        let st = parse_status(&traced).unwrap();
        assert_eq!((st.state, st.tracer), ('t', 77));
        assert_eq!(parse_status("Name:\tx\n"), None);
        assert_eq!(parse_status("State:\tS\nUid:\t1 2 3\n"), None);
    }

    #[test]
    fn capabilities() {
        assert!(has_cap_sys_ptrace(
            "CapInh:\t0\nCapEff:\t000001ffffffffff\n"
        ));
        assert!(has_cap_sys_ptrace("CapEff:\t0000000000080000\n"));
        assert!(!has_cap_sys_ptrace("CapEff:\t00000000a80425fb\n"));
        assert!(!has_cap_sys_ptrace("CapEff:\t0000000000000000\n"));
        assert!(!has_cap_sys_ptrace(""));
    }

    #[test]
    fn library_names() {
        for yes in [
            "libc10.so",
            "libc10_cuda.so",
            "libtorch_cpu.so",
            "libtorch_python.so",
            "libtorch.so.2",
        ] {
            assert!(is_torch_library(yes), "{yes}");
        }
        for no in ["libc.so.6", "libcudart.so.12", "torch.py", "libc10.a"] {
            assert!(!is_torch_library(no), "{no}");
        }
        assert!(is_libpython("libpython3.12.so.1.0"));
        assert!(!is_libpython("python3.12"));
        assert!(is_libc("libc.so.6") && is_libc("libc-2.31.so") && is_libc("ld-musl-x86_64.so.1"));
        assert!(!is_libc("libc10.so") && !is_libc("libcap.so.2"));
    }
}
