//! The exporter and the fleet view against a real Prometheus (Debian's
//! `prometheus` package, which `scripts/test` installs): two exporters on
//! different ports stand in for two nodes, each watching its own stand-in
//! processes. Through Prometheus's HTTP API the series arrive with the
//! right values and labels; `promtool check metrics` accepts a scrape;
//! `vramscope fleet` in a pty shows both nodes, one node's processes, and a
//! node that went away as down.

mod common;
mod stand_in;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stand_in::{exporter, Shape};
use vramscope_collect::fleet::prom::{Client, Endpoint, Sample};

#[test]
#[ignore = "a stand-in producer, run by the other tests as a process of its own"]
fn stand_in_producer() {
    stand_in::main();
}

const LEAKY: Shape = Shape {
    base: 2 << 30,
    leak: 8 << 20,
    steps: 12,
    reserved: 6 << 30,
    inactive_split: 1536 << 20,
    alloc_retries: 2,
    period_ms: 250,
};

const STEADY: Shape = Shape {
    base: 1 << 30,
    leak: 0,
    steps: 12,
    reserved: 2 << 30,
    inactive_split: 0,
    alloc_retries: 0,
    period_ms: 250,
};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Prometheus on loopback scraping `targets` every second.
fn prometheus(dir: &Path, targets: &[&str]) -> (Killed, String) {
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: vramscope\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    (Killed(child), format!("http://127.0.0.1:{port}"))
}

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Asks `q` until `done` holds of the answer (or `timeout`); the last answer.
fn until(
    rt: &tokio::runtime::Runtime,
    c: &Client,
    q: &str,
    timeout: Duration,
    done: impl Fn(&[Sample]) -> bool,
) -> Vec<Sample> {
    let start = Instant::now();
    loop {
        let got = rt.block_on(c.query(q)).unwrap_or_default();
        if done(&got) || start.elapsed() > timeout {
            return got;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn one<'a>(s: &'a [Sample], label: &str, value: &str) -> &'a Sample {
    let hits: Vec<&Sample> = s.iter().filter(|x| x.label(label) == value).collect();
    assert_eq!(hits.len(), 1, "one series with {label}={value}: {s:?}");
    hits[0]
}

/// A current-thread runtime and a client of the Prometheus at `url`.
fn client(url: &str) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = Client::new(Endpoint::parse(url).unwrap(), Duration::from_secs(5));
    (rt, c)
}

/// What the exporter at `addr` (host:port) serves at `/metrics`.
fn scrape(addr: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// Asserts `promtool check metrics` (its lint of the text format) accepts
/// `scrape`.
fn promtool_accepts(scrape: &str) {
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{scrape}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn series_reach_prometheus_and_fleet_shows_nodes_and_a_node_going_down() {
    if !have("prometheus") || !have("promtool") {
        eprintln!("SKIPPED: fleet_prometheus: `prometheus` and `promtool` are needed (Debian package prometheus; scripts/test installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (da, db) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let leaky = stand_in::spawn(&da, "train_a", LEAKY);
    let steady = stand_in::spawn(&da, "eval_a", STEADY);
    let other = stand_in::spawn(&db, "train_b", STEADY);
    let ea = exporter(&da, "node-a");
    let mut eb = Some(exporter(&db, "node-b"));
    let b_addr = eb.as_ref().unwrap().addr.clone();
    let (_prom, url) = prometheus(tmp.path(), &[&ea.addr, &b_addr]);

    let (rt, c) = client(&url);
    // Both targets up, the three processes' series in.
    let up = until(
        &rt,
        &c,
        "up{job=\"vramscope\"}",
        Duration::from_secs(30),
        |s| s.len() == 2 && s.iter().all(|x| x.value == 1.0),
    );
    assert!(
        up.len() == 2 && up.iter().all(|x| x.value == 1.0),
        "both exporters scraped: {up:?}"
    );
    let leak_q = "vramscope_process_leak_suspected";
    let leaks = until(&rt, &c, leak_q, Duration::from_secs(20), |s| s.len() == 3);
    assert_eq!(leaks.len(), 3, "{leaks:?}");
    let pid = |p: &stand_in::StandIn| p.pid().to_string();
    assert_eq!(one(&leaks, "pid", &pid(&leaky)).value, 1.0);
    assert_eq!(one(&leaks, "pid", &pid(&steady)).value, 0.0);
    assert_eq!(one(&leaks, "pid", &pid(&other)).value, 0.0);

    let alloc = rt
        .block_on(c.query("vramscope_process_allocated_bytes"))
        .unwrap();
    let a = one(&alloc, "pid", &pid(&leaky));
    assert_eq!(a.value, LEAKY.allocated() as f64);
    for (k, v) in [
        ("host", "node-a"),
        ("process", "train_a"),
        ("mode", "exact"),
        ("device", "0"),
        ("job", "vramscope"),
        ("instance", ea.addr.as_str()),
    ] {
        assert_eq!(a.label(k), v, "label {k}: {a:?}");
    }
    assert!(!a.label("user").is_empty(), "{a:?}");
    let b = one(&alloc, "pid", &pid(&other));
    assert_eq!(
        (b.value, b.label("host"), b.label("instance")),
        (STEADY.allocated() as f64, "node-b", b_addr.as_str())
    );
    let frag = rt
        .block_on(c.query("vramscope_process_fragmentation_ratio{host=\"node-a\"}"))
        .unwrap();
    assert_eq!(one(&frag, "pid", &pid(&leaky)).value, 0.25);
    let growth = rt
        .block_on(c.query("vramscope_process_leak_growth_bytes_per_step"))
        .unwrap();
    assert_eq!(one(&growth, "pid", &pid(&leaky)).value, LEAKY.leak as f64);
    // Counters: each step marker is an event (statistics samples are not).
    let ev = rt
        .block_on(c.query("vramscope_process_events_total"))
        .unwrap();
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert!(ev.iter().all(|s| s.value == LEAKY.steps as f64), "{ev:?}");
    // A query Prometheus refuses is one line with its reason.
    let bad = rt
        .block_on(c.query("vramscope_process_allocated_bytes{"))
        .unwrap_err();
    assert!(
        bad.starts_with("Prometheus refused a query: bad_data"),
        "{bad}"
    );

    // Every query of the Grafana dashboard is valid PromQL, and those on
    // the figures the stand-ins have find them.
    let dash: serde_json::Value =
        serde_json::from_str(include_str!("../assets/grafana/vramscope-fleet.json")).unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$job", "vramscope")
                .replace("$host", ".*")
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h");
            let got = rt.block_on(c.query(&expr));
            let got = got.unwrap_or_else(|e| panic!("{}: {expr}: {e}", panel["title"]));
            let title = panel["title"].as_str().unwrap();
            // (No NVML here: the GPU panels find nothing.)
            let on_stand_ins = ["up{", "allocated_bytes", "reserved_bytes", "leak_suspected"];
            if !expr.contains("gpu_") && on_stand_ins.iter().any(|m| expr.contains(m)) {
                assert!(!got.is_empty(), "{title}: {expr} found nothing");
            }
            checked += 1;
        }
    }
    assert!(checked >= 14, "{checked}");

    // promtool's lint of a scrape in the text format.
    promtool_accepts(&scrape(&ea.addr));

    // The fleet view in a terminal.
    let mut fleet = common::vramscope_in_pty(
        &["fleet", "--prometheus", &url, "--refresh", "500"],
        30,
        110,
    );
    let output = &fleet.output;
    let text = || String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let wait = |needles: &[&str], what: &str| {
        let start = Instant::now();
        loop {
            let t = text();
            if needles.iter().all(|n| t.contains(n)) {
                return;
            }
            if start.elapsed() > Duration::from_secs(20) {
                panic!("fleet never showed {what} {needles:?}; output:\n{t:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait(&["node-a", "node-b", "2 nodes"], "both nodes");
    // Into node-a (first by name): its two processes, then back.
    fleet.keys.write_all(b"\r").unwrap();
    wait(&["train_a", "eval_a", "LEAK"], "node-a's processes");
    wait(&["over time"], "the selected process's chart");
    fleet.keys.write_all(b"\x1b").unwrap();
    // (A key right after Esc would be read as Alt+key.)
    std::thread::sleep(Duration::from_millis(300));
    // Fleet-wide jobs list.
    fleet.keys.write_all(b"\t").unwrap();
    wait(&["train_b"], "every job (node-b's too)");
    fleet.keys.write_all(b"\t").unwrap();
    // node-b goes away: Prometheus marks it down, and so does the view.
    let mark = output.lock().unwrap().len();
    drop(eb.take());
    let start = Instant::now();
    loop {
        let after = String::from_utf8_lossy(&output.lock().unwrap()[mark..]).into_owned();
        if after.contains("DOWN") && after.contains("1 down") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "node-b never shown as down; output after it stopped:\n{after:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.keys.write_all(b"q").unwrap();
    let status = common::exit_within(&mut *fleet.child, Duration::from_secs(10));
    let status = status.expect("fleet did not quit on q");
    assert!(status.success(), "fleet exited with {status:?}");
}

#[test]
fn fleet_shows_an_unreachable_prometheus_in_its_pane() {
    // A port where nothing listens: the pane says so; q still quits.
    let port = free_port();
    let at = format!("127.0.0.1:{port}");
    let mut fleet = common::vramscope_in_pty(&["fleet", "--prometheus", &at], 24, 80);
    let start = Instant::now();
    loop {
        let t = String::from_utf8_lossy(&fleet.output.lock().unwrap()).into_owned();
        if t.contains("cannot be reached") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no message for an unreachable Prometheus: {t:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.keys.write_all(b"q").unwrap();
    let status = common::exit_within(&mut *fleet.child, Duration::from_secs(10));
    assert!(status.expect("fleet did not quit on q").success());
}

/// Issue 15: a process's live bytes by module reach Prometheus with
/// bounded cardinality: its 10 largest modules and one `(other)` row (the
/// demo's leak scenario names 14: 12 layers, the head, none), adding up to
/// its allocated bytes in the same scrape; and by phase.
#[test]
fn top_modules_per_process_reach_prometheus() {
    if !have("prometheus") {
        eprintln!("SKIPPED: top_modules_per_process_reach_prometheus: `prometheus` is needed (Debian package prometheus; scripts/test installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shm");
    std::fs::create_dir_all(&dir).unwrap();
    // The demo's leak scenario in this process (a real segment), fast: it
    // holds its final picture for 10 s, where statistics and blocks agree.
    let sc = vramscope_collect::demo::scenario("leak", None).unwrap();
    let demo = vramscope_collect::demo::start(sc, &dir, 20.0, None).unwrap();
    let ex = exporter(&dir, "node-m");
    let (_prom, url) = prometheus(tmp.path(), &[&ex.addr]);
    let (rt, c) = client(&url);
    let me = std::process::id();
    let q = format!("vramscope_process_module_allocated_bytes{{pid=\"{me}\"}}");
    // At a quiescent point the rows add up to the allocated bytes (one
    // evaluation: one scrape).
    let diff = until(
        &rt,
        &c,
        &format!("sum({q}) - sum(vramscope_process_allocated_bytes{{pid=\"{me}\"}})"),
        Duration::from_secs(40),
        |s| s.len() == 1 && s[0].value == 0.0,
    );
    assert!(diff.len() == 1 && diff[0].value == 0.0, "{diff:?}");
    let rows = rt.block_on(c.query(&q)).unwrap();
    let modules: Vec<&str> = rows.iter().map(|s| s.label("module")).collect();
    assert_eq!(rows.len(), 11, "{modules:?}");
    assert!(modules.contains(&"(other)"), "{modules:?}");
    assert!(modules.contains(&"model.layers.0"), "{modules:?}");
    for s in &rows {
        assert_eq!(
            (s.label("host"), s.label("process")),
            ("node-m", "demo: leak")
        );
        assert!(s.value > 0.0, "{s:?}");
    }
    let phases = rt
        .block_on(c.query(&format!(
            "vramscope_process_phase_allocated_bytes{{pid=\"{me}\"}}"
        )))
        .unwrap();
    let names: Vec<&str> = phases.iter().map(|s| s.label("phase")).collect();
    assert!(
        names.contains(&"forward") && names.contains(&"other"),
        "{names:?}"
    );
    // By role (issue 26): the demo's job sends role lists; its layers'
    // weights are parameters, Adam's state optimizer state (both alive
    // all along; gradients only from backward to the next zero_grad), and
    // the roles add up to the allocated bytes too.
    let roles = rt
        .block_on(c.query(&format!(
            "vramscope_process_role_allocated_bytes{{pid=\"{me}\"}}"
        )))
        .unwrap();
    let names: Vec<&str> = roles.iter().map(|s| s.label("role")).collect();
    for r in ["parameter", "optimizer_state"] {
        assert!(names.contains(&r), "{names:?}");
    }
    let diff = until(
        &rt,
        &c,
        &format!(
            "sum(vramscope_process_role_allocated_bytes{{pid=\"{me}\"}}) - sum(vramscope_process_allocated_bytes{{pid=\"{me}\"}})"
        ),
        Duration::from_secs(40),
        |s| s.len() == 1 && s[0].value == 0.0,
    );
    assert!(diff.len() == 1 && diff[0].value == 0.0, "{diff:?}");
    demo.stop();
}

/// The module label values of `pid`'s rows in a scrape of `addr`, and the
/// scrape.
fn module_rows(addr: &str, pid: u32) -> (Vec<String>, String) {
    let body = scrape(addr);
    let me = format!("pid=\"{pid}\"");
    let values = body
        .lines()
        .filter(|l| l.starts_with("vramscope_process_module_allocated_bytes{") && l.contains(&me))
        .filter_map(|l| Some(l.split("module=\"").nth(1)?.split('"').next()?.to_string()))
        .collect();
    (values, body)
}

/// Item 11: a producer whose modules are named `(other)` and `(none)`,
/// among its largest, beside the aggregate rows of those names (modules
/// past the ten largest, allocations outside every module): every row is
/// a series of its own in a scrape, `promtool check metrics` accepts it,
/// and Prometheus keeps all of them (the producer's as `((other)` and
/// `((none)`).
#[test]
fn item11_modules_named_like_the_aggregates_are_series_of_their_own() {
    if !have("prometheus") || !have("promtool") {
        eprintln!("SKIPPED: item11: `prometheus` and `promtool` are needed (Debian package prometheus; scripts/test installs it)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shm");
    std::fs::create_dir_all(&dir).unwrap();
    // The demo's leak scenario with two of its twelve layers (as large as
    // the others, and first among equals by name) named like the
    // aggregates; it has thirteen modules and allocations outside them.
    // (A producer without role lists: Adam's state, made outside every
    // module, makes that row one of the ten largest.)
    let mut sc = vramscope_collect::demo::scenario("leak", None)
        .unwrap()
        .without_roles();
    for (from, to) in [("model.layers.0", "(other)"), ("model.layers.1", "(none)")] {
        let i = sc.modules.iter().position(|m| m == from).unwrap();
        sc.modules[i] = to.to_string();
    }
    let demo = vramscope_collect::demo::start(sc, &dir, 20.0, None).unwrap();
    let ex = exporter(&dir, "node-m");
    let me = std::process::id();
    let wanted = ["(other)", "(none)", "((other)", "((none)"];
    let start = Instant::now();
    let (values, scrape) = loop {
        let (v, body) = module_rows(&ex.addr, me);
        if wanted.iter().all(|w| v.iter().any(|x| x == w))
            || start.elapsed() > Duration::from_secs(40)
        {
            break (v, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let distinct: std::collections::BTreeSet<&String> = values.iter().collect();
    assert_eq!(values.len(), 11, "{values:?}");
    assert_eq!(distinct.len(), values.len(), "{values:?}");
    for w in wanted {
        assert!(values.iter().any(|x| x == w), "{w} missing: {values:?}");
    }
    promtool_accepts(&scrape);
    // Through Prometheus: the four values, each its own series.
    let (_prom, url) = prometheus(tmp.path(), &[&ex.addr]);
    let (rt, c) = client(&url);
    let q = format!("vramscope_process_module_allocated_bytes{{pid=\"{me}\"}}");
    let rows = until(&rt, &c, &q, Duration::from_secs(30), |s| {
        wanted
            .iter()
            .all(|w| s.iter().filter(|x| x.label("module") == *w).count() == 1)
    });
    let modules: Vec<&str> = rows.iter().map(|s| s.label("module")).collect();
    for w in wanted {
        assert_eq!(
            modules.iter().filter(|m| **m == w).count(),
            1,
            "{w} in Prometheus: {modules:?}"
        );
    }
    demo.stop();
}
