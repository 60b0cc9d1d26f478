//! Measurements of `vramscope serve` and `vramscope fleet`, side by side in
//! one run (results: benches/PERFORMANCE.md, the exporter and fleet rows).
//!
//!   cargo build --release --bin vramscope --example serve_bench
//!   target/release/examples/serve_bench exporter [PROCS] [SCRAPES]
//!   target/release/examples/serve_bench fleet [TARGETS]
//!
//! `exporter`: PROCS (50) stand-in instrumented processes (each writing
//! statistics 10 times a second), two `vramscope serve` watching them: one
//! scraped SCRAPES (100) times, 600 ms apart (longer than the exporter's
//! 500 ms picture cache, so every scrape takes a new picture), the other
//! never scraped (the bare collector). Prints scrape latency (median, p99,
//! max) and both processes' CPU over the same window; the difference per
//! scrape, at one scrape every 15 s, is the exporter's cost.
//!
//! `fleet`: TARGETS (256) stand-in nodes, each serving a recorded scrape
//! (8 GPUs, 8 processes) on a port of its own, scraped by a real Prometheus
//! every 5 s; then `vramscope fleet` in a pty: the time to its first frame
//! with every node, and its CPU per refresh (1 s refreshes for 30 s), and
//! the wall time of one refresh's queries (median of 20, this client).

#[path = "../tests/stand_in/mod.rs"]
mod stand_in;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use stand_in::{exporter_at, Shape};

const SHAPE: Shape = Shape {
    base: 3 << 30,
    leak: 0,
    steps: 10,
    reserved: 5 << 30,
    inactive_split: 256 << 20,
    alloc_retries: 1,
    period_ms: 100,
};

fn vramscope_bin() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    me.parent().unwrap().parent().unwrap().join("vramscope")
}

/// CPU seconds (user + system) `pid` has used.
fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / procfs::ticks_per_second() as f64
}

fn get(addr: &str) -> (Duration, String) {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(
        b"GET /metrics HTTP/1.0\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    (t.elapsed(), out)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn exporter_bench(procs: usize, scrapes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let me = std::env::current_exe().unwrap();
    let stand_ins: Vec<_> = (0..procs)
        .map(|i| stand_in::spawn_with(&me, &[], dir.path(), &format!("job{i}"), SHAPE))
        .collect();
    let bin = vramscope_bin();
    let scraped = exporter_at(&bin, dir.path(), "scraped");
    let bare = exporter_at(&bin, dir.path(), "bare");
    let start = Instant::now();
    loop {
        let (_, text) = get(&scraped.addr);
        let n = text.matches("vramscope_process_allocated_bytes{").count();
        if n >= procs {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {n} processes seen"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, sample) = get(&bare.addr); // the bare one is scraped once, before the window
    std::thread::sleep(Duration::from_secs(1));
    let (a0, b0, t0) = (
        cpu_s(scraped.child.id()),
        cpu_s(bare.child.id()),
        Instant::now(),
    );
    let mut lat = Vec::with_capacity(scrapes);
    let mut bytes = 0;
    for _ in 0..scrapes {
        let (d, text) = get(&scraped.addr);
        bytes = text.len();
        lat.push(d);
        std::thread::sleep(Duration::from_millis(600));
    }
    let wall = t0.elapsed().as_secs_f64();
    let (a1, b1) = (cpu_s(scraped.child.id()), cpu_s(bare.child.id()));
    lat.sort();
    let (a, b) = ((a1 - a0) / wall, (b1 - b0) / wall);
    let per_scrape = ((a1 - a0) - (b1 - b0)) / scrapes as f64;
    println!(
        "exporter: {procs} instrumented processes, {scrapes} scrapes 600 ms apart, {wall:.0} s"
    );
    println!(
        "  scrape latency: median {}, p99 {}, max {} ({} bytes, {} series)",
        ms(pct(&lat, 0.5)),
        ms(pct(&lat, 0.99)),
        ms(*lat.last().unwrap()),
        bytes,
        sample.lines().filter(|l| !l.starts_with('#')).count()
    );
    println!(
        "  CPU, same window: scraped exporter {:.2} % of a core, bare collector {:.2} %",
        a * 100.0,
        b * 100.0
    );
    println!(
        "  per scrape: {:.2} ms CPU; at one scrape every 15 s: {:.3} % of a core above the bare collector",
        per_scrape * 1e3,
        per_scrape / 15.0 * 100.0
    );
    drop(stand_ins);
}

/// A recorded scrape of a node with 8 GPUs and 8 processes (one each),
/// `HOST` standing for the host label.
fn recorded_scrape() -> String {
    let mut o = String::new();
    let gib = 1u64 << 30;
    o.push_str("# TYPE vramscope_exporter_info gauge\nvramscope_exporter_info{host=\"HOST\",version=\"0.1.0\"} 1\n");
    o.push_str("# TYPE vramscope_nvml_up gauge\nvramscope_nvml_up{host=\"HOST\"} 1\n");
    for (name, f) in [
        ("vramscope_gpu_memory_total_bytes", 80 * gib),
        ("vramscope_gpu_memory_used_bytes", 61 * gib),
    ] {
        o.push_str(&format!("# TYPE {name} gauge\n"));
        for g in 0..8 {
            o.push_str(&format!(
                "{name}{{host=\"HOST\",gpu=\"{g}\",uuid=\"GPU-{g}\",name=\"NVIDIA H100 80GB HBM3\"}} {f}\n"
            ));
        }
    }
    let per_dev = [
        ("vramscope_process_allocated_bytes", 41 * gib),
        ("vramscope_process_reserved_bytes", 58 * gib),
        ("vramscope_process_active_bytes", 42 * gib),
        ("vramscope_process_inactive_split_bytes", 3 * gib),
        ("vramscope_process_allocated_peak_bytes", 52 * gib),
        ("vramscope_process_reserved_peak_bytes", 60 * gib),
        ("vramscope_process_largest_free_block_bytes", gib),
    ];
    for (name, v) in per_dev {
        o.push_str(&format!("# TYPE {name} gauge\n"));
        for g in 0..8 {
            o.push_str(&format!(
                "{name}{{host=\"HOST\",pid=\"{}\",user=\"ana\",process=\"train.py\",mode=\"exact\",device=\"0\",gpu=\"{g}\",uuid=\"GPU-{g}\"}} {v}\n",
                1000 + g
            ));
        }
    }
    o.push_str("# TYPE vramscope_process_fragmentation_ratio gauge\n");
    for g in 0..8 {
        o.push_str(&format!(
            "vramscope_process_fragmentation_ratio{{host=\"HOST\",pid=\"{}\",user=\"ana\",process=\"train.py\",mode=\"exact\",device=\"0\",gpu=\"{g}\",uuid=\"GPU-{g}\"}} 0.05\n",
            1000 + g
        ));
    }
    for (name, kind, v) in [
        ("vramscope_process_running", "gauge", 1),
        ("vramscope_process_nvml_used_bytes", "gauge", 60 * gib),
        ("vramscope_process_non_pytorch_bytes", "gauge", 2 * gib),
        ("vramscope_process_events_total", "counter", 123_456),
        ("vramscope_process_lost_events_total", "counter", 0),
        ("vramscope_process_ooms_total", "counter", 0),
        ("vramscope_process_steps_total", "counter", 420),
        ("vramscope_process_leak_suspected", "gauge", 0),
    ] {
        o.push_str(&format!("# TYPE {name} {kind}\n"));
        for g in 0..8 {
            o.push_str(&format!(
                "{name}{{host=\"HOST\",pid=\"{}\",user=\"ana\",process=\"train.py\",mode=\"exact\"}} {v}\n",
                1000 + g
            ));
        }
    }
    o
}

/// Serves the recorded scrape on `n` ports (a child process's body).
fn serve_recorded(n: usize) {
    let text = recorded_scrape();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut addrs = Vec::new();
        for i in 0..n {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addrs.push(l.local_addr().unwrap().to_string());
            let body = text.replace("HOST", &format!("node-{i:03}"));
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                loop {
                    let Ok((mut s, _)) = l.accept().await else { continue };
                    let body = body.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 4096];
                        // One request per connection (Connection: close).
                        let mut got = Vec::new();
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(k) => got.extend_from_slice(&buf[..k]),
                            }
                        }
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = s.write_all(head.as_bytes()).await;
                        let _ = s.write_all(body.as_bytes()).await;
                    });
                }
            });
        }
        println!("{}", addrs.join(","));
        std::future::pending::<()>().await;
    });
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fleet_bench(targets: usize) {
    let me = std::env::current_exe().unwrap();
    let (servers, line) = stand_in::start_reading_a_line(
        Command::new(&me).args(["serve-recorded", &targets.to_string()]),
    );
    let _servers = Killed(servers);
    let addrs: Vec<String> = line.trim().split(',').map(|a| format!("'{a}'")).collect();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 5s\nscrape_configs:\n  - job_name: vramscope\n    static_configs:\n      - targets: [{}]\n",
            addrs.join(", ")
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _prom = Killed(
        Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                tmp.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus)"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = vramscope_collect::fleet::prom::Client::new(
        vramscope_collect::fleet::prom::Endpoint::parse(&url).unwrap(),
        Duration::from_secs(10),
    );
    let start = Instant::now();
    loop {
        let n = rt
            .block_on(c.query("count(vramscope_process_allocated_bytes)"))
            .ok()
            .and_then(|s| s.first().map(|s| s.value))
            .unwrap_or(0.0);
        if n as usize >= targets * 8 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{n} series only");
        std::thread::sleep(Duration::from_millis(500));
    }
    // One refresh as the fleet view makes it: three queries and the model.
    let mut walls = Vec::new();
    let mut fleet = None;
    for _ in 0..20 {
        let t = Instant::now();
        let [up, figures, rates] = vramscope_collect::fleet::model::queries("vramscope");
        let (a, b, r) =
            rt.block_on(async { tokio::join!(c.query(&up), c.query(&figures), c.query(&rates)) });
        fleet = Some(vramscope_collect::fleet::model::Fleet::build(
            &a.unwrap(),
            &b.unwrap(),
            &r.unwrap(),
        ));
        walls.push(t.elapsed());
    }
    walls.sort();
    let f = fleet.unwrap();
    let procs: usize = f.nodes.iter().map(|n| n.procs.len()).sum();
    println!(
        "fleet: {} targets ({} up), {} GPUs, {} process rows, Prometheus scraping every 5 s",
        f.nodes.len(),
        f.nodes.len() - f.down(),
        f.nodes.iter().map(|n| n.gpus.len()).sum::<usize>(),
        procs
    );
    println!(
        "  one refresh (3 instant queries + model), wall: median {}, p90 {}",
        ms(pct(&walls, 0.5)),
        ms(pct(&walls, 0.9))
    );
    // The view itself in a pty.
    use portable_pty::{native_pty_system, CommandBuilder, PtySize};
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 50,
            cols: 160,
            pixel_width: 0,
            pixel_height: 0,
        })
        .unwrap();
    let mut cmd = CommandBuilder::new(vramscope_bin());
    cmd.args(["fleet", "--prometheus", &url, "--refresh", "1000"]);
    cmd.env("TERM", "xterm-256color");
    let t0 = Instant::now();
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    {
        let out = out.clone();
        let mut r = pair.master.try_clone_reader().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
    }
    let want = format!("{targets} nodes");
    let first = loop {
        if String::from_utf8_lossy(&out.lock().unwrap()).contains(&want) {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no frame with every node"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let pid = child.process_id().unwrap();
    let c0 = cpu_s(pid);
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(30));
    let cpu = cpu_s(pid) - c0;
    let wall = w0.elapsed().as_secs_f64();
    println!(
        "  fleet view: first frame with all {targets} nodes after {}",
        ms(first)
    );
    println!(
        "  fleet view, 1 s refreshes for {wall:.0} s: {:.1} % of a core, {:.1} ms CPU per refresh (queries, model, frame)",
        cpu / wall * 100.0,
        cpu / wall * 1e3
    );
    let _ = child.kill();
}

fn main() {
    stand_in::main();
    let args: Vec<String> = std::env::args().collect();
    let n = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    match args.get(1).map(String::as_str) {
        Some("exporter") => exporter_bench(n(2, 50), n(3, 100)),
        Some("fleet") => fleet_bench(n(2, 256)),
        Some("serve-recorded") => serve_recorded(n(2, 256)),
        _ => eprintln!("usage: serve_bench exporter [PROCS] [SCRAPES] | fleet [TARGETS]"),
    }
}
