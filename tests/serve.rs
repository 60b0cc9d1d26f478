//! `vramscope serve` on its own: what a scrape holds (values, labels,
//! escaping, both formats), and what is not a scrape (404, 405), and that
//! idle or dribbling clients are closed, and that 1,000 idle connections
//! of one client keep no scrape out (item 6).
//! The series through a real Prometheus: `tests/fleet_prometheus.rs`.

mod stand_in;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use stand_in::{exporter, Shape};

#[test]
#[ignore = "a stand-in producer, run by the other tests as a process of its own"]
fn stand_in_producer() {
    stand_in::main();
}

/// One HTTP/1.0 exchange: the status code, the headers and the body.
fn request(addr: &str, head: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (headers, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = headers
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, headers.to_string(), body.to_string())
}

fn scrape(addr: &str, accept: &str) -> String {
    let (code, _, body) = request(
        addr,
        &format!("GET /metrics HTTP/1.0\r\nAccept: {accept}\r\n\r\n"),
    );
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of the first sample of `name` whose labels contain `with`.
fn value(text: &str, name: &str, with: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(with))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

const LEAKY: Shape = Shape {
    base: 1 << 30,
    leak: 4 << 20,
    steps: 12,
    reserved: 3 << 30,
    inactive_split: 768 << 20,
    alloc_retries: 3,
    period_ms: 200,
};

#[test]
fn a_scrape_holds_the_process_figures_with_escaped_labels() {
    let dir = tempfile::tempdir().unwrap();
    let job = stand_in::spawn(dir.path(), "train_leaky", LEAKY);
    let ex = exporter(dir.path(), "node \"a\"\\1");
    let start = Instant::now();
    let text = loop {
        let t = scrape(&ex.addr, "text/plain");
        // Once steps were seen and NVML (disabled) was read once.
        let ready = ["vramscope_process_leak_suspected{", "vramscope_nvml_up{"];
        if ready.iter().all(|r| t.contains(r)) || start.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let me = format!("pid=\"{}\"", job.pid());
    assert_eq!(
        value(&text, "vramscope_process_allocated_bytes", &me),
        Some(LEAKY.allocated() as f64),
        "{text}"
    );
    assert_eq!(
        value(&text, "vramscope_process_reserved_bytes", &me),
        Some(LEAKY.reserved as f64)
    );
    assert_eq!(
        value(&text, "vramscope_process_fragmentation_ratio", &me),
        Some(0.25)
    );
    assert_eq!(
        value(&text, "vramscope_process_alloc_retries_total", &me),
        Some(3.0)
    );
    assert_eq!(
        value(&text, "vramscope_process_leak_suspected", &me),
        Some(1.0)
    );
    let growth = value(&text, "vramscope_process_leak_growth_bytes_per_step", &me).unwrap();
    assert_eq!(growth, LEAKY.leak as f64);
    assert!(value(&text, "vramscope_process_steps_total", &me).unwrap() >= 11.0);
    // Labels: the host escaped, the process named by its label.
    assert!(text.contains("host=\"node \\\"a\\\"\\\\1\""), "{text}");
    assert!(text.contains("process=\"train_leaky\""), "{text}");
    assert!(text.contains("device=\"0\""), "{text}");
    // Without NVML: said so, and no NVML figure written as 0.
    assert_eq!(value(&text, "vramscope_nvml_up", "host="), Some(0.0));
    assert!(!text.contains("vramscope_process_nvml_used_bytes"));
    assert!(text.contains("# TYPE vramscope_process_events_total counter"));
    assert!(!text.contains("# EOF"));

    // OpenMetrics when asked, as Prometheus asks.
    let om = scrape(
        &ex.addr,
        "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE vramscope_process_events counter"));
    assert!(om.contains("# UNIT vramscope_process_allocated_bytes bytes"));
}

#[test]
fn what_is_not_a_scrape_is_refused_and_idle_clients_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let ex = exporter(dir.path(), "n");
    let (code, _, _) = request(&ex.addr, "GET / HTTP/1.0\r\n\r\n");
    assert_eq!(code, 404);
    let (code, _, _) = request(&ex.addr, "GET /api/empty_cache HTTP/1.0\r\n\r\n");
    assert_eq!(code, 404);
    let (code, headers, _) = request(
        &ex.addr,
        "POST /metrics HTTP/1.0\r\nContent-Length: 4\r\n\r\nkill",
    );
    assert_eq!(code, 405);
    assert!(
        headers.to_ascii_lowercase().contains("allow: get, head"),
        "{headers}"
    );
    let (code, _, body) = request(&ex.addr, "HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!((code, body.as_str()), (200, ""));
    let (code, _, _) = request(&ex.addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
    assert_eq!(code, 200);
    let (code, _, _) = request(&ex.addr, "garbage\r\n\r\n");
    assert_ne!(code, 200);

    // 100 clients that connect and say nothing: every one is closed within
    // the header timeout (5 s), the newest 64 of them by it, the others
    // sooner (each newcomer past 64 took the slot of the oldest).
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(&ex.addr).unwrap())
        .collect();
    let start = Instant::now();
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        let got = s.read(&mut buf);
        assert!(
            matches!(got, Ok(0))
                || got
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "an idle client was answered: {got:?}"
        );
    }
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(8),
        "idle clients held for {took:?}"
    );
}

/// Item 6: clients dribbling their request one byte a second are closed
/// by the header timeout (5 s for the whole headers), unanswered; then one
/// local client holding 1,000 idle connections (every slot and then
/// some): each of 20 scrapes is answered within 1 s, all of them.
#[test]
fn item6_scrapes_answer_within_1s_while_1000_idle_connections_are_held() {
    let dir = tempfile::tempdir().unwrap();
    let job = stand_in::spawn(dir.path(), "train", LEAKY);
    let ex = exporter(dir.path(), "n");
    let me = format!("pid=\"{}\"", job.pid());
    let start = Instant::now();
    while !scrape(&ex.addr, "text/plain").contains(&me) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the stand-in never showed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Slow ones: one byte of a request a second, for up to 8 s.
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let addr = ex.addr.clone();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(&addr).unwrap();
                let start = Instant::now();
                for b in b"GET /metrics HTTP/1.1\r\n" {
                    if s.write_all(&[*b]).is_err() || start.elapsed() > Duration::from_secs(8) {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                // Closed by then: no answer, an end or a reset.
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                (start.elapsed(), buf)
            })
        })
        .collect();
    for h in slow {
        let (took, answer) = h.join().unwrap();
        assert!(answer.is_empty(), "a dribbling client was answered");
        assert!(
            took < Duration::from_secs(8),
            "a dribbling client held on for {took:?}"
        );
    }
    let idle: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(&ex.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        let mut s = TcpStream::connect(&ex.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let got = s.read_to_end(&mut out);
        let took = t.elapsed();
        let text = String::from_utf8_lossy(&out);
        assert!(
            got.is_ok() && text.starts_with("HTTP/1.0 200") && text.contains(&me),
            "scrape {i} under attack: {got:?} after {took:?}: {:?}",
            text.chars().take(200).collect::<String>()
        );
        assert!(took < Duration::from_secs(1), "scrape {i} took {took:?}");
        worst = worst.max(took);
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("item6: 20 scrapes under attack, the slowest {worst:?}");
    drop(idle);
}

#[test]
fn bad_flags_are_one_line() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        (out.status.code(), err)
    };
    let (code, err) = run(&["serve", "--listen", "localhost"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--listen"), "{err}");
    // A port already taken: one line naming the flag.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = run(&["serve", "--no-nvml", "--listen", &addr]);
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("--listen {addr}")), "{err}");
    let (code, err) = run(&["fleet", "--prometheus", "https://prom:9090"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("https is not supported"), "{err}");
    let (code, err) = run(&["fleet", "--prometheus", "http://p", "--refresh", "10"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--refresh"), "{err}");
}
