//! Hostile inputs: what a Prometheus answers `vramscope fleet`. Values
//! that are not finite or absurdly large (an exporter of the job, or the
//! server itself, may write anything), and answers of very many series.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use vramscope_collect::fleet::model::Fleet;
use vramscope_collect::fleet::prom::Sample;

/// The values no figure of a vramscope exporter can have.
const EXTREME: [&str; 5] = ["1e308", "NaN", "+Inf", "-Inf", "-1e308"];

/// The answer of a fake Prometheus to `target` (path and query string):
/// one node, up, with two processes (pids 7 and 8) on device 0; every
/// other figure extreme. Over time: pid 7 from 1 GB to 2 GB in a minute
/// with `1e308`, `NaN` and `-1e308` points between (the quadratic chart
/// scaling overflowed on those and drew for ever); pid 8 from 3 GB to 4 GB
/// with `+Inf`, `-Inf` points and timestamps of `±1e308`.
fn fake_answer(target: &str) -> String {
    let vector = |series: Vec<String>| {
        format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            series.join(",")
        )
    };
    let one = |name: &str, pid: u32, extra: &str, v: &str| {
        format!(
            r#"{{"metric":{{"__name__":"{name}","job":"vramscope","instance":"n:1","host":"node-x","pid":"{pid}","user":"u","process":"train{pid}","mode":"exact"{extra}}},"value":[1700000000,"{v}"]}}"#
        )
    };
    if target.starts_with("/api/v1/query_range") {
        let (first, extreme, last): (&str, &[&str], &str) = if target.contains("pid%3D%228%22") {
            ("3000000000", &["+Inf", "-Inf"], "4000000000")
        } else {
            ("1000000000", &["1e308", "NaN", "-1e308"], "2000000000")
        };
        let mut points = vec![format!(r#"[1700000000,"{first}"]"#)];
        for (i, v) in extreme.iter().enumerate() {
            points.push(format!(r#"[{},"{v}"]"#, 1700000001 + i));
        }
        if target.contains("pid%3D%228%22") {
            points.push(r#"[1e308,"5"]"#.into());
            points.push(r#"[-1e308,"5"]"#.into());
        }
        points.push(format!(r#"[1700000060,"{last}"]"#));
        return format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
            points.join(",")
        );
    }
    let query = target.split("query=").nth(1).unwrap_or("");
    if query.starts_with("up") {
        return vector(vec![
            r#"{"metric":{"__name__":"up","job":"vramscope","instance":"n:1"},"value":[1700000000,"1"]}"#.into(),
        ]);
    }
    if query.starts_with("rate") {
        return vector(vec![one("", 7, "", "NaN"), one("", 8, "", "+Inf")]);
    }
    let mut series = Vec::new();
    for pid in [7, 8] {
        series.push(one("vramscope_process_running", pid, "", "1"));
        series.push(one(
            "vramscope_process_allocated_bytes",
            pid,
            r#","device":"0""#,
            "1e9",
        ));
        for name in [
            "vramscope_process_reserved_bytes",
            "vramscope_process_fragmentation_ratio",
        ] {
            series.push(one(
                name,
                pid,
                r#","device":"0""#,
                EXTREME[pid as usize % 5],
            ));
        }
        for (name, v) in [
            ("vramscope_process_ooms_total", "+Inf"),
            ("vramscope_process_nvml_used_bytes", "-1e308"),
            ("vramscope_process_leak_growth_bytes_per_step", "NaN"),
        ] {
            series.push(one(name, pid, "", v));
        }
    }
    for (i, v) in EXTREME.iter().enumerate() {
        let gpu = format!(r#","gpu":"{i}","name":"G""#);
        series.push(one("vramscope_gpu_memory_total_bytes", 0, &gpu, v));
        series.push(one("vramscope_gpu_memory_used_bytes", 0, &gpu, v));
        series.push(one("vramscope_gpu_utilization_ratio", 0, &gpu, v));
    }
    vector(series)
}

/// A fake Prometheus on loopback answering [`fake_answer`]; its URL.
fn fake_prometheus() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_one(stream));
        }
    });
    url
}

/// Answers the requests of one connection (keep-alive) until it closes.
fn serve_one(stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut out = stream.try_clone().unwrap();
    let mut lines = BufReader::new(stream);
    loop {
        let mut first = String::new();
        if lines.read_line(&mut first).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if lines.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let target = first.split(' ').nth(1).unwrap_or("");
        let body = fake_answer(target);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        if out.write_all(head.as_bytes()).is_err() || out.write_all(body.as_bytes()).is_err() {
            return;
        }
    }
}

/// `vramscope fleet` on `url` in a pty: the node opened, pid 7's chart
/// drawn, then pid 8's, the footer's keys, the help overlay opened and
/// closed with `?`; then `stop` (a key, or a signal to the child's
/// pid). Its exit status (None: still running 10 s after `stop`), and
/// whether it gave the terminal back (main screen, cursor shown).
fn fleet_then(url: &str, stop: impl FnOnce(&mut dyn Write, u32)) -> (Option<bool>, bool) {
    let crate::common::Pty {
        mut child,
        master: _master,
        mut keys,
        output,
    } = crate::common::vramscope_in_pty(
        &["fleet", "--prometheus", url, "--refresh", "500"],
        30,
        110,
    );
    // The screen as a terminal shows it (frames redraw only what changed).
    let screen = || crate::common::screen(&output.lock().unwrap(), 30, 110);
    let text = || screen().screen().contents();
    let mut wait = |needles: &[&str], what: &str| {
        let start = Instant::now();
        while !needles.iter().all(|n| text().contains(n)) {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{what} never shown {needles:?}:\n{}", text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait(&["node-x"], "the node");
    keys.write_all(b"\r").unwrap();
    // The ordinary points, a minute apart, span the chart; its top is a
    // tenth above the largest (2.2e9 B = 2.05 GiB), not 1e308.
    wait(&["(pid 7) over time", "-1m", "2.05G"], "pid 7's chart");
    keys.write_all(b"j").unwrap();
    wait(&["(pid 8) over time", "4.10G"], "pid 8's chart");
    // The dashboard's footer and help overlay, from the key table.
    wait(&["o/O sort", "Esc back", "? help", "q quit"], "the footer");
    keys.write_all(b"?").unwrap();
    wait(
        &["ask Prometheus now", "back to the list"],
        "the help overlay",
    );
    keys.write_all(b"?").unwrap();
    let start = Instant::now();
    while text().contains("ask Prometheus now") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "help never closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut keys, child.process_id().unwrap());
    let status =
        crate::common::exit_within(&mut *child, Duration::from_secs(10)).map(|s| s.success());
    std::thread::sleep(Duration::from_millis(100));
    let term = screen();
    let left = !term.screen().alternate_screen() && !term.screen().hide_cursor();
    (status, left)
}

/// Item 7: `1e308`, `NaN`, `±Inf` and `-1e308` in every figure and in
/// the charts' series: both charts are drawn (the extreme points left
/// out) and `q` quits at once.
#[test]
fn item7_extreme_values_from_prometheus_are_drawn_and_q_quits() {
    let url = fake_prometheus();
    let (status, left) = fleet_then(&url, |keys, _| keys.write_all(b"q").unwrap());
    assert_eq!(status, Some(true), "fleet did not quit on q within 10 s");
    assert!(left, "the terminal was not given back");
}

/// Item 7: the same, stopped by SIGTERM: it quits at once and gives the
/// terminal back (leaves the alternate screen).
#[test]
fn item7_extreme_values_from_prometheus_and_sigterm_quits() {
    let url = fake_prometheus();
    let (status, left) = fleet_then(&url, |_, pid| {
        let r = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(r.success());
    });
    assert!(status.is_some(), "fleet ignored SIGTERM for 10 s");
    assert!(left, "the terminal was not given back");
}

fn sample(labels: &[(&str, String)], value: f64) -> Sample {
    Sample {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        value,
    }
}

/// Item 7: a fleet from answers of 100,000 GPU series on one node and
/// 100,000 processes (half of them on a device, half NVML only) builds, and
/// its node's figures are summed, in near-linear time (the quadratic build
/// took about 55 s on this machine's two cores; now well under a second
/// in a release build, and within the bound below in a debug one).
#[test]
fn item7_a_fleet_of_100k_series_builds_in_near_linear_time() {
    const N: usize = 100_000;
    let inst = || ("instance", "n:1".to_string());
    let up = [sample(&[inst()], 1.0)];
    let mut figures = Vec::with_capacity(2 * N);
    for i in 0..N {
        figures.push(sample(
            &[
                ("__name__", "vramscope_gpu_memory_total_bytes".into()),
                inst(),
                ("gpu", i.to_string()),
            ],
            80e9,
        ));
    }
    for i in 0..N {
        let pid = ("pid", i.to_string());
        if i % 2 == 0 {
            figures.push(sample(
                &[
                    ("__name__", "vramscope_process_allocated_bytes".into()),
                    inst(),
                    pid,
                    ("device", "0".into()),
                ],
                1e9,
            ));
        } else {
            figures.push(sample(
                &[
                    ("__name__", "vramscope_process_ooms_total".into()),
                    inst(),
                    pid,
                ],
                1.0,
            ));
        }
    }
    let start = Instant::now();
    let fleet = Fleet::build(&up, &figures, &[]);
    let n = &fleet.nodes[0];
    let (gpus, procs, jobs, ooms, total) = (
        n.gpus.len(),
        n.procs.len(),
        n.jobs(),
        n.ooms(),
        n.gpu_total(),
    );
    let took = start.elapsed();
    assert_eq!((gpus, procs, jobs), (N, N, N));
    assert_eq!(ooms, (N / 2) as f64);
    assert_eq!(total, Some(80e9 * N as f64));
    assert!(
        took < Duration::from_secs(10),
        "building 200,000 series took {took:?}"
    );
    eprintln!("item7: 200,000 series built in {took:?}");
}
