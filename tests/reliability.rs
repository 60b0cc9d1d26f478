//! Reliability (issue 25, items 2, 3, 10, 12, 13): a recording on a full
//! disk, a recording begun mid-run, `--readonly`, text from outside on
//! standard error, and the settings file. Each test reproduces the review's
//! case through the real binary. (A binary of its own: these tests run
//! demos inside the test process, which would disturb the RSS checks of
//! `tests/hostile/memory.rs`.)

use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentWriter, Status};

mod common;
use common::{answering, vramscope};

/// Runs `cmd` (its standard output discarded, its standard error kept) for
/// up to `limit`; kills it and fails the test past that (the review's hangs
/// ran for minutes).
fn finish_within(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still ran after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Item 2: `record -o /dev/full` beside a running demo printed "recording
/// stopped: No space left on device", then hung for good (the recorder's
/// lock taken twice). Now it stops at once, says why in one line, exit 1.
#[test]
fn item2_a_recording_on_a_full_disk_stops_and_says_so() {
    if !Path::new("/dev/full").exists() {
        println!("SKIPPED: item2: this machine has no /dev/full");
        return;
    }
    let shm = tempfile::tempdir().unwrap();
    let scenario = vramscope_collect::demo::scenario("leak", None).unwrap();
    let demo = vramscope_collect::demo::start(scenario, shm.path(), 50.0, None).unwrap();
    let out = finish_within(
        vramscope()
            .args(["record", "--no-nvml", "--duration", "20", "-o", "/dev/full"])
            .arg("--shm-dir")
            .arg(shm.path()),
        Duration::from_secs(10),
        "record -o /dev/full",
    );
    demo.stop();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("vramscope: writing the recording /dev/full")
            && last.contains("No space left on device"),
        "{err}"
    );
    assert_eq!(err.matches("No space left").count(), 1, "said once: {err}");
}

/// The figures of `open FILE --json --at N`.
fn open_at(file: &Path, at: usize) -> Value {
    let out = vramscope()
        .args(["open", "--json", "--at", &at.to_string()])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "open --at {at}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs the leak demo at `speed` on a 1,024-slot ring (it wraps within a
/// run), waits `after` seconds, records it for `secs` seconds into `rec`;
/// the scenario's restarts while it ran.
fn record_leak_demo_mid_run(rec: &Path, speed: f64, after: u64, secs: u64) -> u64 {
    let shm = tempfile::tempdir().unwrap();
    let scenario = vramscope_collect::demo::scenario("leak", None).unwrap();
    let demo =
        vramscope_collect::demo::start_with_slots(scenario, shm.path(), speed, None, 1024).unwrap();
    std::thread::sleep(Duration::from_secs(after));
    let out = vramscope()
        .args(["record", "--no-nvml", "--duration", &secs.to_string(), "-o"])
        .arg(rec)
        .arg("--shm-dir")
        .arg(shm.path())
        .output()
        .unwrap();
    let runs = demo.status().runs;
    demo.stop();
    assert!(out.status.success(), "{}", stderr(&out));
    runs
}

/// `sim --trace` on the recording `rec`: its exit status and standard
/// error.
fn sim_trace(rec: &Path) -> (ExitStatus, String) {
    let out = vramscope()
        .args(["sim", "--trace"])
        .arg(rec)
        .output()
        .unwrap();
    (out.status, stderr(&out))
}

/// Allocations in `open --json --trace`'s events that contradict the
/// file's state: walked back from the state, an `alloc` must find its block
/// live and a `free_requested` must find it not yet live again.
fn contradictions(v: &Value) -> usize {
    let mut live = std::collections::HashSet::new();
    let devices = v["state"]["processes"][0]["view"]["devices"]
        .as_array()
        .unwrap();
    for s in devices
        .iter()
        .flat_map(|d| d["segments"].as_array().unwrap())
    {
        for b in s["blocks"].as_array().unwrap() {
            if b["state"] != "Inactive" {
                live.insert(b["addr"].as_u64().unwrap());
            }
        }
    }
    let mut bad = 0;
    for e in v["events"].as_array().unwrap().iter().rev() {
        let addr = e["addr"].as_u64().unwrap_or(0);
        match e["action"].as_str().unwrap_or("") {
            "alloc" if !live.remove(&addr) => bad += 1,
            "free_requested" if !live.insert(addr) => bad += 1,
            _ => {}
        }
    }
    bad
}

/// Item 3: a recording started while looping demos ran gave `sim --trace`
/// "0 of 23232 samples match" and `export` a trace covering 418 s in which
/// 1,464 allocations land on addresses still live: the rings' backlog (the
/// job's history before the recording, and earlier runs of the scenario)
/// was replayed as if it led to the recorded state. Now `export` starts
/// from the anchor snapshot and at the last new run, and `sim` replays the
/// last run (which starts from an empty allocator), or refuses in one line
/// when the recording holds no start it can replay from.
#[test]
fn item3_a_recording_begun_mid_run_starts_from_its_anchor() {
    // A ring of 1,024 slots wraps within a run of the leak scenario (about
    // 4,600 events over 30 simulated seconds, 3 s at speed 10): the
    // recording, begun 2 s in, starts mid-run; the scenario ends, holds its
    // last picture 10 s and starts over while it records.
    let files = tempfile::tempdir().unwrap();
    let rec = files.path().join("mid.vsr");
    let runs = record_leak_demo_mid_run(&rec, 10.0, 2, 14);
    assert!(runs >= 1, "the scenario started over while recording");

    let replay = vramscope()
        .arg("replay")
        .arg(&rec)
        .arg("--json")
        .output()
        .unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
    let replay: Value = serde_json::from_slice(&replay.stdout).unwrap();
    let watch = &replay["processes"][0]["view"]["watch"];
    assert_eq!(
        watch["mid_run"], true,
        "the recording began mid-run: {watch}"
    );

    // sim: the last run, from an empty allocator: every sample matches.
    let (sim, err) = sim_trace(&rec);
    assert!(sim.success(), "{err}");
    assert!(err.contains("the replay is of the last"), "{err}");
    let summary = err
        .lines()
        .find(|l| l.contains("recorded statistics samples match"))
        .unwrap_or_else(|| panic!("{err}"));
    let words: Vec<&str> = summary.split_whitespace().collect();
    let of = words.iter().position(|w| *w == "of").unwrap();
    assert_eq!(words[of - 1], words[of + 1], "{summary}");
    assert_ne!(words[of - 1], "0", "{summary}");

    // export: the trace walks back from the exported state without a
    // contradiction, and spans no more than the recording.
    let pickle = files.path().join("mid.pickle");
    let out = vramscope()
        .arg("export")
        .arg(&rec)
        .arg("-o")
        .arg(&pickle)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let whole = vramscope()
        .args(["open", "--json", "--trace"])
        .arg(&pickle)
        .output()
        .unwrap();
    assert!(whole.status.success(), "{}", stderr(&whole));
    let whole: Value = serde_json::from_slice(&whole.stdout).unwrap();
    let events = whole["events"].as_array().unwrap();
    assert!(!events.is_empty(), "the new run's events are in the trace");
    let t = |e: &Value| e["time_ns"].as_u64().unwrap();
    let span = t(events.last().unwrap()) - t(&events[0]);
    assert!(span <= 15_000_000_000, "the trace spans {span} ns");
    assert_eq!(contradictions(&whole), 0);
    let entries = events.len();
    for i in 0..=10 {
        let at = entries * i / 10;
        let v = open_at(&pickle, at);
        let d = &v["devices"][0];
        let (alloc, reserved) = (
            d["allocated"].as_u64().unwrap(),
            d["reserved"].as_u64().unwrap(),
        );
        assert!(
            alloc <= reserved,
            "at {at} of {entries}: allocated {alloc} > reserved {reserved}"
        );
    }
}

/// A recording that began mid-run and holds no new run: `sim` refuses in
/// one line rather than replay requests on an allocator it never saw.
#[test]
fn item3_sim_refuses_a_mid_run_recording_without_a_start() {
    let files = tempfile::tempdir().unwrap();
    let rec = files.path().join("mid.vsr");
    record_leak_demo_mid_run(&rec, 3.0, 3, 2);
    let (sim, err) = sim_trace(&rec);
    assert_eq!(sim.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("already running when the recording began"),
        "{err}"
    );
}

/// A segment whose producer answers every command "unsupported" and
/// counts them; it writes no events, so the model wants a snapshot of it.
fn unsupported_producer(dir: &Path) -> SegmentWriter {
    // A producer kind that takes commands, with events and statistics
    // (exact mode: the model wants a state snapshot until it has one).
    let mut cfg = SegmentConfig::new(dir, Producer::Simulator, 1, 64);
    cfg.flags = 15;
    cfg.tag = Some("unsupported".into());
    SegmentWriter::create(&cfg).unwrap()
}

/// Runs the headless dashboard on `dir` for 7 s with `extra` flags while the
/// producer answers "unsupported"; the number of commands it was sent.
fn commands_sent_to(dir: &Path, extra: &[&str]) -> usize {
    let seg = unsupported_producer(dir);
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let shot = tempfile::tempdir().unwrap();
    answering(
        &seg,
        |_| {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (Status::Unsupported, 0, 0)
        },
        || {
            let out = finish_within(
                vramscope()
                    .args(["--no-nvml", "--screenshot-after", "7000", "--screenshot"])
                    .arg(shot.path().join("x.svg"))
                    .arg("--shm-dir")
                    .arg(dir)
                    .args(extra),
                Duration::from_secs(30),
                "the dashboard",
            );
            assert!(out.status.success(), "{}", stderr(&out));
        },
    );
    asked.into_inner()
}

/// Item 10: under `--readonly` the collector still posted SNAPSHOT
/// requests for resyncs (420 in one run), and a producer that answers
/// "unsupported" was asked again every 2 s. Now: nothing under
/// `--readonly`, and one request otherwise.
#[test]
fn item10_readonly_sends_nothing_and_unsupported_is_asked_once() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(commands_sent_to(dir.path(), &["--readonly"]), 0);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(commands_sent_to(dir.path(), &[]), 1);
}

/// The bytes a terminal would act on: ESC, BEL, CSI (C1) and the other
/// control characters but a final newline.
fn assert_no_control(what: &str, text: &str) {
    let bad: Vec<char> = text
        .trim_end_matches('\n')
        .chars()
        .filter(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(c))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: control characters {bad:?} in {text:?}"
    );
}

/// Item 12: file names in `open`/`export`/`replay` errors and a settings
/// key in the settings error reached the terminal raw (`\e[2J`, OSC 0, OSC
/// 52, OSC 8). Every line on standard error goes through one function now.
#[test]
fn item12_names_and_keys_from_outside_reach_stderr_printable() {
    let dir = tempfile::tempdir().unwrap();
    let name = "x\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x1b]8;;http:e\x07\u{9b}1m\u{202e}";
    let bad = dir.path().join(name);
    std::fs::write(&bad, b"not a snapshot nor a recording").unwrap();
    let missing = dir.path().join(format!("{name}-missing"));
    let runs: Vec<(&str, Vec<std::ffi::OsString>)> = vec![
        (
            "open",
            vec!["open".into(), "--json".into(), bad.clone().into()],
        ),
        (
            "open (missing)",
            vec!["open".into(), missing.clone().into()],
        ),
        (
            "export",
            vec![
                "export".into(),
                bad.clone().into(),
                "-o".into(),
                dir.path().join("o").into(),
            ],
        ),
        ("replay", vec!["replay".into(), bad.clone().into()]),
        (
            "replay (missing)",
            vec!["replay".into(), missing.clone().into()],
        ),
        ("sim", vec!["sim".into(), "--trace".into(), missing.into()]),
    ];
    for (what, args) in runs {
        let out = vramscope().args(&args).output().unwrap();
        assert!(!out.status.success(), "{what}");
        let err = stderr(&out);
        assert!(
            err.contains('\u{fffd}'),
            "{what}: the name is shown: {err:?}"
        );
        assert_no_control(what, &err);
    }
    // The settings file: a key with escapes in it.
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, "[dashboard]\n\"k\\u001b[2J\\u001b]0;t\\u0007\" = 1\n").unwrap();
    let out = vramscope()
        .env("VRAMSCOPE_CONFIG", &cfg)
        .args(["--no-nvml", "--screenshot-after", "0", "--screenshot"])
        .arg(dir.path().join("s.svg"))
        .arg("--shm-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("unknown field `k\u{fffd}[2J"), "{err:?}");
    assert_no_control("settings", &err);
}

/// Item 12, the class: nothing under `src/` or `crates/` writes to standard error but
/// `text::stderr_line` (which makes every line printable).
#[test]
fn item12_every_stderr_line_goes_through_one_function() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut dirs = vec![root.join("src"), root.join("crates")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") || p.ends_with("crates/text/src/lib.rs") {
                continue;
            }
            let mut text = String::new();
            std::fs::File::open(&p)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains("eprintln!")
                    || code.contains("eprint!")
                    || code.contains("io::stderr()")
                {
                    found.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "standard error written around vramscope_text::stderr_line:\n{}",
        found.join("\n")
    );
}

/// Runs the headless dashboard with `VRAMSCOPE_CONFIG=config`.
fn dashboard_with_config(config: &Path) -> Output {
    let dir = tempfile::tempdir().unwrap();
    finish_within(
        vramscope()
            .env("VRAMSCOPE_CONFIG", config)
            .args(["--no-nvml", "--screenshot-after", "0", "--screenshot"])
            .arg(dir.path().join("s.svg"))
            .arg("--shm-dir")
            .arg(dir.path()),
        Duration::from_secs(10),
        "the dashboard",
    )
}

/// Item 13: `VRAMSCOPE_CONFIG=/dev/zero` read until memory ran out, a FIFO
/// hung for good. Regular files only, at most 64 KiB.
#[test]
fn item13_settings_file_is_a_small_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let big = dir.path().join("big.toml");
    std::fs::write(
        &big,
        format!("[dashboard]\n{}", "# padding\n".repeat(10_000)),
    )
    .unwrap();
    for (file, why) in [
        (Path::new("/dev/zero"), "not a regular file"),
        (fifo.as_path(), "not a regular file"),
        (dir.path(), "not a regular file"),
        (big.as_path(), "larger than 64 KiB"),
    ] {
        let out = dashboard_with_config(file);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", file.display());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&file.display().to_string()) && err.contains(why),
            "{}: {err}",
            file.display()
        );
    }
}
