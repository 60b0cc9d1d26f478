//! `vramscope record`, `replay` and `empty-cache`: headless uses of the
//! collector for scripts and ssh.
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use vramscope::collect::{self, rings::RingSet, Config, Hub, Input};
use vramscope::model::ViewOptions;
use vramscope::recording::{Recorder, Replayer};
use vramscope::ring::discover;
use vramscope::ring::{Command, SegmentReader, Start, Status};

use crate::report::bytes;

/// Sets a flag on Ctrl-C or SIGTERM.
fn stop_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        });
        f.store(true, Ordering::Release);
    });
    flag
}

pub fn record(cfg: Config, output: &Path, duration: Option<f64>) -> Result<()> {
    let hub = Hub::default();
    hub.record_to(Recorder::create(output)?);
    let stop = stop_flag();
    let nvml = if cfg.nvml {
        collect::nvml::NvmlSource::init()
    } else {
        collect::nvml::NvmlSource::disabled("NVML disabled (--no-nvml)")
    };
    let mut set = RingSet::new(cfg.clone());
    let start = Instant::now();
    let end = duration.map(Duration::from_secs_f64);
    let mut last_nvml: Option<Instant> = None;
    eprintln!("recording to {} (Ctrl-C to stop)", output.display());
    while !stop.load(Ordering::Acquire) && end.is_none_or(|e| start.elapsed() < e) {
        set.step(&hub);
        if last_nvml.is_none_or(|t| t.elapsed() >= cfg.nvml_interval) {
            last_nvml = Some(Instant::now());
            let machine = nvml.poll(vramscope::ring::monotonic_ns());
            let pids = set.host_pids();
            let fresh = collect::fresh_nvml_processes(&machine, &pids);
            hub.apply(Input::Machine {
                machine,
                host_pids: pids.into_iter().collect(),
                fresh,
            });
        }
        std::thread::sleep(cfg.ring_interval);
    }
    set.step(&hub);
    hub.stop_recording().context("finishing the recording")?;
    let snap = hub.snapshot(&ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    });
    let events: u64 = snap.processes.iter().map(|p| p.source.delivered).sum();
    eprintln!(
        "recorded {:.1} s, {} process(es), {events} events to {}",
        start.elapsed().as_secs_f64(),
        snap.processes.len(),
        output.display()
    );
    Ok(())
}

pub fn replay(file: &Path, speed: f64, json: bool) -> Result<()> {
    let hub = Hub::default();
    let mut r = Replayer::open(file)?;
    let mut first: Option<(u64, Instant)> = None;
    let mut n = 0u64;
    let mut last = 0u64;
    while let Some((t, input)) = r.next_input()? {
        last = t;
        if speed > 0.0 {
            let (t0, w0) = *first.get_or_insert((t, Instant::now()));
            let due = w0 + Duration::from_secs_f64(t.saturating_sub(t0) as f64 / 1e9 / speed);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        hub.apply(input);
        n += 1;
    }
    // Figures as of the end of the recording, whatever the clock says now.
    let opts = ViewOptions {
        block_map: json,
        recent_events: 16,
        timeline: None,
    };
    let snap = hub.snapshot_at(last, &opts);
    if json {
        println!("{}", serde_json::to_string_pretty(&snap)?);
    } else {
        eprintln!("replayed {n} inputs from {}", file.display());
        print!("{}", crate::report::snapshot(&snap));
    }
    Ok(())
}

/// Finds the segment of `pid` (host pid or the pid the process sees itself as).
fn segment_of(dir: &Path, pid: u32) -> Result<SegmentReader> {
    let (found, _) = discover::list(dir)?;
    for f in &found {
        let Ok(r) = SegmentReader::open_at(&f.path, Start::Now) else {
            continue;
        };
        let h = r.header();
        if h.pid == pid || collect::procfs::host_pid(h.pid, h.start_time) == Some(pid) {
            return Ok(r);
        }
    }
    bail!(
        "process {pid} has no vramscope agent segment in {} (start it with `vramscope run -- ...`, or see `vramscope rings`)",
        dir.display()
    )
}

pub fn empty_cache(dir: &Path, pid: u32, timeout: Duration) -> Result<()> {
    let r = segment_of(dir, pid)?;
    let out = r
        .command(Command::EmptyCache { device: None }, timeout)
        .with_context(|| format!("asking process {pid} to empty its cache"))?;
    match out.status {
        Status::Ok => {
            println!(
                "process {pid}: released {} (reserved {} -> {})",
                bytes(out.result0.saturating_sub(out.result1)),
                bytes(out.result0),
                bytes(out.result1)
            );
            Ok(())
        }
        s => bail!("process {pid} answered {s:?}: the cache was not emptied"),
    }
}

/// The requests to replay from `path`: a JSON-lines trace, or a recording
/// (then also the statistics the process reported after each request).
#[allow(clippy::type_complexity)]
pub fn sim_requests(
    path: &Path,
    pid: Option<u32>,
    device: u16,
) -> Result<(
    Vec<vramscope::sim::Request>,
    Option<Vec<Option<vramscope::event::Stats>>>,
)> {
    let mut magic = [0u8; 8];
    let is_recording = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == vramscope::recording::MAGIC;
    if !is_recording {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let reqs =
            vramscope::sim::parse_trace(&text).with_context(|| format!("in {}", path.display()))?;
        return Ok((reqs, None));
    }
    let mut r = Replayer::open(path)?;
    let mut by_process: std::collections::BTreeMap<
        vramscope::model::ProcessKey,
        Vec<vramscope::event::Event>,
    > = Default::default();
    while let Some((_, input)) = r.next_input()? {
        if let Input::Events { key, events, .. } = input {
            by_process.entry(key).or_default().extend(events);
        }
    }
    let chosen = match pid {
        Some(p) => by_process.keys().find(|k| k.pid == p).copied(),
        None => by_process
            .iter()
            .max_by_key(|(_, e)| e.len())
            .map(|(k, _)| *k),
    };
    let Some(key) = chosen else {
        bail!(
            "{}: no events of {} in this recording",
            path.display(),
            pid.map_or("any process".into(), |p| format!("process {p}"))
        );
    };
    let mut events = by_process.remove(&key).unwrap_or_default();
    events.sort_by_key(|e| e.time_ns);
    let got = vramscope::sim::from_events::requests_from_events(&events, device);
    if got.unknown_frees > 0 {
        eprintln!(
            "note: {} frees of tensors allocated before the recording started were skipped",
            got.unknown_frees
        );
    }
    Ok((got.requests, Some(got.recorded)))
}

/// Compares a replay with what the recorded process reported, on stderr.
pub fn compare_summary(
    reports: &[vramscope::sim::StepReport],
    recorded: &[Option<vramscope::event::Stats>],
    conf: Option<&str>,
) {
    let mut total = 0;
    let mut same = 0;
    let mut first_diff = None;
    for (r, s) in reports.iter().zip(recorded) {
        let Some(s) = s else { continue };
        total += 1;
        if (r.allocated, r.reserved, r.segments) == (s.allocated, s.reserved, s.segments) {
            same += 1;
        } else if first_diff.is_none() {
            first_diff = Some((r.step, r.reserved, s.reserved));
        }
    }
    let under = conf.map_or("the default configuration".to_string(), |c| {
        format!("--conf {c}")
    });
    eprintln!("under {under}: {same} of {total} recorded statistics samples match the replay exactly (allocated, reserved, segments)");
    if let Some((step, sim, real)) = first_diff {
        eprintln!(
            "first difference at request {step}: reserved {} simulated vs {} recorded",
            bytes(sim),
            bytes(real)
        );
    }
    let ooms = reports.iter().filter(|r| r.oom.is_some()).count();
    eprintln!("out-of-memory requests in the replay: {ooms}");
}

/// `replay --ui`: the recording played into the dashboard at `speed`.
pub fn replay_ui(file: &Path, speed: f64, opts: vramscope::ui::UiOptions) -> Result<()> {
    let mut r = Replayer::open(file)?;
    let hub = Arc::new(Hub::default());
    let feeder = {
        let hub = hub.clone();
        let file = file.to_path_buf();
        std::thread::Builder::new()
            .name("vramscope-replay".into())
            .spawn(move || {
                let base = vramscope::ring::monotonic_ns();
                let start = Instant::now();
                let mut t0: Option<u64> = None;
                loop {
                    let (t, mut input) = match r.next_input() {
                        Ok(Some(x)) => x,
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("vramscope: {e}");
                            break;
                        }
                    };
                    let first = *t0.get_or_insert(t);
                    let map = |x: u64| base + (x.saturating_sub(first) as f64 / speed) as u64;
                    let due = start
                        + Duration::from_secs_f64(t.saturating_sub(first) as f64 / 1e9 / speed);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    vramscope::recording::retime(&mut input, &map);
                    hub.apply(input);
                }
                let _ = file;
            })?
    };
    // STOPGAP (ui branch): the dashboard meets the collector through a Driver.
    let driver = Arc::new(crate::cli::StopgapDriver { hub: hub.clone() });
    let result = vramscope::ui::run(hub, driver, None, opts);
    drop(feeder); // the feeder ends with the process
    result
}
