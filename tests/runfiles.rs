//! The files the commands read (issue 44, items 2, 3, 6, 8, 9): recordings
//! and PyTorch snapshot files given to `diff`, `open`, `replay`, `export`,
//! `sim --trace` and `advise FILE`: peaks never below the state a file
//! holds, the CI gate against a run of 0 B, files from a pipe, the tool's
//! own export read back as it was written, and recordings cut short.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{exited_with, succeeded, vramscope};
use serde_json::Value;
use vramscope_core::input::{EventBatch, Identity, Input, Source};
use vramscope_core::model::{Mode, ProcessKey, Watch};
use vramscope_core::sim::{Scenario, ScenarioRunner};

const MIB: u64 = 1 << 20;

fn snapshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/torch-2.11")
}

fn pickle(name: &str) -> PathBuf {
    snapshots().join(format!("torch-2.11-{name}.pickle"))
}

/// A demo scenario run to its end as a recording: the process attached,
/// then its events in batches of 64, as a collector delivers them.
fn scenario_recording(name: &str, path: &Path) {
    let mut events = Vec::new();
    ScenarioRunner::new(Scenario::by_name(name).unwrap()).run_to_end(&mut events);
    let key = ProcessKey {
        pid: 4242,
        start_time: 1,
    };
    let mut rec = vramscope_core::recording::Recorder::create(path).unwrap();
    let attach = Input::Attach {
        key,
        identity: Identity {
            name: format!("demo: {name}"),
            ..Identity::of_pid(4242)
        },
        source: Source::unattached(Mode::Exact),
        watch: Watch::default(),
    };
    rec.write(events[0].time_ns, &attach).unwrap();
    for (i, batch) in events.chunks(64).enumerate() {
        let input = Input::Events(EventBatch {
            key,
            events: batch.to_vec(),
            delivered: (i * 64 + batch.len()) as u64,
            lost: 0,
            lost_now: 0,
            at: Vec::new(),
        });
        rec.write(batch[0].time_ns, &input).unwrap();
    }
    rec.finish().unwrap();
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    vramscope().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: Output) -> Value {
    serde_json::from_slice(&succeeded(o).stdout).unwrap()
}

// ---------------------------------------------------------------------
// Item 9: a recording cut short is read up to its last complete frame.
// ---------------------------------------------------------------------

/// The byte offsets where each frame of a recording starts (after the
/// 16-byte header).
fn frame_starts(bytes: &[u8]) -> Vec<usize> {
    let mut at = 16;
    let mut out = Vec::new();
    while at + 4 <= bytes.len() {
        out.push(at);
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 4 + len;
    }
    out
}

#[test]
fn item9_a_recording_cut_short_is_read_to_its_last_complete_frame() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("leak.vsrec");
    scenario_recording("leak", &whole);
    let bytes = std::fs::read(&whole).unwrap();
    let starts = frame_starts(&bytes);
    let last = *starts.last().unwrap();
    // What the reader must keep: the file up to the last complete frame.
    let kept = dir.path().join("kept.vsrec");
    std::fs::write(&kept, &bytes[..last]).unwrap();
    // A torn final frame (its length and 9 of its bytes), as a recorder
    // killed mid-write leaves it; and a torn frame header (2 of 4 bytes).
    let torn = dir.path().join("torn.vsrec");
    std::fs::write(&torn, &bytes[..last + 4 + 9]).unwrap();
    let torn_header = dir.path().join("torn-header.vsrec");
    std::fs::write(&torn_header, &bytes[..last + 2]).unwrap();
    let want = json(run(&[
        "replay".as_ref(),
        kept.as_os_str(),
        "--json".as_ref(),
    ]));
    let frames = starts.len() - 1;
    let out = dir.path().join("out.pickle");
    for (file, what) in [(&torn, "9"), (&torn_header, "2")] {
        // Every reader of recordings reads it, and says once where it stopped.
        let readers: Vec<Vec<&std::ffi::OsStr>> = vec![
            vec!["replay".as_ref(), file.as_os_str(), "--json".as_ref()],
            vec![
                "replay".as_ref(),
                file.as_os_str(),
                "--diff".as_ref(),
                "3..5".as_ref(),
            ],
            vec![
                "export".as_ref(),
                file.as_os_str(),
                "-o".as_ref(),
                out.as_os_str(),
            ],
            vec!["diff".as_ref(), file.as_os_str(), kept.as_os_str()],
            vec!["sim".as_ref(), "--trace".as_ref(), file.as_os_str()],
            vec!["advise".as_ref(), file.as_os_str()],
        ];
        for args in readers {
            let o = run(&args);
            let err = stderr(&o);
            assert!(o.status.success(), "{args:?}: {err}");
            let said: Vec<&str> = err.lines().filter(|l| l.contains("cut short")).collect();
            assert_eq!(said.len(), 1, "{args:?}: {err}");
            let line = said[0];
            assert!(
                line.contains(&format!("at byte {last}"))
                    && line.contains(&format!("after {frames} complete frames"))
                    && line.contains(what),
                "{args:?}: {line}"
            );
        }
        // What is read is everything before the torn frame.
        let got = json(run(&[
            "replay".as_ref(),
            file.as_os_str(),
            "--json".as_ref(),
        ]));
        assert_eq!(
            got["processes"][0]["view"]["figures"],
            want["processes"][0]["view"]["figures"]
        );
    }
    // A complete file says nothing of the kind.
    let o = succeeded(run(&["replay".as_ref(), whole.as_os_str()]));
    assert!(!stderr(&o).contains("cut short"), "{}", stderr(&o));
}

// ---------------------------------------------------------------------
// Item 6: files from a pipe.
// ---------------------------------------------------------------------

/// `vramscope ARGS` through bash, so that ARGS may hold `<(…)`; `{v}` in
/// ARGS is the binary.
fn through_bash(args: &str) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("exec \"$V\" {args}"))
        .env("V", env!("CARGO_BIN_EXE_vramscope"))
        .output()
        .unwrap()
}

/// `path` as bash quotes it.
fn q(path: &Path) -> String {
    format!("'{}'", path.display())
}

/// What a diff says, without the files' names (a pipe's is `/dev/fd/N`).
fn figures_of_diff(v: &Value) -> Value {
    let mut v = v.clone();
    for run in ["a", "b"] {
        v[run]["name"] = Value::Null;
        v[run]["cmdline"] = Value::Null;
    }
    v
}

/// `open --json`'s figures and state, without the file's name.
fn open_figures(v: &Value) -> Value {
    v["state"]["processes"][0]["view"]["figures"].clone()
}

#[test]
fn item6_every_command_that_takes_a_file_reads_it_from_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        dir.path().join("healthy.vsrec"),
        dir.path().join("leak.vsrec"),
    );
    scenario_recording("healthy", &a);
    scenario_recording("leak", &b);
    let (pa, pb) = (pickle("all"), pickle("python"));
    // diff: recordings, snapshot files, one of each.
    for (x, y) in [(&a, &b), (&pa, &pb), (&a, &pb)] {
        let want = json(run(&[
            "diff".as_ref(),
            x.as_os_str(),
            y.as_os_str(),
            "--json".as_ref(),
        ]));
        let got = json(through_bash(&format!(
            "diff <(cat {}) <(cat {}) --json",
            q(x),
            q(y)
        )));
        assert_eq!(figures_of_diff(&got), figures_of_diff(&want), "{x:?} {y:?}");
    }
    // open: a snapshot file; a recording is named as one.
    let want = json(run(&["open".as_ref(), pa.as_os_str(), "--json".as_ref()]));
    let got = json(through_bash(&format!("open --json <(cat {})", q(&pa))));
    assert_eq!(open_figures(&got), open_figures(&want));
    let err = exited_with(1, through_bash(&format!("open <(cat {})", q(&a))));
    assert!(err.contains("is a vramscope recording"), "{err}");
    // replay, replay --diff, export, sim --trace, advise.
    let want = json(run(&["replay".as_ref(), b.as_os_str(), "--json".as_ref()]));
    let got = json(through_bash(&format!("replay --json <(cat {})", q(&b))));
    assert_eq!(
        got["processes"][0]["view"]["figures"],
        want["processes"][0]["view"]["figures"]
    );
    let want = succeeded(run(&[
        "replay".as_ref(),
        b.as_os_str(),
        "--diff".as_ref(),
        "3..5".as_ref(),
    ]));
    let got = succeeded(through_bash(&format!(
        "replay --diff 3..5 <(cat {})",
        q(&b)
    )));
    assert_eq!(got.stdout, want.stdout);
    let out = dir.path().join("out.pickle");
    succeeded(through_bash(&format!(
        "export <(cat {}) -o {}",
        q(&b),
        q(&out)
    )));
    let direct = dir.path().join("direct.pickle");
    succeeded(run(&[
        "export".as_ref(),
        b.as_os_str(),
        "-o".as_ref(),
        direct.as_os_str(),
    ]));
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&direct).unwrap()
    );
    let want = succeeded(run(&[
        "sim".as_ref(),
        "--trace".as_ref(),
        b.as_os_str(),
        "--json".as_ref(),
    ]));
    let got = succeeded(through_bash(&format!(
        "sim --json --trace <(cat {})",
        q(&b)
    )));
    assert_eq!(got.stdout, want.stdout);
    let want = succeeded(run(&["advise".as_ref(), b.as_os_str(), "--json".as_ref()]));
    let got = succeeded(through_bash(&format!("advise --json <(cat {})", q(&b))));
    assert_eq!(
        serde_json::from_slice::<Value>(&got.stdout).unwrap()["outcomes"],
        serde_json::from_slice::<Value>(&want.stdout).unwrap()["outcomes"]
    );
}

/// A pipe that never ends is read up to a bound, then refused in one
/// line; one that starts as neither kind of file is refused at once.
#[test]
fn item6_a_pipe_that_never_ends_is_bounded() {
    for (args, what) in [
        ("diff <(cat /dev/zero) <(cat /dev/zero)", "neither"),
        ("open <(yes)", "neither"),
        (
            "diff <(printf '\\x80\\x04'; cat /dev/zero) <(printf '\\x80\\x04')",
            "more than",
        ),
        (
            "replay <(printf 'VSCOPREC\\x01\\x00\\x01\\x00\\x00\\x00\\x00\\x00'; cat /dev/zero)",
            "more than",
        ),
    ] {
        let start = Instant::now();
        let err = exited_with(1, through_bash(args));
        assert!(start.elapsed() < Duration::from_secs(60), "{args}");
        assert_eq!(err.lines().count(), 1, "{args}: {err}");
        assert!(
            err.contains(what) && err.contains("/dev/fd/"),
            "{args}: {err}"
        );
    }
}

// ---------------------------------------------------------------------
// Items 2 and 3: diff's peaks, and its CI gate against a run of 0 B.
// ---------------------------------------------------------------------

fn row<'a>(rows: &'a Value, name: &str) -> &'a Value {
    (rows.as_array().unwrap().iter())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows}"))
}

fn diff_json(a: &Path, b: &Path) -> Value {
    json(run(&[
        "diff".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--json".as_ref(),
    ]))
}

/// Every snapshot fixture of torch 2.11: `diff`'s peaks are those `open`
/// gives the same file (one place computes them), never below the state
/// the file holds.
#[test]
fn item2_a_peak_is_never_below_the_state_held() {
    let mut names: Vec<PathBuf> = (std::fs::read_dir(snapshots()).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 8);
    for p in &names {
        let open = json(run(&["open".as_ref(), p.as_os_str(), "--json".as_ref()]));
        let held = &open["devices"][0];
        let model = open_figures(&open);
        let d = diff_json(p, p);
        let peak = |name: &str| row(&d["figures"], name)["a"].as_u64().unwrap();
        let (alloc, reserved) = (peak("peak allocated"), peak("peak reserved"));
        assert!(
            alloc >= held["allocated"].as_u64().unwrap()
                && reserved >= held["reserved"].as_u64().unwrap(),
            "{p:?}: peaks {alloc} / {reserved} below the state held {held}"
        );
        assert_eq!(
            (Some(alloc), Some(reserved)),
            (
                model["peak_allocated"].as_u64(),
                model["peak_reserved"].as_u64()
            ),
            "{p:?}: diff's peaks against open's"
        );
    }
    // The review's case: state_only holds 132 MiB reserved, all at most
    // 128 MiB: growth the gate sees.
    let (all, state) = (pickle("all"), pickle("state_only"));
    let d = diff_json(&all, &state);
    assert_eq!(row(&d["figures"], "peak reserved")["a"], 128 * MIB);
    assert_eq!(row(&d["figures"], "peak reserved")["b"], 132 * MIB);
    let err = exited_with(
        3,
        run(&[
            "diff".as_ref(),
            all.as_os_str(),
            state.as_os_str(),
            "--fail-over".as_ref(),
            "0".as_ref(),
        ]),
    );
    assert!(err.contains("more than --fail-over 0%"), "{err}");
}

/// A recording of a job that allocated nothing: its step marks only.
fn empty_recording(path: &Path) {
    use vramscope_wire::event::{Event, EventKind, MarkSource};
    let key = ProcessKey {
        pid: 7,
        start_time: 1,
    };
    let mut rec = vramscope_core::recording::Recorder::create(path).unwrap();
    let attach = Input::Attach {
        key,
        identity: Identity::of_pid(7),
        source: Source::unattached(Mode::Exact),
        watch: Watch::default(),
    };
    rec.write(1, &attach).unwrap();
    let events: Vec<Event> = (1..=3)
        .map(|step| Event {
            time_ns: step * 1000,
            kind: EventKind::Marker {
                value: step,
                source: MarkSource::User,
            },
        })
        .collect();
    let input = Input::Events(EventBatch {
        key,
        delivered: events.len() as u64,
        events,
        lost: 0,
        lost_now: 0,
        at: Vec::new(),
    });
    rec.write(2, &input).unwrap();
    rec.finish().unwrap();
}

#[test]
fn item3_fail_over_fires_on_growth_from_zero() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.vsrec");
    empty_recording(&empty);
    let all = pickle("all");
    let d = diff_json(&empty, &all);
    assert_eq!(row(&d["figures"], "peak reserved")["a"], 0);
    assert_eq!(d["peak_reserved_change"], Value::Null);
    // Growth from nothing exceeds any percentage: the gate fails, saying why.
    for pct in ["0", "1000000"] {
        let err = exited_with(
            3,
            run(&[
                "diff".as_ref(),
                empty.as_os_str(),
                all.as_os_str(),
                "--fail-over".as_ref(),
                pct.as_ref(),
            ]),
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("A's is 0 B"), "{err}");
    }
    // Nothing against nothing, and a saving to nothing: no growth.
    for (a, b) in [(&empty, &empty), (&all, &empty)] {
        succeeded(run(&[
            "diff".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
            "--fail-over".as_ref(),
            "0".as_ref(),
        ]));
    }
}

// ---------------------------------------------------------------------
// Item 8: the tool's own export reads back as it was written.
// ---------------------------------------------------------------------

/// What a process's view says of its steps, leak verdict and attribution
/// (times aside: an export keeps microseconds).
fn verdict_and_attribution(view: &Value) -> Value {
    let leak = &view["leak"];
    let sizes: Vec<Value> = (leak["top_sizes"].as_array().unwrap().iter())
        .map(|s| {
            serde_json::json!([
                s["requested"],
                s["block_size"],
                s["live"],
                s["live_growth"],
                s["first_step"]
            ])
        })
        .collect();
    let a = &view["attribution"];
    serde_json::json!({
        "flagged": leak["flagged"],
        "source": leak["source"],
        "steps_observed": leak["steps_observed"],
        "window_steps": leak["window_steps"],
        "slope": leak["floor_slope_bytes_per_step"],
        "last_floor": leak["last_floor"],
        "flagged_at_step": leak["flagged_at_step"],
        "top_sizes": sizes,
        "step": a["step"],
        "by_phase": a["by_phase"],
        "by_module": a["by_module"],
        "by_role": a["by_role"],
        "roles": a["roles"],
    })
}

#[test]
fn item8_an_export_reads_back_with_its_steps_verdict_and_attribution() {
    let dir = tempfile::tempdir().unwrap();
    let (healthy, leak) = (
        dir.path().join("healthy.vsrec"),
        dir.path().join("leak.vsrec"),
    );
    scenario_recording("healthy", &healthy);
    scenario_recording("leak", &leak);
    let exported = dir.path().join("leak.pickle");
    succeeded(run(&[
        "export".as_ref(),
        leak.as_os_str(),
        "-o".as_ref(),
        exported.as_os_str(),
    ]));
    // open reads what replay shows: the same steps (the job's own marks),
    // the same verdict, the same attribution by phase, module and role.
    let replayed = json(run(&[
        "replay".as_ref(),
        leak.as_os_str(),
        "--json".as_ref(),
    ]));
    let opened = json(run(&[
        "open".as_ref(),
        exported.as_os_str(),
        "--json".as_ref(),
    ]));
    let want = verdict_and_attribution(&replayed["processes"][0]["view"]);
    let got = verdict_and_attribution(&opened["state"]["processes"][0]["view"]);
    assert_eq!(want["source"], "markers", "{want}");
    assert_eq!(want["steps_observed"], 15, "{want}");
    assert_eq!(got, want);
    // diff reads what it reads of the recording.
    let from_rec = diff_json(&healthy, &leak);
    let from_export = diff_json(&healthy, &exported);
    for k in [
        "figures",
        "parted_at",
        "by_phase",
        "by_role",
        "by_module",
        "new_in_b",
    ] {
        assert_eq!(from_export[k], from_rec[k], "{k}");
    }
    assert_eq!(from_export["b"]["steps"], from_rec["b"]["steps"]);
    assert_eq!(from_export["b"]["peak_step"], from_rec["b"]["peak_step"]);
    assert_eq!(from_rec["b"]["steps"], 15);
}
