//! Stand-ins for instrumented processes, for the exporter and fleet tests
//! (and `examples/serve_bench.rs`): each is a process of its own, the test
//! binary run again as its ignored `stand_in_producer` test, writing a
//! segment with the real writer: statistics of a known shape, one step
//! marker per step, its allocated floor rising by `leak` bytes a step; then
//! one statistics sample every `period` until its standard input closes
//! (the test ended, or died).
//!
//! A hostile stand-in ([`spawn_role_list_attack`]) first writes issue 44's
//! item 1: `n` allocations of 2^50 bytes at 0x1000·i with no segment
//! (overlapping orphan blocks), then one role list of `n` one-byte
//! tensors above all of them.
#![allow(dead_code)] // each test binary uses a part

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vramscope_wire::event::{EventKind, MarkSource, Stats};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::{monotonic_ns, Producer, SegmentConfig, SegmentWriter};

/// A running `vramscope serve --no-nvml` on a free loopback port,
/// watching `dir`, its `host` label `host`; killed when dropped.
pub(crate) struct Exporter {
    pub child: Child,
    /// host:port
    pub addr: String,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (For the tests; `examples/serve_bench.rs` names its binary with
/// [`exporter_at`].)
pub(crate) fn exporter(dir: &Path, host: &str) -> Exporter {
    let bin = match option_env!("CARGO_BIN_EXE_vramscope") {
        Some(b) => b,
        None => panic!("exporter() is for the integration tests"),
    };
    exporter_at(Path::new(bin), dir, host)
}

/// [`exporter`] of the binary `bin`.
pub(crate) fn exporter_at(bin: &Path, dir: &Path, host: &str) -> Exporter {
    let (child, line) = start_reading_a_line(
        Command::new(bin)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--no-nvml",
                "--host",
                host,
            ])
            .arg("--shm-dir")
            .arg(dir)
            .stderr(Stdio::inherit()),
    );
    let addr = line
        .trim()
        .strip_prefix("serving metrics on http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_string();
    Exporter { child, addr }
}

/// Starts `cmd` with its standard output piped; returns it and the first
/// line it printed (empty when it printed none).
pub(crate) fn start_reading_a_line(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

const ENV: &str = "VRAMSCOPE_STAND_IN";
/// When set, the orphans and role-list entries of the role-list attack.
const ROLES_ENV: &str = "VRAMSCOPE_STAND_IN_ROLES";

/// What a stand-in writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Allocated floor at the first step.
    pub base: u64,
    /// Floor growth per step.
    pub leak: u64,
    pub steps: u64,
    pub reserved: u64,
    pub inactive_split: u64,
    pub alloc_retries: u64,
    /// Statistics sample period afterwards, in ms.
    pub period_ms: u64,
}

impl Shape {
    /// The allocated figure once every step was written.
    pub(crate) fn allocated(&self) -> u64 {
        self.base + self.leak * (self.steps - 1)
    }
}

/// A running stand-in; killed when dropped.
pub(crate) struct StandIn {
    pub child: Child,
}

impl StandIn {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `exe` (a binary whose `args` run [`main`]) as a stand-in writing
/// into `dir` under `label`; returns once its segment is written.
pub(crate) fn spawn_with(exe: &Path, args: &[&str], dir: &Path, label: &str, s: Shape) -> StandIn {
    spawn_env(exe, args, dir, label, s, None)
}

/// [`spawn`] of a stand-in that first writes the role-list attack with
/// `n` orphans and `n` tensors (module doc).
pub(crate) fn spawn_role_list_attack(dir: &Path, label: &str, s: Shape, n: u64) -> StandIn {
    let exe = std::env::current_exe().unwrap();
    spawn_env(
        &exe,
        &PRODUCER_ARGS,
        dir,
        label,
        s,
        Some((ROLES_ENV, n.to_string())),
    )
}

fn spawn_env(
    exe: &Path,
    args: &[&str],
    dir: &Path,
    label: &str,
    s: Shape,
    env: Option<(&str, String)>,
) -> StandIn {
    let spec = format!(
        "{}|{label}|{}|{}|{}|{}|{}|{}|{}",
        dir.display(),
        s.base,
        s.leak,
        s.steps,
        s.reserved,
        s.inactive_split,
        s.alloc_retries,
        s.period_ms
    );
    let mut cmd = Command::new(exe);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .args(args)
        .env(ENV, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a stand-in");
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let ready = lines.any(|l| l.is_ok_and(|l| l.trim_end().ends_with("stand-in ready")));
    assert!(ready, "the stand-in did not start");
    StandIn { child }
}

/// The arguments that make a test binary run its `stand_in_producer` test
/// (that test alone).
const PRODUCER_ARGS: [&str; 5] = [
    "stand_in_producer",
    "--exact",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// [`spawn_with`] this test binary, running its `stand_in_producer` test.
pub(crate) fn spawn(dir: &Path, label: &str, s: Shape) -> StandIn {
    let exe = std::env::current_exe().unwrap();
    spawn_with(&exe, &PRODUCER_ARGS, dir, label, s)
}

/// [`spawn`] through `wrapper`, a command that runs what follows it
/// (`unshare --pid --fork …`).
pub(crate) fn spawn_through(wrapper: &[&str], dir: &Path, label: &str, s: Shape) -> StandIn {
    let exe = std::env::current_exe().unwrap();
    let mut args = wrapper[1..].to_vec();
    args.push(exe.to_str().unwrap());
    args.extend(PRODUCER_ARGS);
    spawn_with(Path::new(wrapper[0]), &args, dir, label, s)
}

fn write(
    seg: &SegmentWriter,
    kind: EventKind,
    words: &mut Vec<vramscope_wire::ring::codec::Words>,
) {
    write_to(seg, 0, kind, words);
}

fn write_to(
    seg: &SegmentWriter,
    ring: usize,
    kind: EventKind,
    words: &mut Vec<vramscope_wire::ring::codec::Words>,
) {
    words.clear();
    encode(
        &vramscope_wire::event::Event {
            time_ns: monotonic_ns(),
            kind,
        },
        1,
        words,
    );
    for w in words.iter() {
        let _ = seg.ring(ring).write(w);
    }
}

/// Issue 44, item 1: `n` allocations of 2^50 bytes at 0x1000·i on device
/// 0 with no segment, then a role list of `n` one-byte parameters above
/// all of them (each inside every block).
fn role_list_attack(
    seg: &SegmentWriter,
    n: u64,
    words: &mut Vec<vramscope_wire::ring::codec::Words>,
) {
    use vramscope_wire::event::{Held, Place};
    let place = Place::default();
    for i in 0..n {
        let alloc = EventKind::Alloc {
            place,
            addr: 0x1000 * i,
            size: 1 << 50,
        };
        write_to(seg, 1, alloc, words);
    }
    let above = 0x1000 * n;
    write(seg, EventKind::Roles { list: 1, count: n }, words);
    for i in 0..n {
        let role = EventKind::Role {
            list: 1,
            device: 0,
            addr: above + i,
            bytes: 1,
            held: Held::Parameter,
            module: 0,
        };
        write(seg, role, words);
    }
    write(seg, EventKind::RolesEnd { list: 1, count: n }, words);
}

fn stats(s: &Shape, allocated: u64) -> EventKind {
    EventKind::Stats {
        device: 0,
        stats: Stats {
            allocated,
            reserved: s.reserved,
            active: allocated,
            inactive_split: s.inactive_split,
            requested: allocated,
            allocated_peak: s.allocated() + (64 << 20),
            reserved_peak: s.reserved,
            active_peak: s.allocated() + (64 << 20),
            alloc_retries: s.alloc_retries,
            ooms: 0,
            segments: 4,
        },
    }
}

/// The stand-in's body, when this process was started as one (else
/// returns at once): never returns then.
pub(crate) fn main() {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let f: Vec<&str> = spec.split('|').collect();
    let n = |i: usize| f[i].parse::<u64>().unwrap();
    let s = Shape {
        base: n(2),
        leak: n(3),
        steps: n(4),
        reserved: n(5),
        inactive_split: n(6),
        alloc_retries: n(7),
        period_ms: n(8),
    };
    let attack: Option<u64> = std::env::var(ROLES_ENV).ok().and_then(|n| n.parse().ok());
    let slots = attack.map_or(4096, |n| (2 * n + 4096).next_power_of_two());
    let mut cfg = SegmentConfig::new(f[0], Producer::Test, 1, slots);
    cfg.label = f[1].to_string();
    let seg = SegmentWriter::create(&cfg).expect("create the segment");
    let mut words = Vec::new();
    if let Some(n) = attack {
        role_list_attack(&seg, n, &mut words);
    }
    for k in 0..s.steps {
        let floor = s.base + s.leak * k;
        write(&seg, stats(&s, floor + (64 << 20)), &mut words);
        write(&seg, stats(&s, floor), &mut words);
        let marker = EventKind::Marker {
            value: k,
            source: MarkSource::default(),
        };
        write(&seg, marker, &mut words);
    }
    println!("stand-in ready");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        let _ = tx.send(());
    });
    let period = Duration::from_millis(s.period_ms.max(1));
    while rx.recv_timeout(period).is_err() {
        write(&seg, stats(&s, s.allocated()), &mut words);
    }
    drop(seg);
    std::process::exit(0);
}
