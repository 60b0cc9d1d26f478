//! Which process of a recording `sim`, `advise`, `export` and `diff` take:
//! one census of the recording (`vramscope_core::recording::census`), so
//! the four agree. A recording of a containerised job (host pid 4242, pid
//! 7 in its own namespace) beside a host process with more events but
//! fewer allocator events: each command takes the job by default, takes
//! it for `--pid 4242` and for `--pid 7` alike, names it the same way,
//! and refuses a pid that is not there with the same line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{exited_with, succeeded, vramscope};
use vramscope_core::input::{EventBatch, Identity, Input, Source};
use vramscope_core::model::{Mode, ProcessKey, Watch};
use vramscope_core::recording::Recorder;
use vramscope_core::sim::{Scenario, ScenarioRunner};
use vramscope_wire::event::{Event, EventKind, MarkSource, Place};

/// The job inside a container: host pid 4242, pid 7 in its namespace.
const JOB: ProcessKey = ProcessKey {
    pid: 7,
    start_time: 100,
};
/// A process on the host: more events than the job (its step markers),
/// fewer allocator events.
const OTHER: ProcessKey = ProcessKey {
    pid: 5151,
    start_time: 200,
};

fn attach(key: ProcessKey, host_pid: u32, cmdline: &str) -> Input {
    Input::Attach {
        key,
        identity: Identity {
            host_pid,
            ns_pid: key.pid,
            cmdline: cmdline.into(),
            alive: true,
            ..Identity::default()
        },
        source: Source {
            framework: Some("torch 2.11.0".into()),
            ..Source::unattached(Mode::Exact)
        },
        watch: Watch::default(),
    }
}

fn batch(key: ProcessKey, events: Vec<Event>) -> Input {
    Input::Events(EventBatch::whole(key, events))
}

/// The recording: the demo's `leak` scenario as the job's events, and
/// the other process's two allocations and many markers.
fn recording(dir: &Path) -> PathBuf {
    let path = dir.join("two.vsrec");
    let mut job = Vec::new();
    ScenarioRunner::new(Scenario::by_name("leak").unwrap()).run_to_end(&mut job);
    let place = Place::default();
    let mut other = vec![
        Event {
            time_ns: 1,
            kind: EventKind::SegmentAlloc {
                place,
                addr: 1 << 30,
                size: 2 << 20,
            },
        },
        Event {
            time_ns: 2,
            kind: EventKind::Alloc {
                place,
                addr: 1 << 30,
                size: 1 << 20,
            },
        },
    ];
    other.extend((0..job.len() as u64 + 10).map(|i| Event {
        time_ns: 3 + i,
        kind: EventKind::Marker {
            value: i,
            source: MarkSource::User,
        },
    }));
    let mut rec = Recorder::create(&path).unwrap();
    rec.write(0, &attach(OTHER, OTHER.pid, "other.py")).unwrap();
    rec.write(0, &attach(JOB, 4242, "train.py")).unwrap();
    rec.write(1, &batch(OTHER, other)).unwrap();
    for chunk in job.chunks(64) {
        rec.write(chunk[0].time_ns, &batch(JOB, chunk.to_vec()))
            .unwrap();
    }
    rec.finish().unwrap();
    path
}

/// `vramscope ARGS` on the recording, for each of the four commands that
/// take one of its processes (`pid`: the flag's value, if any).
fn each_command(rec: &Path, out: &Path, pid: Option<&str>) -> Vec<(&'static str, Output)> {
    let pid_args = |flag: &str| -> Vec<String> {
        pid.map(|p| vec![flag.to_string(), p.to_string()])
            .unwrap_or_default()
    };
    let run = |args: Vec<String>| vramscope().args(args).output().unwrap();
    let rec = rec.display().to_string();
    let out = out.join("x.pickle").display().to_string();
    vec![
        (
            "sim",
            run([
                vec!["sim".into(), "--trace".into(), rec.clone()],
                pid_args("--pid"),
            ]
            .concat()),
        ),
        (
            "advise",
            run([vec!["advise".into(), rec.clone()], pid_args("--pid")].concat()),
        ),
        (
            "export",
            run([
                vec!["export".into(), rec.clone(), "-o".into(), out],
                pid_args("--pid"),
            ]
            .concat()),
        ),
        (
            "diff",
            run([
                vec!["diff".into(), rec.clone(), rec],
                pid_args("--pid-a"),
                pid_args("--pid-b"),
            ]
            .concat()),
        ),
    ]
}

/// Each command took the job, and said so as the others do.
fn took_the_job(runs: Vec<(&'static str, Output)>) {
    let named = "process 4242 (pid 7 in its namespace)";
    for (cmd, out) in runs {
        let out = succeeded(out);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(named), "{cmd}: {text}");
    }
}

#[test]
fn every_command_takes_the_process_with_the_most_allocator_events() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recording(dir.path());
    took_the_job(each_command(&rec, dir.path(), None));
}

#[test]
fn a_host_pid_and_a_namespace_pid_take_the_same_process_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recording(dir.path());
    took_the_job(each_command(&rec, dir.path(), Some("4242")));
    took_the_job(each_command(&rec, dir.path(), Some("7")));
}

#[test]
fn a_pid_not_there_is_one_line_naming_those_that_are_the_same_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recording(dir.path());
    let want = format!(
        "vramscope: {}: no process 999 in this recording; it holds events of 4242 (pid 7 in its namespace), 5151\n",
        rec.display()
    );
    for (cmd, out) in each_command(&rec, dir.path(), Some("999")) {
        assert_eq!(exited_with(1, out), want, "{cmd}");
    }
}
