//! The live advisor (issue 27): a recorded H100 job played back through
//! the collector's hub with the advisor on (`replay --advise`), one event
//! at a time as a live job's reach it, against `vramscope advise` on the
//! same recording. The live advisor runs one placement per candidate (the
//! driver's order), so each of its figures must lie inside the range
//! `advise` gives over seven; its own replay must reproduce the job; and
//! both must recommend the same setting.

mod common;

use std::path::Path;

use common::{recording, succeeded, vramscope};
use serde_json::Value;

fn dir(sub: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(sub)
}

fn json(args: &[&str], rec: &Path) -> Value {
    let out = succeeded(vramscope().args(args).arg(rec).output().unwrap());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The live advice of the one advised process, and `advise`'s.
fn both(sub: &str, name: &str) -> (Value, Value) {
    let rec = recording(&dir(sub), name);
    let snap = json(&["replay", "--advise", "--json"], rec.path());
    let live: Vec<&Value> = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p.get("advice"))
        .collect();
    assert_eq!(live.len(), 1, "advised processes: {live:?}");
    let batch = json(&["advise", "--json"], rec.path());
    (live[0].clone(), batch)
}

fn range(v: &Value) -> (u64, u64) {
    (v["lo"].as_u64().unwrap(), v["hi"].as_u64().unwrap())
}

fn agree(sub: &str, name: &str) -> Value {
    let (live, batch) = both(sub, name);
    let cov = &live["coverage"];
    assert_eq!(cov["from_start"], true, "{cov}");
    assert!(cov["stopped"].is_null(), "{cov}");
    assert_eq!(cov["requests"], batch["requests"], "{cov}");
    let advice = &live["advice"];
    let own = &advice["own"];
    assert!(own["compared"].as_u64().unwrap() > 0, "{own}");
    assert_eq!(own["matching"], own["compared"], "live own replay: {own}");
    assert_eq!(own["replay_ooms"], own["job_ooms"], "{own}");
    let find = |a: &Value, conf: &str| -> Option<Value> {
        a["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["conf"] == conf)
            .cloned()
    };
    let mut compared = 0;
    for o in advice["outcomes"].as_array().unwrap() {
        let conf = o["conf"].as_str().unwrap();
        // Candidates chosen from the warm-up's sizes may differ from those
        // chosen from the whole job: only shared ones are compared.
        let Some(b) = find(&batch, conf) else {
            continue;
        };
        compared += 1;
        for fig in ["reserved_peak", "reserved_now", "ooms", "alloc_retries"] {
            let (lo, hi) = range(&b["totals"][fig]);
            let (x, y) = range(&o["totals"][fig]);
            assert_eq!(x, y, "{name} {conf:?} {fig}: one placement live");
            assert!(
                (lo..=hi).contains(&x),
                "{name} {conf:?} {fig}: live {x} outside advise's {lo}..={hi}"
            );
        }
    }
    assert!(compared >= 5, "{name}: {compared} candidates in common");
    let best = |a: &Value| {
        a["best"]
            .as_u64()
            .map(|i| a["outcomes"][i as usize]["conf"].clone())
    };
    assert_eq!(best(advice), best(&batch), "{name}: recommendations differ");
    live
}

#[test]
fn the_live_advisor_agrees_with_advise_on_a_convnext_job() {
    let live = agree("advise", "convnext");
    // Expandable segments save 162 MiB of 930 (the real rerun: the same).
    let a = &live["advice"];
    let best = &a["outcomes"][a["best"].as_u64().unwrap() as usize];
    assert_eq!(best["conf"], "expandable_segments:True");
    assert_eq!(best["peak_change"].as_i64().unwrap(), -162 * (1 << 20));
}

#[test]
fn the_live_advisor_takes_the_limit_the_job_stated() {
    // GPT-2 leaking under a memory fraction of 0.03 until it runs out 53
    // times: the agent's limit marker gives the fraction, so the job's own
    // setting replays its 53 OOMs exactly, live and in `advise`.
    let live = agree("forecast", "leak-oom");
    let own = &live["advice"]["own"];
    assert_eq!(own["job_ooms"], 53, "{own}");
    let f = live["advice"]["memory_fraction"].as_f64().unwrap();
    assert!((0.02..0.04).contains(&f), "fraction {f}");
}

#[test]
fn the_snapshot_table_says_what_the_advice_covers() {
    let rec = recording(&dir("advise"), "convnext");
    let out = succeeded(
        vramscope()
            .args(["replay", "--advise"])
            .arg(rec.path())
            .output()
            .unwrap(),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("advice: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: saves 162 MiB (17%) of peak reserved"),
        "{text}"
    );
    assert!(
        text.contains("over 107023 requests from the job's start, steps 1 to 60"),
        "{text}"
    );
}

/// Writes the simulator's allocator events into `seg` as a training job
/// would (parameters, then steps of activations allocated and freed, a
/// statistics sample and a step marker each), one step every 100 ms,
/// from 1.5 s after it is called until `child` exits (at most 50 s).
fn job_until(seg: &vramscope::ring::SegmentWriter, child: &mut std::process::Child) {
    use vramscope::event::{EventKind, MarkSource};
    use vramscope::sim::{SimAllocator, SimConfig};

    // The job starts once the watcher has had time to find its segment.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut a = SimAllocator::new(SimConfig {
        capacity: 8 << 30,
        ..SimConfig::default()
    });
    let mut ev = Vec::new();
    let started = std::time::Instant::now();
    let mut step = 0u64;
    while child.try_wait().unwrap().is_none() && started.elapsed().as_secs() < 50 {
        a.set_time(vramscope::ring::monotonic_ns());
        if step == 0 {
            for i in 0..10u64 {
                a.malloc((i % 4 + 1) << 21, 0, &mut ev).unwrap();
            }
        }
        let mut acts = Vec::new();
        for j in 0..40u64 {
            acts.push(
                a.malloc(((step * 7 + j * 13) % 30 + 1) << 20, 0, &mut ev)
                    .unwrap(),
            );
        }
        for p in acts {
            a.free(p, &mut ev).unwrap();
        }
        a.emit_stats(&mut ev);
        step += 1;
        for e in ev.drain(..) {
            common::write_at(seg, 0, e.kind, e.time_ns);
        }
        common::write(
            seg,
            0,
            EventKind::Marker {
                source: MarkSource::User,
                value: step,
            },
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn job_segment(dir: &Path) -> vramscope::ring::SegmentWriter {
    use vramscope::ring::{Producer, SegmentConfig, SegmentWriter};
    SegmentWriter::create(&SegmentConfig::new(dir, Producer::TorchExact, 1, 1 << 16)).unwrap()
}

/// The advice a watcher printed as JSON (`advise PID --json`'s object, or
/// the advised process's `advice` in `snapshot --json`): from the job's
/// start, its own replay checked against every sample it sent.
fn check_from_start(v: &Value) {
    let cov = &v["coverage"];
    assert_eq!(cov["from_start"], true, "{v}");
    assert!(cov["steps"].as_u64().unwrap() >= 6, "{cov}");
    let own = &v["advice"]["own"];
    assert!(own["compared"].as_u64().unwrap() >= 4, "{own}");
    assert_eq!(own["matching"], own["compared"], "{own}");
    assert!(
        v["advice"]["outcomes"].as_array().unwrap().len() >= 4,
        "{v}"
    );
}

/// `vramscope advise PID` on a running job (this test process writing the
/// simulator's allocator events into a real segment), watched from its
/// first allocation: it follows six steps, then answers with the advice,
/// the job's own replay checked against the samples it sent.
#[test]
fn advise_pid_follows_a_running_job_from_its_start() {
    let pid = std::process::id().to_string();
    let out = watching_a_job(&["advise", &pid, "--steps", "6", "--json", "--seconds", "60"]);
    check_from_start(&serde_json::from_slice(&out).unwrap());
}

/// What `vramscope ARGS --no-nvml --shm-dir DIR` prints while this process
/// runs the stand-in job in DIR ([`job_until`]), until it exits.
fn watching_a_job(args: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let seg = job_segment(dir.path());
    let mut child = vramscope()
        .args(args)
        .args(["--no-nvml", "--shm-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    job_until(&seg, &mut child);
    succeeded(child.wait_with_output().unwrap()).stdout
}

/// `snapshot --advise --for 4 --json`: the advice of a job that started
/// while it watched, in the process's `advice`.
#[test]
fn snapshot_advise_has_the_advice_in_its_json() {
    let out = watching_a_job(&["snapshot", "--advise", "--for", "4", "--json"]);
    let snap: Value = serde_json::from_slice(&out).unwrap();
    let p = &snap["processes"][0];
    assert_eq!(p["identity"]["host_pid"], std::process::id(), "{snap}");
    check_from_start(&p["advice"]);
}

/// A job already running when the advisor begins (`A`, `advise PID`): the
/// recorded Lightning job played through a hub, advised from a point in
/// its middle. It starts from the tensors the model holds then; every
/// later free finds its tensor (those freed while the candidates are
/// chosen too), so the job's own setting never holds more than the job
/// did: its allocated peak is the job's.
#[test]
fn a_job_advised_from_mid_run_holds_what_it_held() {
    use vramscope::collect::Hub;
    use vramscope::input::Input;
    use vramscope::model::ViewOptions;
    use vramscope::recording::Replayer;

    let rec = recording(&dir("closure"), "lightning");
    let mut r = Replayer::open(rec.path()).unwrap();
    let hub = Hub::default();
    hub.enable_advisor(false, false, None);
    let (mut n, mut advised) = (0, None);
    while let Some((_, input)) = r.next_input().unwrap() {
        let key = match &input {
            Input::Events(b) => Some(b.key),
            _ => None,
        };
        hub.apply(input);
        n += 1;
        if let (Some(k), None, true) = (key, advised, n >= 40) {
            hub.advise(k).unwrap();
            advised = Some(k);
        }
    }
    hub.advisor_flush(std::time::Duration::from_secs(60));
    let key = advised.expect("advised");
    let snap = hub.snapshot(&ViewOptions::default());
    let p = snap.processes.iter().find(|p| p.key() == key).unwrap();
    let a = p.advice.as_ref().unwrap();
    let c = &a.coverage;
    assert!(!c.from_start && c.held > 0 && c.steps >= 20, "{c:?}");
    assert_eq!(c.unknown_frees, 0, "{c:?}");
    let advice = a.advice.as_ref().unwrap();
    let own = advice.outcomes.iter().find(|o| o.candidate.own).unwrap();
    assert_eq!(own.totals.allocated_peak.hi, p.view.figures.peak_allocated);
    // Reserved from a fresh placement of what it held: near the job's.
    let (sim, real) = (
        own.totals.reserved_peak.hi as f64,
        p.view.figures.peak_reserved as f64,
    );
    assert!((sim / real - 1.0).abs() < 0.10, "{sim} vs {real}");
}
