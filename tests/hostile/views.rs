//! Hostile inputs that make views long (issue 44, item 1): a producer's
//! 65,536 overlapping orphan blocks and one role list of 65,536 tensors
//! above them, every count within its bound. One `snapshot --for 8` took
//! 92.7 s; `serve` answered no scrape for 30 s and ignored SIGTERM; the
//! dashboard took 73 s to quit after `q`. A view now costs the blocks
//! plus the entries. The limits below are hang guards for a debug build,
//! not timings.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{exit_within, vramscope, vramscope_in_pty};
use crate::stand_in::{self, Shape, StandIn};

/// The attack's size: the bound of orphans per device, and of a list.
const N: u64 = 1 << 16;

const QUIET: Shape = Shape {
    base: 1 << 30,
    leak: 0,
    steps: 2,
    reserved: 2 << 30,
    inactive_split: 0,
    alloc_retries: 0,
    period_ms: 200,
};

fn attacker(dir: &std::path::Path) -> StandIn {
    stand_in::spawn_role_list_attack(dir, "roles", QUIET, N)
}

/// Runs `cmd` to its end, its standard output kept, within `limit`.
fn output_within(cmd: &mut Command, limit: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?} (the attack's view took 92.7 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(status.success(), "{err}");
    (reader.join().unwrap(), start.elapsed())
}

#[test]
fn item1_role_lists_cannot_make_snapshot_views_quadratic() {
    let dir = tempfile::tempdir().unwrap();
    let job = attacker(dir.path());
    let (out, took) = output_within(
        vramscope()
            .args(["snapshot", "--json", "--blocks", "--no-nvml"])
            .arg("--shm-dir")
            .arg(dir.path()),
        Duration::from_secs(60),
    );
    eprintln!("item1: snapshot --json --blocks under the attack took {took:?}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = (v["processes"].as_array().unwrap().iter())
        .find(|p| p["identity"]["host_pid"] == job.pid())
        .expect("the attacker's process");
    let p = &entry["view"];
    // The tensors name one block, the one nearest below them.
    let named: Vec<_> = (p["devices"][0]["orphans"].as_array().unwrap().iter())
        .filter(|b| b["role"] == "parameter")
        .map(|b| b["addr"].as_u64().unwrap())
        .collect();
    assert_eq!(
        named,
        vec![0x1000 * (N - 1)],
        "{}",
        p["attribution"]["roles"]
    );
    let blocks: u64 = (p["attribution"]["roles"].as_array().unwrap().iter())
        .map(|r| r["blocks"].as_u64().unwrap())
        .sum();
    assert_eq!(blocks, N);
}

/// One scrape: its status line and body (within `limit`).
fn scrape(addr: &str, limit: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn item1_serve_answers_and_stops_under_the_role_list_attack() {
    let dir = tempfile::tempdir().unwrap();
    let job = attacker(dir.path());
    let mut ex = stand_in::exporter(dir.path(), "n");
    let me = format!("pid=\"{}\"", job.pid());
    let start = Instant::now();
    loop {
        let text = scrape(&ex.addr, Duration::from_secs(30));
        if text.starts_with("HTTP/1.0 200") && text.contains(&me) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no scrape showed the attacker within 60 s: {:?}",
            text.chars().take(200).collect::<String>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "item1: the first scrape showing the attacker after {:?}",
        start.elapsed()
    );
    // A scrape in flight, then SIGTERM: it exits at once.
    let addr = ex.addr.clone();
    let _in_flight = std::thread::spawn(move || scrape(&addr, Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(20));
    let pid = ex.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    while ex.child.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "serve still ran 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("item1: serve exited {:?} after SIGTERM", t.elapsed());
}

#[test]
fn item1_the_dashboard_quits_on_q_under_the_role_list_attack() {
    let dir = tempfile::tempdir().unwrap();
    let job = attacker(dir.path());
    let shm = dir.path().to_str().unwrap();
    let mut s = vramscope_in_pty(&["--no-nvml", "--shm-dir", shm], 24, 80);
    // Until the attacker's row shows (its pid), or 60 s.
    let pid = job.pid().to_string();
    let start = Instant::now();
    while !String::from_utf8_lossy(&s.output.lock().unwrap()).contains(&pid) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the dashboard never showed the attacker"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its view open: Enter on the only process.
    s.keys.write_all(b"\r").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.keys.write_all(b"q").unwrap();
    s.keys.flush().unwrap();
    let t = Instant::now();
    let status = exit_within(&mut *s.child, Duration::from_secs(5));
    assert!(status.is_some(), "the dashboard still ran 5 s after q");
    eprintln!("item1: the dashboard exited {:?} after q", t.elapsed());
}
