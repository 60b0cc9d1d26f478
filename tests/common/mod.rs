//! Helpers shared by the integration tests: the binary, a producer's side of
//! a segment (writing events, answering commands), and output checks.
#![allow(dead_code)] // each test binary uses a part

use std::process::{Command as Proc, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use vramscope_wire::event::{Event, EventKind};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::control::Request;
use vramscope_wire::ring::{SegmentWriter, Status};

pub(crate) mod fit_truth;
pub(crate) mod proc_status;

/// The `vramscope` binary under test.
pub(crate) fn vramscope() -> Proc {
    Proc::new(env!("CARGO_BIN_EXE_vramscope"))
}

/// The dashboard (no NVML) on the segment directory `dir`, no terminal:
/// an 80×24 screenshot into `shot` after 100 ms.
pub(crate) fn dashboard_screenshot(dir: &std::path::Path, shot: &std::path::Path) -> Proc {
    let mut cmd = vramscope();
    cmd.args(["--no-nvml", "--shm-dir"])
        .arg(dir)
        .args([
            "--size",
            "80x24",
            "--screenshot-after",
            "100",
            "--screenshot",
        ])
        .arg(shot);
    cmd
}

/// The text of an SVG frame, one line per row (the tspans joined).
pub(crate) fn svg_text(path: &std::path::Path) -> String {
    let svg = std::fs::read_to_string(path).unwrap();
    svg.split("<text ")
        .skip(1)
        .map(|line| {
            line.split("<tspan")
                .skip(1)
                .filter_map(|t| t.split_once('>').map(|(_, rest)| rest))
                .filter_map(|t| t.split_once("</tspan>").map(|(text, _)| text))
                .collect::<String>()
                .replace("&gt;", ">")
                .replace("&lt;", "<")
                .replace("&amp;", "&")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the command succeeded (showing its stderr if not); returns it.
pub(crate) fn succeeded(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A committed recording, `DIR/NAME.vsrec` or (larger ones, gzipped)
/// `DIR/NAME.vsrec.gz` unpacked into a temporary file.
pub(crate) enum Recording {
    Plain(std::path::PathBuf),
    Unpacked(tempfile::NamedTempFile),
}

impl Recording {
    pub(crate) fn path(&self) -> &std::path::Path {
        match self {
            Recording::Plain(p) => p,
            Recording::Unpacked(t) => t.path(),
        }
    }
}

/// The recording `DIR/NAME.vsrec` or `DIR/NAME.vsrec.gz`.
pub(crate) fn recording(dir: &std::path::Path, name: &str) -> Recording {
    let raw = dir.join(format!("{name}.vsrec"));
    if raw.exists() {
        return Recording::Plain(raw);
    }
    let gz = std::fs::File::open(dir.join(format!("{name}.vsrec.gz"))).unwrap();
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    std::io::copy(&mut flate2::read::GzDecoder::new(gz), &mut tmp).unwrap();
    Recording::Unpacked(tmp)
}

/// A job recorded on a GPU machine with what torch said of it
/// (`DIR/NAME.vsrec` or `DIR/NAME.vsrec.gz`, and `DIR/NAME.truth.json`,
/// whose `pid` is the job's): the truth, and the job's process as
/// `vramscope replay --json` of the recording leaves it.
pub(crate) fn replayed_job(
    dir: &std::path::Path,
    name: &str,
) -> (serde_json::Value, serde_json::Value) {
    replayed_jobs(dir, name).swap_remove(0)
}

/// [`replayed_job`] for a job of several processes (the ranks of a
/// distributed job): one truth per process, `NAME.truth.json` for the
/// first and `NAME.truth.json.rankN` for the others, each with the
/// process it names, replayed once.
pub(crate) fn replayed_jobs(
    dir: &std::path::Path,
    name: &str,
) -> Vec<(serde_json::Value, serde_json::Value)> {
    let rec = recording(dir, name);
    let out = vramscope()
        .arg("replay")
        .arg(rec.path())
        .arg("--json")
        .output()
        .unwrap();
    let snap: serde_json::Value = serde_json::from_slice(&succeeded(out).stdout).unwrap();
    let mut truths: Vec<std::path::PathBuf> = (std::fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let f = p.file_name().unwrap().to_string_lossy();
            f == format!("{name}.truth.json") || f.starts_with(&format!("{name}.truth.json.rank"))
        })
        .collect();
    truths.sort();
    assert!(!truths.is_empty(), "no truth for {name}");
    truths
        .into_iter()
        .map(|f| {
            let truth: serde_json::Value =
                serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
            let p = (snap["processes"].as_array().unwrap().iter())
                .find(|p| p["identity"]["host_pid"] == truth["pid"])
                .unwrap_or_else(|| panic!("pid {} not in {name}", truth["pid"]))
                .clone();
            (truth, p)
        })
        .collect()
}

/// Asserts the command exited with status `code` (showing its stderr if
/// not); returns its stderr.
pub(crate) fn exited_with(code: i32, out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{err}");
    err
}

/// Writes `kind` at time `t` into ring `ring` of `seg` (statistics take two
/// records); every record must fit.
pub(crate) fn write_at(seg: &SegmentWriter, ring: usize, kind: EventKind, t: u64) {
    let mut words = Vec::new();
    encode(&Event { time_ns: t, kind }, 1, &mut words);
    for w in &words {
        assert!(seg.ring(ring).write(w));
    }
}

/// [`write_at`] now.
pub(crate) fn write(seg: &SegmentWriter, ring: usize, kind: EventKind) {
    write_at(seg, ring, kind, vramscope_wire::ring::monotonic_ns());
}

/// Runs `body` while `seg`'s producer answers every command with `answer`
/// (from another thread, polling every millisecond); returns `body`'s result.
pub(crate) fn answering<R>(
    seg: &SegmentWriter,
    answer: impl Fn(&Request) -> (Status, u64, u64) + Sync,
    body: impl FnOnce() -> R,
) -> R {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let server = seg.command_server();
            while !stop.load(Ordering::Acquire) {
                if let Some(req) = server.poll() {
                    let (status, r0, r1) = answer(&req);
                    server.answer(req, status, r0, r1);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let r = body();
        stop.store(true, Ordering::Release);
        r
    })
}

/// Writes a complete state snapshot `id` of device 0 into ring 0 at time
/// `t`: one large-pool segment at `addr` cut into `blocks` (size, state),
/// back to back; each block's requested size is its size.
pub(crate) fn write_snapshot(
    seg: &SegmentWriter,
    id: u32,
    t: u64,
    addr: u64,
    blocks: &[(u64, vramscope_wire::event::BlockState)],
) {
    write_snapshot_at(seg, id, t, addr, blocks, None);
}

/// [`write_snapshot`] placed in the device ring at `at` (FORMAT.md,
/// "Positions"; a hostile producer's may lie).
pub(crate) fn write_snapshot_at(
    seg: &SegmentWriter,
    id: u32,
    t: u64,
    addr: u64,
    blocks: &[(u64, vramscope_wire::event::BlockState)],
    at: Option<vramscope_wire::event::RingSpan>,
) {
    use vramscope_wire::event::{Place, SegmentPool};
    let size: u64 = blocks.iter().map(|(s, _)| s).sum();
    let begin = EventKind::SnapshotBegin {
        device: 0,
        id,
        segments: 1,
        blocks: blocks.len() as u64,
        at,
    };
    write_at(seg, 0, begin, t);
    let segment = EventKind::SnapshotSegment {
        id,
        place: Place::default(),
        addr,
        size,
        pool_kind: SegmentPool::Large,
        expandable: false,
    };
    write_at(seg, 0, segment, t);
    let mut at = addr;
    for &(size, state) in blocks {
        let block = EventKind::SnapshotBlock {
            id,
            device: 0,
            addr: at,
            size,
            requested: size,
            state,
            ctx: Default::default(),
        };
        write_at(seg, 0, block, t);
        at += size;
    }
    write_at(seg, 0, EventKind::SnapshotEnd { device: 0, id }, t);
}

/// Everything `reader` yields (a pty's output), collected on a thread of
/// its own until the other end closes.
pub(crate) fn collect_output(
    mut reader: impl std::io::Read + Send + 'static,
) -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = output.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    output
}

/// A command running in a pseudo-terminal: its keyboard and everything it
/// writes ([`collect_output`]).
pub(crate) struct Pty {
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    /// The pty's side of this process, open while the command runs.
    pub master: Box<dyn portable_pty::MasterPty + Send>,
    pub keys: Box<dyn std::io::Write + Send>,
    pub output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

/// Starts `cmd` in a `rows`×`cols` pseudo-terminal, `TERM=xterm-256color`.
pub(crate) fn in_pty(mut cmd: portable_pty::CommandBuilder, rows: u16, cols: u16) -> Pty {
    let pair = portable_pty::native_pty_system()
        .openpty(portable_pty::PtySize {
            rows,
            cols,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("a pty");
    cmd.env("TERM", "xterm-256color");
    let child = pair.slave.spawn_command(cmd).expect("spawn in a pty");
    drop(pair.slave);
    let keys = pair.master.take_writer().unwrap();
    let output = collect_output(pair.master.try_clone_reader().unwrap());
    Pty {
        child,
        master: pair.master,
        keys,
        output,
    }
}

/// The `rows`×`cols` screen a terminal shows after `bytes` (frames redraw
/// only what changed).
pub(crate) fn screen(bytes: &[u8], rows: u16, cols: u16) -> vt100::Parser {
    let mut term = vt100::Parser::new(
        std::num::NonZeroU16::new(rows).unwrap(),
        std::num::NonZeroU16::new(cols).unwrap(),
        0,
    );
    term.process(bytes);
    term
}

/// The binary under test with `args`, in a `rows`×`cols` pseudo-terminal.
pub(crate) fn vramscope_in_pty(args: &[&str], rows: u16, cols: u16) -> Pty {
    let mut cmd = portable_pty::CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.args(args);
    in_pty(cmd, rows, cols)
}

/// Waits at most `limit` for `child` to exit; past that kills it (None).
pub(crate) fn exit_within(
    child: &mut (dyn portable_pty::Child + Send + Sync),
    limit: Duration,
) -> Option<portable_pty::ExitStatus> {
    let end = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host pid of the process a fresh `unshare --pid --fork` (a child of
/// `parent`) started as pid 1 of its new pid namespace, once it exists
/// (within `wait`). Read through the procfs crate.
pub(crate) fn namespace_init(parent: u32, wait: Duration) -> Option<u32> {
    let start = std::time::Instant::now();
    while start.elapsed() < wait {
        for p in procfs::process::all_processes().ok()?.flatten() {
            let Ok(stat) = p.stat() else { continue };
            let pid = p.pid as u32;
            let ns = vramscope_wire::ring::discover::proc_ns_pids(pid);
            if stat.ppid as u32 == parent && ns.is_some_and(|v| v.len() > 1 && v.last() == Some(&1))
            {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// How a hub playing a recording runs the live advisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Advising {
    Off,
    /// On every process from the start (`--advise`).
    All,
    /// On a process once a snapshot shows its projected forecast (the
    /// dashboard and `serve` without `--advise`).
    WhenForecast,
}

/// A recording played through a hub (with the live advisor as `advise`
/// says), read at each of the job's own step marks (`vramscope.mark`,
/// MARKER source User) as the dashboard reads it: (step, the process's
/// forecast then).
pub(crate) fn forecasts_at_marks(
    path: &std::path::Path,
    advise: Advising,
) -> Vec<(u64, Option<vramscope_core::model::forecast::Forecast>)> {
    (marks_seen(path, advise, None).into_iter())
        .map(|(step, f, _)| (step, f))
        .collect()
}

/// [`forecasts_at_marks`], and the advisor's stop reason at each mark;
/// `lose`: (step, count) events lost on the wire as that step's mark is
/// read.
pub(crate) fn marks_seen(
    path: &std::path::Path,
    advise: Advising,
    lose: Option<(u64, u64)>,
) -> Vec<(
    u64,
    Option<vramscope_core::model::forecast::Forecast>,
    Option<String>,
)> {
    use vramscope_core::input::{EventBatch, Input};
    use vramscope_wire::event::MarkSource;
    let mut r = vramscope_core::recording::Replayer::open(path).unwrap();
    let hub = vramscope_collect::Hub::default();
    match advise {
        Advising::Off => {}
        Advising::All => hub.enable_advisor(true, false, None),
        Advising::WhenForecast => hub.advise_forecasts(false, None),
    }
    let opts = vramscope_core::model::ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    };
    let mut out = Vec::new();
    while let Some((t, input)) = r.next_input().unwrap() {
        let Input::Events(batch) = input else {
            hub.apply(input);
            continue;
        };
        for piece in batch.split_after_markers() {
            let key = piece.key;
            let mark = piece.events.last().and_then(|e| match e.kind {
                EventKind::Marker {
                    value,
                    source: MarkSource::User,
                } => Some((value, e.time_ns)),
                _ => None,
            });
            hub.apply(Input::Events(piece));
            if let Some((step, at)) = mark {
                if let Some((_, n)) = lose.filter(|l| l.0 == step) {
                    let mut lost = EventBatch::whole(key, Vec::new());
                    (lost.lost, lost.lost_now) = (n, n);
                    hub.apply(Input::Events(lost));
                }
                if advise != Advising::Off {
                    hub.advisor_flush(Duration::from_secs(30));
                }
                let snap = hub.snapshot_at_for(at.max(t), &opts, Some(key));
                let p = snap.processes.iter().find(|p| p.key() == key).unwrap();
                let stopped = p.advice.as_ref().and_then(|a| a.coverage.stopped.clone());
                out.push((step, p.view.forecast, stopped));
            }
        }
    }
    out
}
