//! Hostile inputs: numbers. Figures near `u64::MAX`, flags given NaN,
//! infinities, negatives and overflowing values, frame times centuries
//! ahead, a closed standard output, an endless trace line, a huge trace,
//! an implausible answer — and a panic behind the dashboard.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portable_pty::CommandBuilder;

use vramscope_core::input::{EventBatch, Identity, Input, Source};
use vramscope_core::model::Watch;
use vramscope_core::model::{Mode, ProcessKey};
use vramscope_core::recording::Recorder;
use vramscope_wire::event::{Event, EventKind, Stats};

use crate::common::{answering, vramscope};

const LEAVE_ALT: &[u8] = b"\x1b[?1049l";

/// Waits at most `limit` for `child`; kills it when it is still running.
fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// `cmd` in an 80×24 pseudo-terminal for at most `limit`: its exit status
/// (None: killed at the limit) and everything it wrote.
fn in_pty(cmd: CommandBuilder, limit: Duration) -> (Option<portable_pty::ExitStatus>, Vec<u8>) {
    let mut pty = crate::common::in_pty(cmd, 24, 80);
    let status = crate::common::exit_within(&mut *pty.child, limit);
    std::thread::sleep(Duration::from_millis(100));
    let bytes = pty.output.lock().unwrap().clone();
    (status, bytes)
}

const PID: u32 = 4242;

fn key() -> ProcessKey {
    ProcessKey {
        pid: PID,
        start_time: 1,
    }
}

/// A recording of one process: attached at `t0`, then one statistics event
/// per `(time, stats)`.
fn recording(path: &Path, t0: u64, samples: &[(u64, Stats)]) {
    recording_with(path, t0, samples, &[]);
}

/// [`recording`], then `extra` inputs.
fn recording_with(path: &Path, t0: u64, samples: &[(u64, Stats)], extra: &[(u64, Input)]) {
    let mut rec = Recorder::create(path).unwrap();
    let attach = Input::Attach {
        key: key(),
        identity: Identity::of_pid(PID),
        source: Source::unattached(Mode::Exact),
        watch: Watch::default(),
    };
    rec.write(t0, &attach).unwrap();
    for (i, (t, stats)) in samples.iter().enumerate() {
        let events = Input::Events(EventBatch {
            key: key(),
            events: vec![Event {
                time_ns: *t,
                kind: EventKind::Stats {
                    device: 0,
                    stats: *stats,
                },
            }],
            delivered: i as u64 + 1,
            lost: 0,
            lost_now: 0,
            at: vec![],
        });
        rec.write(*t, &events).unwrap();
    }
    for (t, input) in extra {
        rec.write(*t, input).unwrap();
    }
    rec.finish().unwrap();
}

fn stats(allocated: u64, reserved: u64) -> Stats {
    Stats {
        allocated,
        reserved,
        allocated_peak: allocated,
        reserved_peak: reserved,
        ..Stats::default()
    }
}

/// Item 4: figures near `u64::MAX` used to wrap the timeline's axis bound
/// to 0 and loop for good (a debug build panicked on the overflow).
#[test]
fn item_04_huge_figure_does_not_hang_the_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("huge.vsrec");
    let huge = Some(u64::MAX - 7);
    let machine = vramscope_core::input::Machine {
        gpus: vec![vramscope_core::input::Gpu {
            index: 0,
            name: "crafted".into(),
            uuid: None,
            total: huge,
            used: huge,
            free: Some(u64::MAX),
            util_gpu: Some(u32::MAX),
            util_mem: Some(u32::MAX),
            temperature_c: Some(u32::MAX),
            power_w: Some(f64::MAX),
        }],
        processes: vec![vramscope_core::input::GpuProcess {
            pid: PID,
            gpu: 0,
            used: huge,
        }],
        sampled_ns: Some(3_500),
        ..Default::default()
    };
    let nvml = Input::Machine {
        machine,
        host_pids: vec![(PID, key())],
        fresh: vec![],
    };
    recording_with(
        &rec,
        1_000,
        &[
            (2_000, stats(8_800_000_000_000_000_000, u64::MAX)),
            (3_000, stats(u64::MAX - 1, u64::MAX)),
        ],
        &[(3_500, nvml)],
    );
    let shot = dir.path().join("x.svg");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.arg("replay");
    cmd.arg(&rec);
    cmd.args([
        "--ui",
        "--pid",
        &PID.to_string(),
        "--screenshot-after",
        "500",
    ]);
    cmd.arg("--screenshot");
    cmd.arg(&shot);
    let (status, out) = in_pty(cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out);
    let status = status.unwrap_or_else(|| panic!("still running after 30 s: {text}"));
    assert!(status.success(), "{status:?}: {text}");
    let svg = std::fs::read_to_string(&shot).expect("the screenshot was written");
    assert!(svg.contains("Memory over time"), "the timeline was drawn");
    // The overview, with the same figures.
    let over = dir.path().join("o.svg");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.arg("replay");
    cmd.arg(&rec);
    cmd.args(["--ui", "--screenshot-after", "500", "--screenshot"]);
    cmd.arg(&over);
    let (status, out) = in_pty(cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out);
    assert!(status.is_some_and(|s| s.success()), "{text}");
    assert!(over.exists());
}

/// Item 10, the child: a dashboard whose driver's thread panics.
struct PanickingDriver;

impl vramscope_ui::Driver for PanickingDriver {
    fn refusal(&self) -> Option<&str> {
        Some("a test: nothing is sent")
    }
    fn on_signal(&self, _f: Box<dyn Fn() + Send + Sync>) {
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(400));
            panic!("injected: a background thread dies");
        });
    }
}

/// Item 10: a panic in a background thread restored the terminal while the
/// dashboard went on drawing on the main screen, deaf to `q`. Now it ends
/// the program (after restoring the terminal).
#[test]
fn item_10_a_panic_behind_the_dashboard_ends_the_program() {
    if std::env::var_os("VRAMSCOPE_ITEM10_CHILD").is_some() {
        let hub = Arc::new(vramscope_collect::Hub::default());
        let opts = vramscope_ui::UiOptions {
            mouse: false,
            ..vramscope_ui::UiOptions::default()
        };
        let r = vramscope_ui::run(hub, Arc::new(PanickingDriver), None, opts);
        // Not reached when the panic ends the program.
        eprintln!("the dashboard ended by itself: {r:?}");
        std::process::exit(7);
    }
    let mut cmd = CommandBuilder::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "numbers::item_10_a_panic_behind_the_dashboard_ends_the_program",
        "--nocapture",
        "--test-threads=1",
    ]);
    cmd.env("VRAMSCOPE_ITEM10_CHILD", "1");
    let (status, out) = in_pty(cmd, Duration::from_secs(15));
    let text = String::from_utf8_lossy(&out);
    let status = status.unwrap_or_else(|| panic!("the dashboard kept running: {text}"));
    assert_eq!(status.exit_code(), 101, "{text}");
    assert!(text.contains("injected"), "the panic is shown: {text}");
    let leave = out
        .windows(LEAVE_ALT.len())
        .position(|w| w == LEAVE_ALT)
        .expect("the alternate screen was left");
    // The terminal is not taken back after it was restored.
    let after = String::from_utf8_lossy(&out[leave..]);
    assert!(!after.contains("\x1b[?1049h"), "re-entered: {after}");
}

/// Item 11: every listed number, as a flag: one line naming the flag and
/// the accepted range, exit 2, nothing on stdout.
#[test]
fn item_11_every_bad_number_is_one_line_and_exit_2() {
    let mut cases: Vec<(Vec<&str>, &str)> = Vec::new();
    for v in ["-1", "nan", "inf", "0"] {
        cases.push((
            vec!["record", "-o", "x.vsrec", "--duration", v],
            "--duration",
        ));
    }
    for v in ["-1", "nan", "inf", "1e20", "0"] {
        cases.push((vec!["empty-cache", "1", "--timeout", v], "--timeout"));
    }
    for v in ["1e-300", "1e-9", "-1", "0", "nan", "inf"] {
        cases.push((vec!["replay", "f.vsrec", "--speed", v], "--speed"));
    }
    for v in ["-1", "0", "nan"] {
        cases.push((vec!["demo", "--speed", v], "--speed"));
    }
    for v in ["0", "-5", "nan"] {
        cases.push((vec!["demo", "--headless", "--duration", v], "--duration"));
    }
    for v in ["-1", "0", "nan", "1e300"] {
        cases.push((
            vec!["sim", "--trace", "t", "--capacity-gib", v],
            "--capacity-gib",
        ));
    }
    cases.push((vec!["--refresh", "-1"], "--refresh"));
    cases.push((vec!["--interval", "1.5"], "--interval"));
    cases.push((
        vec!["record", "-o", "x.vsrec", "--interval", "0"],
        "--interval",
    ));
    cases.push((
        vec!["demo", "--screenshot-after", "inf"],
        "--screenshot-after",
    ));
    for (args, flag) in cases {
        let out = vramscope().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(
            err.contains("must be") && err.contains("at most"),
            "{args:?} names the range: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// Item 11: a frame time centuries after the first made `replay --speed 1`
/// sleep for good; a wait between frames is now at most 5 s.
#[test]
fn item_11_replay_does_not_sleep_for_centuries() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("far.vsrec");
    recording(
        &rec,
        1_000,
        &[
            (2_000, stats(1 << 20, 2 << 20)),
            (1_000_000_000_000_000_000, stats(3 << 20, 4 << 20)),
        ],
    );
    let started = Instant::now();
    let mut child = vramscope()
        .args(["replay", "--json", "--speed", "1"])
        .arg(&rec)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(&mut child, Duration::from_secs(30)).expect("replay ended");
    assert!(status.success());
    assert!(started.elapsed() < Duration::from_secs(30));
    // In the dashboard, the far frame's times moved onto this clock stay
    // sane: it draws and quits on time.
    let shot = dir.path().join("far.svg");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.arg("replay");
    cmd.arg(&rec);
    cmd.args(["--ui", "--speed", "1000000", "--pid", &PID.to_string()]);
    cmd.args(["--screenshot-after", "800", "--screenshot"]);
    cmd.arg(&shot);
    let (status, out) = in_pty(cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out);
    assert!(status.is_some_and(|s| s.success()), "{text}");
    assert!(shot.exists());
}

/// Item 12: a closed standard output is the end of the output: exit 0,
/// nothing on stderr (each used to panic, exit 101).
#[test]
fn item_12_closed_pipe_is_the_end_of_output() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let rec = dir.path().join("r.vsrec");
    recording(&rec, 1_000, &[(2_000, stats(1 << 20, 2 << 20))]);
    let trace = dir.path().join("t.jsonl");
    let mut text = String::new();
    for i in 0..3000 {
        text.push_str(&format!("{{\"op\":\"alloc\",\"id\":{i},\"size\":4096}}\n"));
    }
    std::fs::write(&trace, text).unwrap();
    let (shm, rec, trace) = (
        shm.to_str().unwrap(),
        rec.to_str().unwrap(),
        trace.to_str().unwrap(),
    );
    let cases: Vec<Vec<&str>> = vec![
        vec!["snapshot", "--json", "--no-nvml", "--shm-dir", shm],
        vec!["snapshot", "--no-nvml", "--shm-dir", shm],
        vec!["rings", "--shm-dir", shm],
        vec!["sim", "--trace", trace],
        vec!["sim", "--json", "--trace", trace],
        vec!["replay", rec, "--json"],
        vec!["replay", rec],
        vec!["demo", "--headless", "--json", "--duration", "5"],
        vec!["demo", "--headless", "--duration", "5"],
        vec!["demo", "--list"],
    ];
    for args in cases {
        let mut child = vramscope()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before the command has written anything.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
    }
}

/// The peak resident set of a running process, in KiB (`VmHWM`, which an
/// `exec` resets, unlike `wait4`'s `ru_maxrss`).
fn peak_rss_kib(pid: u32) -> u64 {
    crate::common::proc_status::status_bytes(pid, "VmHWM:").expect("VmHWM in /proc/PID/status")
        / 1024
}

/// Item 13: `sim --trace` streamed its input: an endless line is one error
/// naming its line; a long trace runs in a few MiB and prints as it goes.
#[test]
fn item_13_sim_trace_streams() {
    // /dev/zero: one line, never ending.
    let mut child = vramscope()
        .args(["sim", "--trace", "/dev/zero"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(&mut child, Duration::from_secs(30)).expect("/dev/zero refused");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("line 1") && err.contains("1 MiB"), "{err}");

    // A long line later on is named by its number.
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long.jsonl");
    let mut text = "{\"op\":\"synchronize\"}\n\n".to_string();
    text.push_str(&"x".repeat(2 << 20));
    std::fs::write(&long, text).unwrap();
    let out = vramscope()
        .args(["sim", "--trace"])
        .arg(&long)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("line 3") && err.contains("1 MiB"), "{err}");

    // A million lines through a pipe: rows come out while the input is
    // still open, and the peak memory stays far below 64 MiB.
    let mut child = vramscope()
        .args(["sim", "--trace", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let counter = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut lines = 0u64;
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            lines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
        }
        lines
    });
    let line = |i: u64| -> String {
        let mut s = format!(
            "{{\"op\":\"alloc\",\"id\":{i},\"size\":{}}}\n",
            (i % 97 + 1) * 4096
        );
        if i >= 64 {
            s.push_str(&format!("{{\"op\":\"free\",\"id\":{}}}\n", i - 64));
        }
        s
    };
    let mut first = String::new();
    for i in 0..2000 {
        first.push_str(&line(i));
    }
    stdin.write_all(first.as_bytes()).unwrap();
    stdin.flush().unwrap();
    // Output before the end of the input: the trace is not read whole first.
    let pid = child.id();
    let status_path = format!("/proc/{pid}/io");
    let waited = Instant::now();
    let mut streamed = false;
    while waited.elapsed() < Duration::from_secs(20) {
        let io = std::fs::read_to_string(&status_path).unwrap_or_default();
        let written = io
            .lines()
            .find_map(|l| l.strip_prefix("wchar: "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if written > 0 {
            streamed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(streamed, "no output before the end of the input");
    let n: u64 = 500_000; // requests: about a million lines
    let mut chunk = String::new();
    for i in 2000..n {
        chunk.push_str(&line(i));
        if chunk.len() > 1 << 16 {
            stdin.write_all(chunk.as_bytes()).unwrap();
            chunk.clear();
        }
    }
    stdin.write_all(chunk.as_bytes()).unwrap();
    stdin.flush().unwrap();
    // All but the last pipe's worth is read: the peak, while it still runs.
    std::thread::sleep(Duration::from_millis(200));
    let rss_kib = peak_rss_kib(pid);
    drop(stdin);
    let rows = counter.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert!(rows > 2 * n - 64, "{rows} rows");
    eprintln!("sim --trace: {} lines, peak RSS {rss_kib} KiB", 2 * n - 64);
    assert!(rss_kib < 64 * 1024, "peak RSS {rss_kib} KiB");
}

/// Item 16: an empty-cache answer with more reserved after than before (or
/// absurd figures) is not printed as a release.
#[test]
fn item_16_implausible_empty_cache_answer_is_an_error() {
    use vramscope_wire::ring::{Producer, SegmentConfig, SegmentWriter, Status};
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 64);
    let seg = SegmentWriter::create(&cfg).unwrap();
    for (before, after) in [(1, u64::MAX), (u64::MAX, 0), (1 << 30, 2 << 30)] {
        let out = answering(
            &seg,
            |_| (Status::Ok, before, after),
            || {
                vramscope()
                    .args(["empty-cache", &std::process::id().to_string(), "--shm-dir"])
                    .arg(dir.path())
                    .output()
                    .unwrap()
            },
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{before} -> {after}: {err}");
        assert!(
            err.contains("implausible result") && err.contains(&after.to_string()),
            "{err}"
        );
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// Item 19: `--readonly` is a dashboard flag; with `empty-cache` it is
/// refused (exit 2) wherever it is written, and no command reaches the
/// process; its help says what it covers.
#[test]
fn item_19_readonly_never_reaches_a_process() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use vramscope_wire::ring::{Producer, SegmentConfig, SegmentWriter, Status};
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 64);
    let seg = SegmentWriter::create(&cfg).unwrap();
    let asked = AtomicU32::new(0);
    let pid = std::process::id().to_string();
    let shm = dir.path().to_str().unwrap();
    for args in [
        vec!["--readonly", "empty-cache", &pid, "--shm-dir", shm],
        vec!["empty-cache", "--readonly", &pid, "--shm-dir", shm],
        vec!["empty-cache", &pid, "--shm-dir", shm, "--readonly"],
    ] {
        let out = answering(
            &seg,
            |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                (Status::Ok, 2, 1)
            },
            || vramscope().args(&args).output().unwrap(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--readonly"), "{err}");
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "a command reached the process"
    );
    let help = vramscope().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--readonly"))
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains("dashboard"), "{line}");
}
