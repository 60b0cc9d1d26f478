//! Snapshot-file parse rate, beside Python's `pickle.load` on the same file.
//!
//! `cargo bench --bench pickle` writes a snapshot with frames of about
//! 205 MB (a trace of 800,000 events, each with its own 40-frame stack over
//! 5,000 unique frames, as `_record_memory_history(stacks="python")`
//! dumps), then in one run:
//! - parses it with `vramscope_core::snapfile::read` (criterion, MB/s), the
//!   plain `pickle::parse` keeping every value (its rate and memory), and in a
//!   child process its peak RSS (VmHWM) against the file's size (and, with
//!   `VRAMSCOPE_PICKLE_BEFORE=PATH` naming another build of this bench, that
//!   build's on the same file, for a before/after in one run);
//!   `VRAMSCOPE_PICKLE_FILE=PATH` writes the file there and keeps it (to
//!   measure a child with `/usr/bin/time -v`: run this binary with
//!   `VRAMSCOPE_PICKLE_CHILD=PATH`);
//! - loads it with `python3 -c 'pickle.load(...)'`, three times, and prints
//!   both medians and the ratio.
//!
//! Under `cargo test --all-targets` (no `--bench`) the file is 1,000 events.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use vramscope_core::snapfile::{self, write, Block, Frame, Segment, SnapshotFile, TraceEntry};
use vramscope_wire::event::{BlockState, PoolId};

fn synthetic(events: usize) -> SnapshotFile {
    let frames = (0..5000)
        .map(|i| Frame {
            filename: format!(
                "/usr/lib/python3/site-packages/pkg{}/module{}.py",
                i % 40,
                i
            ),
            line: (i * 7 % 2000) as i64,
            name: format!("function_{i}"),
            extra: Vec::new(),
        })
        .collect();
    let stacks = (0..events)
        .map(|i| (0..40).map(|j| ((i * 31 + j * 97) % 5000) as u32).collect())
        .collect();
    let base = 0x7f00_0000_0000u64;
    let segments = (0..64)
        .map(|s| Segment {
            device: 0,
            address: base + s * (32 << 20),
            total_size: 20 << 20,
            allocated_size: 10 << 20,
            active_size: 10 << 20,
            requested_size: 10 << 20,
            stream: 0,
            large: true,
            pool: PoolId(0, 0),
            expandable: false,
            stack: Some(s as u32),
            blocks: vec![
                Block {
                    address: base + s * (32 << 20),
                    size: 10 << 20,
                    requested_size: 10 << 20,
                    state: BlockState::Allocated,
                    stack: Some(s as u32),
                },
                Block {
                    address: base + s * (32 << 20) + (10 << 20),
                    size: 10 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                    stack: None,
                },
            ],
        })
        .collect();
    let actions = [
        snapfile::Action::Alloc,
        snapfile::Action::FreeRequested,
        snapfile::Action::FreeCompleted,
    ];
    let trace = (0..events)
        .map(|i| TraceEntry {
            action: actions[i % 3],
            addr: base + (i as u64 % 64) * (32 << 20),
            size: 4096 * (1 + i as u64 % 1000),
            stream: 0,
            time_us: Some(1_700_000_000_000_000 + i as i64 * 13),
            stack: Some(i as u32),
            meta: None,
        })
        .collect();
    SnapshotFile {
        segments,
        traces: vec![trace],
        frames,
        stacks,
        ..SnapshotFile::default()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds `python3` takes to `pickle.load` the file, three runs.
fn python_loads(path: &Path) -> Option<Vec<f64>> {
    let code = "import pickle,sys,time\n\
                t=time.perf_counter()\n\
                with open(sys.argv[1],'rb') as f: pickle.load(f)\n\
                print(time.perf_counter()-t)";
    (0..3)
        .map(|_| {
            let out = Command::new("python3")
                .args(["-c", code])
                .arg(path)
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout).trim().parse().ok()
        })
        .collect()
}

/// Peak RSS of a process that only parses the file (this binary, or `exe`,
/// another build of it, in child mode), in bytes.
fn child_peak_rss(path: &Path, exe: Option<&Path>) -> Option<u64> {
    let exe = match exe {
        Some(e) => e.to_path_buf(),
        None => std::env::current_exe().ok()?,
    };
    let out = Command::new(exe)
        .env("VRAMSCOPE_PICKLE_CHILD", path)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn vm_hwm() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn main() {
    if let Some(p) = std::env::var_os("VRAMSCOPE_PICKLE_CHILD") {
        let file = snapfile::read(Path::new(&p)).expect("the bench file reads");
        std::hint::black_box(&file);
        println!("{}", vm_hwm().unwrap_or(0));
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let events = if full { 800_000 } else { 1_000 };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("VRAMSCOPE_PICKLE_FILE")
        .map_or_else(|| dir.path().join("big.pickle"), std::path::PathBuf::from);
    let out = std::fs::File::create(&path).expect("create");
    write::write(&synthetic(events), out).expect("write");
    let len = std::fs::metadata(&path).expect("stat").len();
    println!(
        "file: {:.1} MB, {events} trace events with 40-frame stacks",
        len as f64 / 1e6
    );

    // Ours, timed by hand too, so the ratio is of medians of one run.
    let mut ours = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let f = snapfile::read(&path).expect("reads");
        ours.push(t.elapsed().as_secs_f64());
        assert_eq!(f.traces[0].len(), events);
    }
    let ours = median(ours);
    println!(
        "vramscope snapfile::read: median {:.3} s = {:.0} MB/s",
        ours,
        len as f64 / 1e6 / ours
    );
    // The pickle reader alone, every value kept (the plain reading, which
    // `snapfile::read` falls back to), and what its values take.
    let mut parse = Vec::new();
    let mut held = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let f = std::fs::File::open(&path).expect("open");
        let doc = vramscope_core::pickle::parse(f, len).expect("parses");
        parse.push(t.elapsed().as_secs_f64());
        held = doc.memory_bytes();
    }
    let parse = median(parse);
    println!(
        "plain pickle::parse (every value kept): median {:.3} s = {:.0} MB/s, its values {:.1} MB = {:.2} × the file",
        parse,
        len as f64 / 1e6 / parse,
        held as f64 / 1e6,
        held as f64 / len as f64
    );
    // VRAMSCOPE_PICKLE_BEFORE: another build of this bench (an earlier
    // commit's), measured on the same file beside this one.
    let before = std::env::var_os("VRAMSCOPE_PICKLE_BEFORE").map(std::path::PathBuf::from);
    let other = before
        .as_deref()
        .map(|b| (Some(b), "VRAMSCOPE_PICKLE_BEFORE"));
    for (exe, what) in [(None, "this build")].into_iter().chain(other) {
        if let Some(rss) = child_peak_rss(&path, exe) {
            println!(
                "peak RSS parsing it ({what}): {:.1} MB = {:.2} × the file",
                rss as f64 / 1e6,
                rss as f64 / len as f64
            );
        }
    }
    match python_loads(&path) {
        Some(py) => {
            let py = median(py);
            println!(
                "python3 pickle.load: median {:.3} s = {:.0} MB/s; vramscope is {:.2}× its time",
                py,
                len as f64 / 1e6 / py,
                ours / py
            );
        }
        None => println!("SKIPPED: python3 pickle.load (no python3)"),
    }

    let mut c = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(Duration::from_secs(if full { 20 } else { 1 }));
    let mut g = c.benchmark_group("snapfile");
    g.throughput(Throughput::Bytes(len));
    g.bench_function("read", |b| b.iter(|| snapfile::read(&path).expect("reads")));
    g.finish();
    c.final_summary();
}
