//! The live-path benchmark (issue 28): N stand-in producers, each a process
//! of its own writing a real job's allocator events through a real segment
//! at a set rate, watched by `vramscope serve` (no scrapes) and by the
//! dashboard in a pty (the process view open); each watcher measured by its
//! own CPU time and RSS over a fixed window. Results and how to read them:
//! `benches/LIVE_RESULTS.md`.
//!
//!   cargo build --release --bin vramscope --example live_bench
//!   target/release/examples/live_bench run 8 100000 60 --runs 3
//!   target/release/examples/live_bench idle 60 --runs 3
//!
//! Subcommands:
//!
//! - `producer DIR RATE SECONDS [--rec FILE | --sim]`: one stand-in. It
//!   creates its segment as the exact-mode agent does (producer TorchExact,
//!   an agent ring and one device ring of 65,536 slots, flags: events,
//!   statistics, positions, context tags) and writes RATE events a second,
//!   in batches every millisecond, each stamped with the clock when
//!   written. The events are those of the committed recording of a real
//!   job (default `tests/fixtures/recordings/placed/gpt2-placed.vsrec`: a
//!   one-layer GPT-2, AdamW, bf16, 30 optimizer steps, 13,940 allocator
//!   events, statistics with their ring positions, step markers, contexts
//!   and module strings), replayed in a loop: each loop's addresses are
//!   shifted, its step markers (and the step tags of its events) continue
//!   the previous loop's, its statistics samples keep their exact ring
//!   positions; definitions and the initial snapshot are written once, as
//!   the agent writes them; statistics go out at most every 100 ms (the
//!   agent's period); at the end of a loop everything still live is freed
//!   and the segments released (as `empty_cache` does), so the next loop
//!   starts from an empty allocator and the model stays exact. `--sim`: the simulator's events instead (random sizes).
//!   Commands are answered: Ping ok, everything else "unsupported" (a
//!   snapshot request would mean the model lost track: counted). It
//!   writes nothing until a line ("go") arrives on its standard input, and
//!   stops when that closes. Every second (and at exit) it writes what it
//!   wrote into `STATUS_DIR/<pid>`.
//! - `run N RATE SECONDS`: N producers, `vramscope serve` and the
//!   dashboard; once both watchers map every segment the producers start
//!   (the watchers see every stream from its start), and after `--warmup`
//!   seconds (10) the window of SECONDS starts. At the end the dashboard is
//!   sent Esc, for the overview (`--screen` writes both screens).
//!   Options: `--runs R` (1; medians printed), `--view process|overview`,
//!   `--size COLSxROWS` (200x60), `--only serve|dash`, `--nvml` (let the
//!   watchers poll NVML; off by default, as this VM has no GPU), `--rec`,
//!   `--sim`, `--bin PATH` (the vramscope binary, default beside this
//!   example's directory), `--perf DIR` (perf record both watchers over
//!   the window: `--call-graph dwarf`, `--perf-freq HZ` (499); summarise with
//!   `scripts/live_perf_summary.py`), `--heaptrack DIR` (run both watchers
//!   under heaptrack: `DIR/serve.*.zst`, `DIR/dash.*.zst`; the CPU figures
//!   mean nothing then), `--screen FILE` (the dashboard's
//!   last screen as text), `--json FILE`.
//! - `idle SECONDS`: the same watchers with no producer (NVML polled).
//! - `check [SECONDS]`: one producer watched by an in-process collector:
//!   prints the model's verdict (lost, inconsistencies, resync) and its
//!   memory estimate, to check the stream is exact.
//! - `stages [EVENTS] [PROCS]`: the parts of the live path on the same
//!   stream, in this process (decode, the collector's batch, merge and
//!   unzip, the model with 1 and PROCS processes, the views' snapshot).
//! - `inspect FILE`: what a recording holds.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vramscope_core::input::Input;
use vramscope_core::recording::Replayer;
use vramscope_wire::event::{Event, EventKind, MarkSource, Place, RingSpan};
use vramscope_wire::ring::codec::{encode, Words};
use vramscope_wire::ring::{monotonic_ns, Producer, SegmentConfig, SegmentWriter, Status};

const DEFAULT_REC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/recordings/placed/gpt2-placed.vsrec"
);
/// The agent's default ring size (`VRAMSCOPE_SLOTS`).
const SLOTS: u64 = 1 << 16;
/// The exact-mode agent's statistics period (`VRAMSCOPE_STATS_MS`).
const STATS_NS: u64 = 100_000_000;
/// Header flags of the exact agent with tagging: events, statistics,
/// positions, context tags (FORMAT.md).
const AGENT_FLAGS: u32 = 1 | 2 | 8 | 16;

// ---------------------------------------------------------------- streams

/// One event of a recording: its ring, and for device-ring records their
/// recorded position.
#[derive(Clone)]
struct Item {
    ring: usize,
    ev: Event,
}

/// A recorded job's events, ready to loop.
struct Recorded {
    items: Vec<Item>,
    /// Recorded positions of the device ring's records, in order.
    dev_positions: Vec<u64>,
    /// Steps in one loop (the largest marker value).
    steps: u64,
}

fn is_alloc_event(k: &EventKind) -> bool {
    k.place().is_some()
}

/// Events the model counts (`vramscope_process_events_total`).
fn model_counts(k: &EventKind) -> bool {
    is_alloc_event(k) || matches!(k, EventKind::Marker { .. })
}

/// A recorded event: its ring and position (when the recording gives
/// them) and the event.
type RecordedEvent = (Option<u32>, Option<u64>, Event);

/// Ends the bench with one line naming what is wrong with the recording
/// (the replayer's errors name its path).
fn unreadable(e: impl std::fmt::Display) -> ! {
    eprintln!("live_bench: {e}");
    std::process::exit(2)
}

fn load(path: &Path) -> Recorded {
    let mut r = Replayer::open(path).unwrap_or_else(|e| unreadable(e));
    let mut per: HashMap<u32, Vec<RecordedEvent>> = HashMap::new();
    while let Some((_, input)) = r.next_input().unwrap_or_else(|e| unreadable(e)) {
        if let Input::Events(b) = input {
            let v = per.entry(b.key.pid).or_default();
            for (e, p) in b.positioned() {
                v.push((p.map(|p| p.ring), p.map(|p| p.position), e));
            }
        }
    }
    // The busiest process of the recording.
    let events = per
        .into_values()
        .max_by_key(|v| v.len())
        .expect("a recording with events");
    let mut items = Vec::with_capacity(events.len());
    let mut dev_positions = Vec::new();
    let mut steps = 0;
    for (ring, pos, ev) in events {
        let dev = is_alloc_event(&ev.kind);
        let ring = match ring {
            Some(r) => r as usize,
            None => usize::from(dev),
        };
        if ring == 1 {
            dev_positions.push(pos.unwrap_or(dev_positions.len() as u64));
        }
        if let EventKind::Marker { value, .. } = ev.kind {
            steps = steps.max(value);
        }
        items.push(Item { ring, ev });
    }
    Recorded {
        items,
        dev_positions,
        steps: steps.max(1),
    }
}

/// Writes events into the segment, stamping each with the clock.
struct Sink<'a> {
    seg: &'a SegmentWriter,
    words: Vec<Words>,
    sample: u32,
    records: u64,
    events: u64,
    counted: u64,
}

/// Where a source's events go: a segment ([`Sink`]) or memory
/// ([`MemSink`], for `stages`).
trait Out {
    /// Writes `e` into ring `ring`, stamped with the clock.
    fn write(&mut self, ring: usize, e: Event);
    /// The device ring's head (records written into it so far).
    fn dev_head(&self) -> u64;
    /// The clock.
    fn now(&self) -> u64;
}

impl Out for Sink<'_> {
    fn write(&mut self, ring: usize, mut e: Event) {
        e.time_ns = monotonic_ns();
        if matches!(e.kind, EventKind::Stats { .. }) {
            self.sample = self.sample.wrapping_add(1);
        }
        self.words.clear();
        encode(&e, self.sample, &mut self.words);
        let w = self.seg.ring(ring);
        for x in &self.words {
            w.write(x);
        }
        self.records += self.words.len() as u64;
        self.events += 1;
        self.counted += u64::from(model_counts(&e.kind));
    }
    fn dev_head(&self) -> u64 {
        self.seg.ring(1).head()
    }
    fn now(&self) -> u64 {
        monotonic_ns()
    }
}

/// Events kept in memory with their ring positions, 10 µs apart (100,000
/// events a second).
#[derive(Default)]
struct MemSink {
    out: Vec<(Event, vramscope_wire::event::RingPos)>,
    heads: [u64; 2],
    t: u64,
}

impl Out for MemSink {
    fn write(&mut self, ring: usize, mut e: Event) {
        self.t += 10_000;
        e.time_ns = self.t;
        let records = if matches!(e.kind, EventKind::Stats { .. }) {
            2
        } else {
            1
        };
        self.heads[ring] += records;
        let at = vramscope_wire::event::RingPos {
            ring: ring as u32,
            position: self.heads[ring] - 1,
        };
        self.out.push((e, at));
    }
    fn dev_head(&self) -> u64 {
        self.heads[1]
    }
    fn now(&self) -> u64 {
        self.t
    }
}

/// A source of events for one producer.
trait Source {
    /// Writes the next event (or a few); returns how many events it wrote.
    fn next(&mut self, sink: &mut dyn Out) -> u64;
}

/// What is live in the replayed allocator (to free it at the end of a loop).
#[derive(Default)]
struct Shadow {
    /// Block address → (place, request, pending free).
    blocks: BTreeMap<u64, (Place, u64, bool)>,
    segments: BTreeMap<u64, (Place, u64)>,
}

struct Looped {
    rec: Recorded,
    at: usize,
    /// Loops done.
    round: u64,
    /// Device-ring head when this loop began.
    dev_base: u64,
    shadow: Shadow,
    last_stats: Option<u64>,
    /// The last statistics sample was skipped (so is its STATS_C).
    skipped_sample: bool,
    /// Cleanup events still to write at the end of a loop.
    tail: Vec<(usize, Event)>,
}

impl Looped {
    fn new(rec: Recorded) -> Self {
        Looped {
            rec,
            at: 0,
            round: 0,
            dev_base: 0,
            shadow: Shadow::default(),
            last_stats: None,
            skipped_sample: false,
            tail: Vec::new(),
        }
    }

    /// Address shift of this loop.
    fn shift(&self) -> u64 {
        (self.round % 1024) << 40
    }

    /// A recorded device-ring position, as written in this loop.
    fn position(&self, recorded: u64) -> u64 {
        self.dev_base + self.rec.dev_positions.partition_point(|&p| p < recorded) as u64
    }

    fn span(&self, s: RingSpan) -> RingSpan {
        RingSpan {
            before: self.position(s.before),
            after: self.position(s.after),
            ..s
        }
    }

    fn retag(&self, mut place: Place) -> Place {
        if place.ctx.step_tag != 0 {
            let step = u64::from(place.ctx.step_tag - 1) + self.round * self.rec.steps;
            place.ctx.step_tag = vramscope_wire::event::CtxTag::step_tag_of(step);
        }
        place
    }

    /// This loop's version of recorded event `e`, or None if it is not
    /// written (definitions and snapshots after the first loop, samples
    /// within the statistics period).
    fn rewrite(&mut self, e: &Event, now: u64) -> Option<Event> {
        let first = self.round == 0;
        let shift = self.shift();
        let kind = match e.kind {
            EventKind::Alloc { place, addr, size } => {
                let addr = addr + shift;
                let place = self.retag(place);
                self.shadow.blocks.insert(addr, (place, size, false));
                EventKind::Alloc { place, addr, size }
            }
            EventKind::FreeRequested { place, addr, size } => {
                let addr = addr + shift;
                if let Some(b) = self.shadow.blocks.get_mut(&addr) {
                    b.2 = true;
                }
                EventKind::FreeRequested {
                    place: self.retag(place),
                    addr,
                    size,
                }
            }
            EventKind::FreeCompleted { place, addr, size } => {
                let addr = addr + shift;
                self.shadow.blocks.remove(&addr);
                EventKind::FreeCompleted {
                    place: self.retag(place),
                    addr,
                    size,
                }
            }
            EventKind::SegmentAlloc { place, addr, size } => {
                let addr = addr + shift;
                self.shadow.segments.insert(addr, (place, size));
                EventKind::SegmentAlloc { place, addr, size }
            }
            EventKind::SegmentFree { place, addr, size } => {
                let addr = addr + shift;
                self.shadow.segments.remove(&addr);
                EventKind::SegmentFree { place, addr, size }
            }
            EventKind::SegmentMap { place, addr, size } => EventKind::SegmentMap {
                place,
                addr: addr + shift,
                size,
            },
            EventKind::SegmentUnmap { place, addr, size } => EventKind::SegmentUnmap {
                place,
                addr: addr + shift,
                size,
            },
            EventKind::Oom {
                place,
                device_free,
                request,
            } => EventKind::Oom {
                place,
                device_free,
                request,
            },
            EventKind::Stats { device, stats } => {
                if self
                    .last_stats
                    .is_some_and(|t| now.saturating_sub(t) < STATS_NS)
                {
                    self.skipped_sample = true;
                    return None;
                }
                self.skipped_sample = false;
                self.last_stats = Some(now);
                EventKind::Stats { device, stats }
            }
            EventKind::StatsPosition { device, at } => {
                if self.skipped_sample {
                    return None;
                }
                EventKind::StatsPosition {
                    device,
                    at: self.span(at),
                }
            }
            EventKind::Marker { value, source } => EventKind::Marker {
                value: value + self.round * self.rec.steps,
                source,
            },
            EventKind::SnapshotBegin {
                device,
                id,
                segments,
                blocks,
                at,
            } if first => EventKind::SnapshotBegin {
                device,
                id,
                segments,
                blocks,
                at: at.map(|s| self.span(s)),
            },
            EventKind::SnapshotSegment {
                id,
                place,
                addr,
                size,
                pool_kind,
                expandable,
            } if first => {
                self.shadow.segments.insert(addr, (place, size));
                EventKind::SnapshotSegment {
                    id,
                    place,
                    addr,
                    size,
                    pool_kind,
                    expandable,
                }
            }
            k @ (EventKind::SnapshotBlock { .. } | EventKind::SnapshotEnd { .. }) if first => k,
            k @ (EventKind::StringChunk { .. }
            | EventKind::Frame { .. }
            | EventKind::Stack { .. }
            | EventKind::Context { .. }
            | EventKind::Dropped { .. })
                if first =>
            {
                k
            }
            _ => return None,
        };
        Some(Event {
            time_ns: e.time_ns,
            kind,
        })
    }

    /// The end of a loop: free what is live, release the segments (as
    /// `empty_cache` does).
    fn cleanup(&mut self) -> Vec<(usize, Event)> {
        let mut out = Vec::new();
        let ev = |kind| Event { time_ns: 0, kind };
        for (&addr, &(place, size, pending)) in &self.shadow.blocks {
            if !pending {
                out.push((1, ev(EventKind::FreeRequested { place, addr, size })));
            }
            out.push((1, ev(EventKind::FreeCompleted { place, addr, size })));
        }
        for (&addr, &(place, size)) in &self.shadow.segments {
            out.push((1, ev(EventKind::SegmentFree { place, addr, size })));
        }
        self.shadow = Shadow::default();
        out
    }
}

impl Source for Looped {
    fn next(&mut self, sink: &mut dyn Out) -> u64 {
        if let Some((ring, e)) = self.tail.pop() {
            sink.write(ring, e);
            return 1;
        }
        if self.at == self.rec.items.len() {
            let mut tail = self.cleanup();
            tail.reverse();
            self.tail = tail;
            self.at = 0;
            self.round += 1;
            // The cleanup's records come before this loop's positions.
            self.dev_base =
                sink.dev_head() + self.tail.iter().filter(|(r, _)| *r == 1).count() as u64;
            return 0;
        }
        let item = self.rec.items[self.at].clone();
        self.at += 1;
        match self.rewrite(&item.ev, sink.now()) {
            Some(e) => {
                sink.write(item.ring, e);
                1
            }
            None => 0,
        }
    }
}

/// The simulator allocating and freeing (as `examples/busy_writer.rs`),
/// with statistics every 100 ms and a step marker every 2,000 events.
struct Simulated {
    a: vramscope_core::sim::SimAllocator,
    held: Vec<u64>,
    buf: Vec<Event>,
    n: u64,
    last_stats: u64,
    step: u64,
}

impl Simulated {
    fn new() -> Self {
        Simulated {
            a: vramscope_core::sim::SimAllocator::new(vramscope_core::sim::SimConfig {
                capacity: 80 << 30,
                ..vramscope_core::sim::SimConfig::default()
            }),
            held: Vec::new(),
            buf: Vec::new(),
            n: 0,
            last_stats: 0,
            step: 0,
        }
    }
}

impl Source for Simulated {
    fn next(&mut self, sink: &mut dyn Out) -> u64 {
        let now = sink.now();
        self.a.set_time(now);
        self.n += 1;
        if self.held.len() > 2000 || (self.n % 3 == 0 && !self.held.is_empty()) {
            let p = self
                .held
                .swap_remove((self.n as usize * 7919) % self.held.len());
            self.a.free(p, &mut self.buf).expect("sim free");
        } else {
            let size = (self.n * 104_729) % (8 << 20) + 1;
            let p = self.a.malloc(size, 0, &mut self.buf).expect("sim malloc");
            self.held.push(p);
        }
        if now.saturating_sub(self.last_stats) >= STATS_NS {
            self.a.emit_stats(&mut self.buf);
            self.last_stats = now;
        }
        if self.n % 2000 == 0 {
            self.step += 1;
            self.buf.push(Event {
                time_ns: now,
                kind: EventKind::Marker {
                    value: self.step,
                    source: MarkSource::OptimizerStep { optimizer: 1 },
                },
            });
        }
        let mut n = 0;
        for e in self.buf.drain(..) {
            let ring = usize::from(is_alloc_event(&e.kind));
            sink.write(ring, e);
            n += 1;
        }
        n
    }
}

// --------------------------------------------------------------- producer

struct ProducerArgs {
    dir: PathBuf,
    rate: f64,
    secs: f64,
    rec: Option<PathBuf>,
    status_dir: Option<PathBuf>,
}

fn producer(a: ProducerArgs) {
    let mut cfg = SegmentConfig::new(&a.dir, Producer::TorchExact, 1, SLOTS);
    cfg.flags = AGENT_FLAGS;
    cfg.framework = "torch 2.11.0+cu130 (live_bench replay)".into();
    let mut source: Box<dyn Source> = match &a.rec {
        Some(p) => {
            cfg.label = format!(
                "live_bench {}",
                p.file_stem().unwrap_or_default().to_string_lossy()
            );
            Box::new(Looped::new(load(p)))
        }
        None => {
            cfg.label = "live_bench sim".into();
            Box::new(Simulated::new())
        }
    };
    let seg = SegmentWriter::create(&cfg).expect("create the segment");
    let server = seg.command_server();
    let mut sink = Sink {
        seg: &seg,
        words: Vec::with_capacity(4),
        sample: 0,
        records: 0,
        events: 0,
        counted: 0,
    };
    println!("producer ready");
    // Nothing is written before the harness says "go" (once the watchers
    // have mapped every segment: they watch from the start, as they would
    // a job started after them).
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).unwrap_or(0) == 0 {
        return;
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        // The harness closes our stdin to stop us.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
            stop.store(true, Ordering::Release);
        });
    }
    let status = a
        .status_dir
        .as_ref()
        .map(|d| d.join(std::process::id().to_string()));
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    let write_status = |sink: &Sink, commands: &BTreeMap<String, u64>, t: f64| {
        if let Some(p) = &status {
            let tmp = p.with_extension("tmp");
            let text = format!(
                "{} {} {} {:.6} {:?}\n",
                sink.events, sink.records, sink.counted, t, commands
            );
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    };
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut last_beat = Instant::now();
    // At most 100 ms of events in one burst when this process fell behind.
    let max_lag = (a.rate * 0.1).max(1.0) as u64;
    while !stop.load(Ordering::Acquire) {
        let el = t0.elapsed().as_secs_f64();
        if el >= a.secs {
            break;
        }
        let target = (a.rate * el) as u64;
        if target > sent + max_lag {
            sent = target - max_lag;
        }
        while sent < target {
            sent += source.next(&mut sink);
        }
        if let Some(req) = server.poll() {
            let name = format!("{:?}", req.command);
            let name = name
                .split([' ', '{', '('])
                .next()
                .unwrap_or("?")
                .to_string();
            *commands.entry(name).or_insert(0) += 1;
            match req.command {
                vramscope_wire::ring::Command::Ping { value } => {
                    server.answer(req, Status::Ok, value, 0)
                }
                _ => server.answer(req, Status::Unsupported, 0, 0),
            }
        }
        if last_beat.elapsed() >= Duration::from_secs(1) {
            seg.heartbeat();
            write_status(&sink, &commands, t0.elapsed().as_secs_f64());
            last_beat = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    write_status(&sink, &commands, t0.elapsed().as_secs_f64());
    drop(seg);
}

// ----------------------------------------------------------- measurement

/// CPU seconds of `pid`'s live advisor thread (`vramscope-advisor`,
/// 15 characters of it in `comm`), None when it has none.
fn advisor_cpu(pid: i32) -> Option<f64> {
    let p = procfs::process::Process::new(pid).ok()?;
    p.tasks()
        .ok()?
        .flatten()
        .filter_map(|t| t.stat().ok())
        .find(|s| s.comm.starts_with("vramscope-advis"))
        .map(|s| cpu_ticks_s(&s))
}

fn cpu_ticks_s(stat: &procfs::process::Stat) -> f64 {
    (stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64
}

/// CPU seconds the whole machine was busy so far (all cores).
fn machine_busy_s() -> f64 {
    use procfs::CurrentSI;
    let Ok(k) = procfs::KernelStats::current() else {
        return 0.0;
    };
    let t = k.total;
    let busy = t.user
        + t.nice
        + t.system
        + t.irq.unwrap_or(0)
        + t.softirq.unwrap_or(0)
        + t.steal.unwrap_or(0);
    busy as f64 / procfs::ticks_per_second() as f64
}

/// CPU seconds and RSS bytes of `pid`, and the CPU seconds of its main
/// thread (the dashboard's UI thread; serve's HTTP runtime). The other
/// threads (the collector's runtime: its threads come and go) are the
/// rest.
fn sample(pid: i32) -> Option<(f64, u64, f64)> {
    let p = procfs::process::Process::new(pid).ok()?;
    let st = p.stat().ok()?;
    let main = p
        .task_from_tid(pid)
        .and_then(|t| t.stat())
        .map_or(0.0, |s| cpu_ticks_s(&s));
    Some((cpu_ticks_s(&st), st.rss * procfs::page_size(), main))
}

/// What a producer wrote so far (its status file), and when (seconds
/// since it started).
#[derive(Default, Clone, Copy)]
struct Written {
    events: u64,
    records: u64,
    counted: u64,
    t: f64,
}

/// Every producer's status by pid, and notes (commands it was sent).
fn read_status(dir: &Path) -> (BTreeMap<String, Written>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut notes = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().extension().is_some() {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let f: Vec<&str> = text.splitn(5, ' ').collect();
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let pid = e.file_name().to_string_lossy().into_owned();
        if let Some(c) = f.get(4) {
            if c.trim() != "{}" {
                notes.push(format!("producer {pid} was sent commands {}", c.trim()));
            }
        }
        let t = f.get(3).and_then(|s| s.parse().ok()).unwrap_or(0.0);
        out.insert(
            pid,
            Written {
                events: n(0),
                records: n(1),
                counted: n(2),
                t,
            },
        );
    }
    (out, notes)
}

/// Rates (events, counted, records per second) between two readings,
/// each producer over its own clock.
fn rates(a: &BTreeMap<String, Written>, b: &BTreeMap<String, Written>) -> (f64, f64, f64) {
    let mut r = (0.0, 0.0, 0.0);
    for (pid, w1) in b {
        let Some(w0) = a.get(pid) else { continue };
        let dt = w1.t - w0.t;
        if dt <= 0.0 {
            continue;
        }
        r.0 += (w1.events - w0.events) as f64 / dt;
        r.1 += (w1.counted - w0.counted) as f64 / dt;
        r.2 += (w1.records - w0.records) as f64 / dt;
    }
    r
}

/// The LOST column of the dashboard's overview for `n` processes (None if
/// it is not on the screen).
fn lost_column(screen: &str, n: usize) -> Option<Vec<String>> {
    let lines: Vec<Vec<char>> = screen.lines().map(|l| l.chars().collect()).collect();
    let head = lines.iter().position(|l| {
        let s: String = l.iter().collect();
        s.contains(" LOST ") && s.contains(" PID ")
    })?;
    let s: String = lines[head].iter().collect();
    let at = s[..s.find(" LOST ")?].chars().count() + 1;
    let rows: Vec<String> = lines[head + 1..]
        .iter()
        .take(n)
        .map(|l| {
            l.iter()
                .skip(at.saturating_sub(2))
                .take(6)
                .collect::<String>()
                .trim()
                .to_string()
        })
        .collect();
    (rows.len() == n).then_some(rows)
}

/// How many files of `dir` process `pid` maps (the segments it reads).
fn mapped(pid: i32, dir: &Path) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let d = format!("{}/", dir.display());
    let files: std::collections::HashSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|f| f.starts_with(&d))
        .collect();
    files.len()
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Serve {
    child: Killed,
    /// The vramscope process itself (the child's child under a wrapper).
    pid: i32,
    addr: String,
}

/// The process named `vramscope` that `parent` started (under a wrapper
/// such as heaptrack), or `parent` itself when it is one.
fn vramscope_of(parent: i32) -> i32 {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if let Ok(p) = procfs::process::Process::new(parent).and_then(|p| p.stat()) {
            if p.comm == "vramscope" {
                return parent;
            }
        }
        for p in procfs::process::all_processes()
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(st) = p.stat() {
                if st.ppid == parent && st.comm == "vramscope" {
                    return st.pid;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    parent
}

/// The command that runs `bin`: itself, or under heaptrack writing into
/// `heaptrack/<name>`.
fn watcher_cmd(bin: &Path, heaptrack: Option<&Path>, name: &str) -> (PathBuf, Vec<String>) {
    match heaptrack {
        Some(d) => (
            PathBuf::from("heaptrack"),
            vec![
                "-o".into(),
                d.join(name).display().to_string(),
                bin.display().to_string(),
            ],
        ),
        None => (bin.to_path_buf(), Vec::new()),
    }
}

fn start_serve(
    bin: &Path,
    dir: &Path,
    nvml: bool,
    heaptrack: Option<&Path>,
    advise: bool,
) -> Serve {
    use std::io::BufRead;
    let (exe, pre) = watcher_cmd(bin, heaptrack, "serve");
    let mut cmd = Command::new(exe);
    cmd.args(pre)
        .args(["serve", "--listen", "127.0.0.1:0", "--host", "bench"])
        .arg("--shm-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !nvml {
        cmd.arg("--no-nvml");
    }
    if advise {
        cmd.arg("--advise");
    }
    let mut child = cmd.spawn().expect("start vramscope serve");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("serve ended before it served");
        }
        if let Some(a) = line
            .trim()
            .strip_prefix("serving metrics on http://")
            .and_then(|r| r.strip_suffix("/metrics"))
        {
            break a.to_string();
        }
    };
    // (Its later output is not read: nothing more is printed.)
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let pid = vramscope_of(child.id() as i32);
    Serve {
        child: Killed(child),
        pid,
        addr,
    }
}

impl Serve {
    /// Ends serve with SIGTERM (so a wrapper such as heaptrack finishes
    /// its file), waiting up to a minute.
    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(_)) = self.child.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.0.kill();
    }
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to serve");
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Sum of a metric's samples in a scrape.
fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix(name) {
            if rest.starts_with('{') || rest.starts_with(' ') {
                let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
                *found.get_or_insert(0.0) += v;
            }
        }
    }
    found
}

struct Dash {
    child: Box<dyn portable_pty::Child + Send + Sync>,
    /// The vramscope process itself (the child's child under a wrapper).
    pid: i32,
    _master: Box<dyn portable_pty::MasterPty + Send>,
    writer: Mutex<Box<dyn Write + Send>>,
    screen: Arc<Mutex<vt100::Parser>>,
    bytes: Arc<Mutex<u64>>,
}

impl Dash {
    fn pid(&self) -> i32 {
        self.pid
    }
    fn contents(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }
}

impl Drop for Dash {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.get_mut() {
            let _ = w.write_all(b"q");
            let _ = w.flush();
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_dash(
    bin: &Path,
    dir: &Path,
    pid: Option<u32>,
    size: (u16, u16),
    nvml: bool,
    heaptrack: Option<&Path>,
    advise: bool,
) -> Dash {
    use portable_pty::{native_pty_system, CommandBuilder, PtySize};
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: size.1,
            cols: size.0,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("a pty");
    let (exe, pre) = watcher_cmd(bin, heaptrack, "dash");
    let mut cmd = CommandBuilder::new(exe);
    cmd.args(pre);
    cmd.cwd(std::env::current_dir().unwrap());
    cmd.arg("--shm-dir");
    cmd.arg(dir);
    if !nvml {
        cmd.arg("--no-nvml");
    }
    if advise {
        cmd.arg("--advise");
    }
    if let Some(p) = pid {
        cmd.arg("--pid");
        cmd.arg(p.to_string());
    }
    cmd.env("TERM", "xterm-256color");
    cmd.env_remove("NO_COLOR");
    // No settings file of this user's.
    cmd.env("XDG_CONFIG_HOME", dir.join("no-config"));
    let child = pair.slave.spawn_command(cmd).expect("start the dashboard");
    drop(pair.slave);
    let pid = vramscope_of(child.process_id().expect("dashboard pid") as i32);
    let writer = pair.master.take_writer().unwrap();
    let screen = Arc::new(Mutex::new(vt100::Parser::new(
        std::num::NonZeroU16::new(size.1).expect("rows"),
        std::num::NonZeroU16::new(size.0).expect("columns"),
        0,
    )));
    let bytes = Arc::new(Mutex::new(0u64));
    {
        let (screen, bytes) = (screen.clone(), bytes.clone());
        let mut r = pair.master.try_clone_reader().unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                screen.lock().unwrap().process(&buf[..n]);
                *bytes.lock().unwrap() += n as u64;
            }
        });
    }
    Dash {
        child,
        pid,
        _master: pair.master,
        writer: Mutex::new(writer),
        screen,
        bytes,
    }
}

/// One watcher's figures over a window.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Watcher {
    cpu_s: f64,
    /// RSS samples (bytes), one a second from the start of the watcher.
    rss: Vec<u64>,
    /// CPU seconds of the main thread over the window (the dashboard's UI
    /// thread, serve's HTTP runtime); `cpu_s` less it is the collector's
    /// runtime.
    main_s: f64,
    /// With `--advise`: the advisor thread's CPU seconds since the watcher
    /// started, and how long that was.
    advisor: Option<(f64, f64)>,
}

impl Watcher {
    fn rss_at(&self, s: usize) -> u64 {
        self.rss
            .get(s.min(self.rss.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
struct RunResult {
    producers: usize,
    rate: f64,
    window_s: f64,
    warmup_s: f64,
    /// Events written by the producers in the window (all kinds), per second.
    events_per_s: f64,
    /// Of which allocator events and markers (what the model counts).
    counted_per_s: f64,
    records_per_s: f64,
    producers_cpu_s: f64,
    /// The whole machine's busy CPU over the window (100 = one core).
    machine_busy_pct: f64,
    /// Of which not the producers' nor the watchers' (this harness, and
    /// whatever else ran: another build).
    others_pct: f64,
    serve: Option<Watcher>,
    dash: Option<Watcher>,
    lost: Option<f64>,
    events_total: Option<f64>,
    /// With `--advise`: serve's advisor, summed over processes: requests
    /// replayed, and processes it still follows.
    advice_requests: Option<f64>,
    advice_following: Option<f64>,
    written_counted_total: u64,
    dash_bytes_per_s: f64,
    /// The dashboard's LOST column at the end, one per process.
    dash_lost: Option<Vec<String>>,
    notes: Vec<String>,
}

#[derive(Clone)]
struct RunOpts {
    n: usize,
    rate: f64,
    window: f64,
    warmup: f64,
    view_process: bool,
    size: (u16, u16),
    serve: bool,
    dash: bool,
    nvml: bool,
    rec: Option<PathBuf>,
    bin: PathBuf,
    perf: Option<PathBuf>,
    /// Samples a second (`--perf-freq`, 499).
    perf_freq: u32,
    heaptrack: Option<PathBuf>,
    screen: Option<PathBuf>,
    /// `--advise`: the watchers run the live advisor on every process.
    advise: bool,
}

fn perf_record(pid: i32, out: &Path, secs: f64, freq: u32) -> Child {
    Command::new("perf")
        .args(["record", "-F", &freq.to_string()])
        .args(["--call-graph", "dwarf,16384", "-o"])
        .arg(out)
        .args(["-p", &pid.to_string(), "--", "sleep"])
        .arg(format!("{secs}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf")
}

fn run_once(o: &RunOpts) -> RunResult {
    let dir = tempfile::Builder::new()
        .prefix("vs-live-bench-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let status = tempfile::tempdir().unwrap();
    let me = std::env::current_exe().unwrap();
    let mut producers = Vec::new();
    let total_s = o.warmup + o.window + 30.0;
    for _ in 0..o.n {
        let mut cmd = Command::new(&me);
        cmd.arg("producer")
            .arg(dir.path())
            .arg(o.rate.to_string())
            .arg(total_s.to_string())
            .arg("--status")
            .arg(status.path());
        match &o.rec {
            Some(r) => cmd.arg("--rec").arg(r),
            None => cmd.arg("--sim"),
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a producer");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        if !line.contains("producer ready") {
            // The producer said why on stderr (inherited).
            eprintln!("live_bench: a producer did not start");
            std::process::exit(2);
        }
        producers.push(Killed(child));
    }
    let first_pid = producers.first().map(|p| p.0.id());
    let ht = o.heaptrack.as_deref();
    if let Some(d) = ht {
        std::fs::create_dir_all(d).unwrap();
    }
    let serve = o
        .serve
        .then(|| start_serve(&o.bin, dir.path(), o.nvml, ht, o.advise));
    let dash = o.dash.then(|| {
        let pid = if o.view_process { first_pid } else { None };
        start_dash(&o.bin, dir.path(), pid, o.size, o.nvml, ht, o.advise)
    });
    let watchers_began = Instant::now();
    let pids: Vec<(&str, i32)> = (serve.iter().map(|s| ("serve", s.pid)))
        .chain(dash.iter().map(|d| ("dash", d.pid())))
        .collect();
    // Every watcher maps every segment, then the producers start writing.
    let mut early_notes = Vec::new();
    let wait = Instant::now();
    while !pids.iter().all(|(_, p)| mapped(*p, dir.path()) >= o.n) {
        if wait.elapsed() > Duration::from_secs(30) {
            early_notes.push("not every watcher mapped every segment within 30 s".to_string());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in producers.iter_mut() {
        let _ = p.0.stdin.as_mut().unwrap().write_all(b"go\n");
    }
    let t0 = Instant::now();
    let mut rss: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut begin: HashMap<&str, (f64, f64)> = HashMap::new();
    let mut end: HashMap<&str, (f64, f64)> = HashMap::new();
    let mut advisor_end: HashMap<&str, (f64, f64)> = HashMap::new();
    let prod_cpu = |ps: &[Killed]| -> f64 {
        ps.iter()
            .filter_map(|p| sample(p.0.id() as i32))
            .map(|s| s.0)
            .sum()
    };
    let mut w_begin = (BTreeMap::new(), 0.0, Instant::now());
    let mut busy0 = 0.0;
    let mut perf = Vec::new();
    let mut tick = 0u64;
    let total = o.warmup + o.window;
    loop {
        let el = t0.elapsed().as_secs_f64();
        for (name, pid) in &pids {
            if let Some((cpu, r, th)) = sample(*pid) {
                rss.entry(name).or_default().push(r);
                if tick == o.warmup as u64 {
                    begin.insert(name, (cpu, th));
                }
                end.insert(name, (cpu, th));
            }
            if let Some(a) = advisor_cpu(*pid) {
                advisor_end.insert(name, (a, watchers_began.elapsed().as_secs_f64()));
            }
        }
        if tick == o.warmup as u64 {
            w_begin = (
                read_status(status.path()).0,
                prod_cpu(&producers),
                Instant::now(),
            );
            busy0 = machine_busy_s();
            if let Some(d) = &o.perf {
                std::fs::create_dir_all(d).unwrap();
                for (name, pid) in &pids {
                    perf.push(Killed(perf_record(
                        *pid,
                        &d.join(format!("{name}.perf.data")),
                        o.window,
                        o.perf_freq,
                    )));
                }
            }
        }
        if el >= total {
            break;
        }
        tick += 1;
        let next = Duration::from_secs_f64(tick as f64);
        std::thread::sleep(next.saturating_sub(t0.elapsed()));
    }
    let window = w_begin.2.elapsed().as_secs_f64();
    // The producers report once a second: their counts over the window.
    let (w_end, _) = read_status(status.path());
    let prod_cpu_end = prod_cpu(&producers);
    let busy = machine_busy_s() - busy0;
    for p in perf.iter_mut() {
        let _ = p.0.wait();
    }
    drop(perf);
    let dash_bytes = dash.as_ref().map_or(0, |d| *d.bytes.lock().unwrap());
    let screen_text = dash.as_ref().map(|d| d.contents()).unwrap_or_default();
    // The overview too (every process's events/s and lost), after Esc.
    let overview = dash.as_ref().map(|d| {
        if o.view_process && o.n > 0 {
            let mut w = d.writer.lock().unwrap();
            let _ = w.write_all(b"\x1b");
            let _ = w.flush();
            drop(w);
            std::thread::sleep(Duration::from_millis(1500));
        }
        d.contents()
    });
    if let (Some(ov), Some(path)) = (&overview, &o.screen) {
        std::fs::write(path, format!("{screen_text}\n\n{ov}")).unwrap();
    }
    // Stop the producers (their last counts written), let the collector
    // drain what they wrote, then scrape serve once.
    for p in producers.iter_mut() {
        drop(p.0.stdin.take());
    }
    for p in producers.iter_mut() {
        let _ = p.0.wait();
    }
    let (w_all, notes) = read_status(status.path());
    std::thread::sleep(Duration::from_millis(600));
    let text = serve.as_ref().map(|s| scrape(&s.addr));
    let mut notes = notes;
    notes.extend(early_notes);
    if let Some(lost) = overview.as_deref().and_then(|t| lost_column(t, o.n)) {
        let bad: Vec<&String> = lost.iter().filter(|l| l.as_str() != "0").collect();
        if !bad.is_empty() {
            notes.push(format!("the dashboard's LOST column: {lost:?}"));
        }
    } else if o.dash && o.n > 0 {
        notes.push("the dashboard's overview (LOST column) could not be read".into());
    }
    if o.dash && o.view_process && o.n > 0 && !screen_text.contains("Event history") {
        notes.push(
            "the dashboard's last screen shows no event history (process view not open?)".into(),
        );
    }
    let watcher = |name: &str| -> Option<Watcher> {
        let (c0, t0) = begin.get(name)?;
        let (c1, t1) = end.get(name)?;
        Some(Watcher {
            cpu_s: c1 - c0,
            rss: rss.get(name).cloned().unwrap_or_default(),
            main_s: t1 - t0,
            advisor: advisor_end.get(name).copied(),
        })
    };
    let (events_per_s, counted_per_s, records_per_s) = rates(&w_begin.0, &w_end);
    let lost = text
        .as_deref()
        .and_then(|t| metric_sum(t, "vramscope_process_lost_events_total"));
    let advice_requests = text
        .as_deref()
        .and_then(|t| metric_sum(t, "vramscope_process_advice_requests_total"));
    let advice_following = text
        .as_deref()
        .and_then(|t| metric_sum(t, "vramscope_process_advice_following"));
    let events_total = text
        .as_deref()
        .and_then(|t| metric_sum(t, "vramscope_process_events_total"));
    if let Some(s) = serve {
        s.stop();
    }
    let ours = prod_cpu_end - w_begin.1
        + ["serve", "dash"]
            .iter()
            .filter_map(|n| Some(end.get(n)?.0 - begin.get(n)?.0))
            .sum::<f64>();
    drop(dash);
    RunResult {
        producers: o.n,
        rate: o.rate,
        window_s: window,
        warmup_s: o.warmup,
        events_per_s,
        counted_per_s,
        records_per_s,
        producers_cpu_s: prod_cpu_end - w_begin.1,
        machine_busy_pct: busy / window * 100.0,
        others_pct: (busy - ours) / window * 100.0,
        serve: watcher("serve"),
        dash: watcher("dash"),
        lost,
        events_total,
        advice_requests,
        advice_following,
        written_counted_total: w_all.values().map(|w| w.counted).sum(),
        dash_bytes_per_s: dash_bytes as f64 / t0.elapsed().as_secs_f64(),
        dash_lost: overview.as_deref().and_then(|t| lost_column(t, o.n)),
        notes,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn mib(b: f64) -> f64 {
    b / (1u64 << 20) as f64
}

/// One line per watcher: CPU %, ns per event, RSS at the end of the
/// warm-up, at 60 s (or the end, if sooner), at the end.
fn print_row(name: &str, w: &Watcher, r: &RunResult) {
    let pct = w.cpu_s / r.window_s * 100.0;
    let ns = if r.events_per_s > 0.0 {
        w.cpu_s * 1e9 / (r.events_per_s * r.window_s)
    } else {
        f64::NAN
    };
    let warm = r.warmup_s as usize;
    println!(
        "  {name:<6} cpu {pct:6.2} %  {ns:8.1} ns/event  rss warm-up {:6.1} MiB  @60s {:6.1} MiB  end {:6.1} MiB  max {:6.1} MiB",
        mib(w.rss_at(warm) as f64),
        mib(w.rss_at(60) as f64),
        mib(w.rss_at(usize::MAX) as f64),
        mib(w.rss.iter().copied().max().unwrap_or(0) as f64),
    );
    println!(
        "         main thread {:.2} %, the other threads (collector) {:.2} %",
        w.main_s / r.window_s * 100.0,
        (w.cpu_s - w.main_s) / r.window_s * 100.0
    );
    if let Some((cpu, life)) = w.advisor {
        println!(
            "         the advisor thread {:.2} % of a core over its {:.0} s ({:.2} CPU s)",
            cpu / life * 100.0,
            life,
            cpu
        );
    }
}

fn print_result(r: &RunResult) {
    println!(
        "  {} producers × {} ev/s: delivered {:.0} events/s ({:.0} counted by the model, {:.0} records/s), producers {:.1} % CPU in all",
        r.producers,
        r.rate,
        r.events_per_s,
        r.counted_per_s,
        r.records_per_s,
        r.producers_cpu_s / r.window_s * 100.0
    );
    println!(
        "  machine busy {:.0} % of one core ({} cores), of which {:.0} % neither producers nor watchers",
        r.machine_busy_pct,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        r.others_pct
    );
    if let Some(w) = &r.serve {
        print_row("serve", w, r);
    }
    if let Some(w) = &r.dash {
        print_row("dash", w, r);
        println!(
            "         dashboard output {:.1} KiB/s",
            r.dash_bytes_per_s / 1024.0
        );
    }
    if let Some(l) = r.lost {
        println!(
            "  serve at the end: lost {l}, events_total {} (the producers wrote {} such events)",
            r.events_total.unwrap_or(f64::NAN),
            r.written_counted_total
        );
    }
    if let Some(n) = r.advice_requests {
        println!(
            "  serve's advisor: {n} requests replayed under every candidate; following {} of {} processes",
            r.advice_following.unwrap_or(f64::NAN),
            r.producers
        );
    }
    if let Some(l) = &r.dash_lost {
        println!("  the dashboard's LOST column at the end: {}", l.join(" "));
    }
    for n in &r.notes {
        println!("  note: {n}");
    }
}

fn print_medians(rs: &[RunResult]) {
    println!("medians of {} runs:", rs.len());
    let m = |f: &dyn Fn(&RunResult) -> Option<f64>| median(rs.iter().filter_map(f).collect());
    println!(
        "  delivered {:.0} events/s; producers {:.1} % CPU",
        m(&|r| Some(r.events_per_s)),
        m(&|r| Some(r.producers_cpu_s / r.window_s * 100.0))
    );
    println!("  | watcher | CPU % of one core | ns / event | RSS end of warm-up | RSS @60 s | RSS end | RSS max |");
    println!("  |---|---:|---:|---:|---:|---:|---:|");
    for (name, get) in [
        (
            "serve",
            (|r: &RunResult| r.serve.clone()) as fn(&RunResult) -> Option<Watcher>,
        ),
        ("dashboard", |r: &RunResult| r.dash.clone()),
    ] {
        if rs.iter().all(|r| get(r).is_none()) {
            continue;
        }
        let pct = m(&|r| get(r).map(|w| w.cpu_s / r.window_s * 100.0));
        let ns = m(&|r| {
            get(r).map(|w| {
                if r.events_per_s > 0.0 {
                    w.cpu_s * 1e9 / (r.events_per_s * r.window_s)
                } else {
                    f64::NAN
                }
            })
        });
        let warm = rs[0].warmup_s as usize;
        let at = |s: usize| m(&|r| get(r).map(|w| mib(w.rss_at(s) as f64)));
        let max = m(&|r| get(r).map(|w| mib(w.rss.iter().copied().max().unwrap_or(0) as f64)));
        println!(
            "  | {name} | {pct:.2} | {ns:.0} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {max:.1} MiB |",
            at(warm),
            at(60),
            at(usize::MAX)
        );
    }
}

// ------------------------------------------------------------------ check

/// One producer, an in-process collector: is the replayed stream exact?
fn check(secs: f64, rate: f64, rec: Option<PathBuf>, delay: f64) {
    let dir = tempfile::Builder::new()
        .prefix("vs-live-check-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(&me);
    cmd.arg("producer")
        .arg(dir.path())
        .arg(rate.to_string())
        .arg((secs + 30.0).to_string());
    match &rec {
        Some(r) => cmd.arg("--rec").arg(r),
        None => cmd.arg("--sim"),
    };
    let mut child = Killed(
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut go = || {
        let _ = child.0.stdin.as_mut().unwrap().write_all(b"go\n");
    };
    // Attaching late (`--delay`): the ring may have wrapped (mid-run).
    if delay > 0.0 {
        go();
        std::thread::sleep(Duration::from_secs_f64(delay));
    }
    let mut cfg = vramscope_collect::Config::new(dir.path().to_path_buf());
    cfg.nvml = false;
    let live = vramscope_collect::Live::start(cfg).unwrap();
    if delay <= 0.0 {
        // Attached from the start: the segment is found within a scan.
        let t = Instant::now();
        while mapped(std::process::id() as i32, dir.path()) < 1 && t.elapsed().as_secs() < 10 {
            std::thread::sleep(Duration::from_millis(20));
        }
        go();
    }
    let opts = vramscope_core::model::ViewOptions {
        block_map: true,
        recent_events: 10,
        timeline: None,
    };
    for _ in 0..4 {
        std::thread::sleep(Duration::from_secs_f64(secs / 4.0));
        for p in &live.hub().snapshot(&opts).processes {
            for d in &p.view.devices {
                println!(
                    "  t: segments {} blocks {} orphans {} in segments {}",
                    d.figures.segments,
                    d.figures.blocks,
                    d.orphans.len(),
                    d.segments.iter().map(|s| s.blocks.len()).sum::<usize>()
                );
            }
        }
    }
    let snap = live.hub().snapshot(&opts);
    for p in &snap.processes {
        let v = &p.view;
        let f = &v.figures;
        println!(
            "watch: mid-run {} waiting for an anchor {} reflected {}",
            v.watch.mid_run, v.watch.waiting_for_anchor, v.watch.reflected_events
        );
        println!(
            "pid {}: events {} lost {} inconsistencies {} needs_resync {} snapshots installed {} last problem {:?}",
            v.key.pid,
            f.events_total,
            f.lost_events,
            f.inconsistencies,
            v.needs_resync,
            v.snapshots_installed,
            v.last_problem
        );
        println!(
            "  allocated {} reserved {} (source {:?}); steps observed {}; leak flagged {}; model memory estimate {:.1} MiB",
            f.allocated,
            f.reserved,
            v.devices.first().map(|d| d.figures.source),
            v.leak.steps_observed,
            v.leak.flagged,
            mib(v.memory_bytes as f64)
        );
        for d in &v.devices {
            println!(
                "  device {}: segments {} blocks {} synced {} stats {:?}",
                d.figures.device,
                d.figures.segments,
                d.figures.blocks,
                d.figures.synced,
                d.figures.stats.map(|s| (s.allocated, s.reserved))
            );
        }
    }
    println!("sizes: Event {} B", std::mem::size_of::<Event>());
    drop(child.0.stdin.take());
    let _ = child.0.wait();
}

// ----------------------------------------------------------------- stages

/// The collector's merge (a copy of `collect::rings::merge_by_time`, which
/// is private): each record keyed by the latest time of its ring, agent
/// rings after device rings at equal times, a stable sort.
fn merge_copy(batch: &mut Vec<(Event, vramscope_wire::event::RingPos)>) {
    let mut latest: HashMap<u32, u64> = HashMap::new();
    let mut keyed: Vec<((u64, bool), (Event, vramscope_wire::event::RingPos))> =
        std::mem::take(batch)
            .into_iter()
            .map(|(e, at)| {
                let t = latest.entry(at.ring).or_insert(0);
                *t = (*t).max(e.time_ns);
                ((*t, at.ring == 0), (e, at))
            })
            .collect();
    keyed.sort_by_key(|k| k.0);
    batch.extend(keyed.into_iter().map(|k| k.1));
}

/// The parts of the live path, in one process, on the same event stream:
/// what each costs per event without the rest around it.
fn stages(events: usize, procs: usize, rec: Option<PathBuf>) {
    use vramscope_core::model::{Model, ModelConfig, ProcessKey, ViewOptions, Watch};
    use vramscope_wire::event::RingPos;
    // The stream, as a producer writes it (100,000 events a second).
    let mut source: Box<dyn Source> = match &rec {
        Some(p) => Box::new(Looped::new(load(p))),
        None => Box::new(Simulated::new()),
    };
    let mut mem = MemSink::default();
    while mem.out.len() < events {
        source.next(&mut mem);
    }
    let stream = mem.out;
    let n = stream.len() as f64;
    let ns = |d: Duration, k: f64| d.as_secs_f64() * 1e9 / k;
    println!(
        "stages: {} events of {} in batches of 5,000 (one collector tick of one process at 100,000 events/s)",
        stream.len(),
        rec.as_ref()
            .map_or("the simulator".into(), |p| p.display().to_string())
    );
    // 1. Encode into words per ring, then decode as the reader does.
    let mut rings: [Vec<Words>; 2] = [Vec::new(), Vec::new()];
    let mut sample = 0u32;
    for (e, at) in &stream {
        if matches!(e.kind, EventKind::Stats { .. }) {
            sample += 1;
        }
        encode(e, sample, &mut rings[at.ring as usize]);
    }
    let t = Instant::now();
    let mut decoded = 0usize;
    for r in &rings {
        let mut d = vramscope_wire::ring::codec::Decoder::default();
        for w in r {
            if let Some(e) = d.decode(w) {
                decoded += 1;
                std::hint::black_box(&e);
            }
        }
    }
    println!(
        "  decode (codec::Decoder):                 {:6.1} ns/event ({decoded} events)",
        ns(t.elapsed(), n)
    );
    // 2. Batches as the collector builds them, one tick's batch at a time
    // (allocated, filled, merged, unzipped, freed, as each tick does).
    let mut push = Duration::ZERO;
    let mut merge = Duration::ZERO;
    let mut unzip = Duration::ZERO;
    let mut clone_only = Duration::ZERO;
    let mut inputs: Vec<(Vec<Event>, Vec<RingPos>)> = Vec::new();
    for round in 0..2 {
        (push, merge, unzip, clone_only) = Default::default();
        inputs.clear();
        for chunk in stream.chunks(5000) {
            let t = Instant::now();
            for x in chunk {
                std::hint::black_box(*x);
            }
            clone_only += t.elapsed();
            let t = Instant::now();
            let mut batch: Vec<(Event, RingPos)> = Vec::new();
            for x in chunk {
                batch.push(*x);
            }
            push += t.elapsed();
            let t = Instant::now();
            merge_copy(&mut batch);
            merge += t.elapsed();
            let t = Instant::now();
            let input: (Vec<Event>, Vec<RingPos>) = batch.into_iter().unzip();
            unzip += t.elapsed();
            if round == 1 {
                inputs.push(input);
            }
        }
    }
    println!(
        "  batch push (Vec<(Event, RingPos)>):      {:6.1} ns/event (an event's copy into the batch; a bare clone: {:.1} ns)",
        ns(push, n),
        ns(clone_only, n)
    );
    println!(
        "  merge by time (copy of merge_by_time):   {:6.1} ns/event",
        ns(merge, n)
    );
    println!(
        "  unzip into Input::Events:                {:6.1} ns/event",
        ns(unzip, n)
    );
    // 3. The model, one process and `procs` processes taking turns.
    let model_run = |cfg: ModelConfig, procs: usize| -> (Duration, Model) {
        let mut m = Model::new(cfg);
        let keys: Vec<ProcessKey> = (0..procs as u32)
            .map(|i| ProcessKey {
                pid: 1000 + i,
                start_time: 1,
            })
            .collect();
        for k in &keys {
            m.watch(
                *k,
                &Watch {
                    began_ns: Some(0),
                    mid_run: false,
                    ring_starts: vec![0, 0],
                    anchor_snapshot: None,
                },
            );
        }
        let t = Instant::now();
        // Every process gets the same stream, a batch at a time in turn.
        for (events, at) in &inputs {
            for k in &keys {
                m.apply_all_at(*k, events.iter(), at);
            }
        }
        (t.elapsed() / procs as u32, m)
    };
    // The configurations take turns, five rounds, the fastest of each
    // kept (the first round also pays for memory touched for the first
    // time; turns spread another load on the machine over all of them).
    let configs: [(&str, ModelConfig, usize); 4] = [
        (
            "model, 1 process (Model::apply_all_at)",
            ModelConfig::default(),
            1,
        ),
        (
            "model, PROCS processes in turn",
            ModelConfig::default(),
            procs,
        ),
        (
            "model, 1 process, no event history",
            ModelConfig {
                recent_events: 0,
                ..ModelConfig::default()
            },
            1,
        ),
        (
            "model, 1 process, no drift check",
            ModelConfig {
                check_drift: false,
                ..ModelConfig::default()
            },
            1,
        ),
    ];
    let mut best: Vec<Option<(Duration, Model)>> = (0..configs.len()).map(|_| None).collect();
    for _ in 0..5 {
        for (i, (_, cfg, k)) in configs.iter().enumerate() {
            let r = model_run(cfg.clone(), *k);
            if best[i].as_ref().is_none_or(|b| r.0 < b.0) {
                best[i] = Some(r);
            }
        }
    }
    let best: Vec<(Duration, Model)> = best.into_iter().map(|b| b.expect("five rounds")).collect();
    for ((name, _, _), (d, _)) in configs.iter().zip(&best) {
        let name = name.replace("PROCS", &procs.to_string());
        println!("  {name:<41} {:6.1} ns/event", ns(*d, n));
    }
    let (m1, mn) = (&best[0].1, &best[1].1);
    let p = m1.processes().next().expect("a process");
    println!(
        "  model after it: {} events, {} inconsistencies, memory estimate {:.1} MiB per process ({:.1} MiB for {procs})",
        p.events(),
        p.inconsistencies(),
        mib(m1.memory_bytes() as f64),
        mib(mn.memory_bytes() as f64)
    );
    // 4. The dashboard's snapshot of the model (process view, 200x60).
    for (name, opts) in [
        (
            "overview",
            ViewOptions {
                block_map: false,
                recent_events: 0,
                timeline: None,
            },
        ),
        (
            "process view",
            ViewOptions {
                block_map: true,
                recent_events: 2 * 20 + 64,
                timeline: Some(vramscope_core::model::TimelineRequest {
                    from_ns: mem.t.saturating_sub(30_000_000_000),
                    to_ns: mem.t,
                    columns: 190,
                }),
            },
        ),
    ] {
        let t = Instant::now();
        let k = 20;
        for _ in 0..k {
            std::hint::black_box(mn.view(mem.t, &opts));
        }
        println!(
            "  Model::view, {procs} processes, {name}: {:8.1} µs per snapshot",
            t.elapsed().as_secs_f64() * 1e6 / k as f64
        );
    }
}

// ---------------------------------------------------------------- inspect

fn inspect(path: &Path) {
    let rec = load(path);
    let mut kinds: BTreeMap<(usize, String), u64> = BTreeMap::new();
    for i in &rec.items {
        let k = format!("{:?}", i.ev.kind);
        let k = k.split([' ', '{', '(']).next().unwrap_or("?").to_string();
        *kinds.entry((i.ring, k)).or_insert(0) += 1;
    }
    let times: Vec<u64> = rec.items.iter().map(|i| i.ev.time_ns).collect();
    let span = times.iter().max().unwrap_or(&0) - times.iter().min().unwrap_or(&0);
    println!(
        "{}: {} events over {:.2} s, {} steps, device-ring positions {}..{}",
        path.display(),
        rec.items.len(),
        span as f64 / 1e9,
        rec.steps,
        rec.dev_positions.first().unwrap_or(&0),
        rec.dev_positions.last().unwrap_or(&0)
    );
    for ((ring, k), n) in kinds {
        println!("  ring {ring} {k}: {n}");
    }
}

// ------------------------------------------------------------------- main

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn has(args: &[String], name: &str) -> bool {
    args.iter().any(|a| a == name)
}

fn vramscope_bin() -> PathBuf {
    let me = std::env::current_exe().unwrap();
    me.parent().unwrap().parent().unwrap().join("vramscope")
}

fn rec_arg(args: &[String]) -> Option<PathBuf> {
    if has(args, "--sim") {
        return None;
    }
    Some(PathBuf::from(flag(args, "--rec").unwrap_or(DEFAULT_REC)))
}

fn machine() -> String {
    use procfs::Current;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "{} cores ({cpu}), {:.0} GiB",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        procfs::Meminfo::current()
            .map(|m| m.mem_total as f64 / (1u64 << 30) as f64)
            .unwrap_or(0.0)
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pos = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    let num = |i: usize, d: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    match pos(1) {
        "producer" => producer(ProducerArgs {
            dir: PathBuf::from(pos(2)),
            rate: num(3, 100_000.0),
            secs: num(4, 60.0),
            rec: rec_arg(&args),
            status_dir: flag(&args, "--status").map(PathBuf::from),
        }),
        "run" | "idle" => {
            let idle = pos(1) == "idle";
            let (n, rate, window) = if idle {
                (0, 0.0, num(2, 60.0))
            } else {
                (num(2, 8.0) as usize, num(3, 100_000.0), num(4, 60.0))
            };
            let size = flag(&args, "--size")
                .and_then(|s| s.split_once('x'))
                .and_then(|(c, r)| Some((c.parse().ok()?, r.parse().ok()?)))
                .unwrap_or((200, 60));
            let only = flag(&args, "--only");
            let o = RunOpts {
                n,
                rate,
                window,
                warmup: flag(&args, "--warmup")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(10.0),
                view_process: flag(&args, "--view") != Some("overview"),
                size,
                serve: only != Some("dash"),
                dash: only != Some("serve"),
                nvml: idle || has(&args, "--nvml"),
                rec: rec_arg(&args),
                bin: flag(&args, "--bin")
                    .map(|b| std::fs::canonicalize(b).expect("--bin: no such file"))
                    .unwrap_or_else(vramscope_bin),
                perf: flag(&args, "--perf").map(PathBuf::from),
                perf_freq: flag(&args, "--perf-freq")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(499),
                heaptrack: flag(&args, "--heaptrack").map(|d| {
                    std::fs::create_dir_all(d).unwrap();
                    std::fs::canonicalize(d).unwrap()
                }),
                screen: flag(&args, "--screen").map(PathBuf::from),
                advise: has(&args, "--advise"),
            };
            let runs: usize = flag(&args, "--runs")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            println!(
                "live_bench {}: {} producers × {} ev/s ({}), window {} s after {} s warm-up, view {}, {}x{}, NVML {}; machine: {}",
                pos(1),
                o.n,
                o.rate,
                o.rec
                    .as_ref()
                    .map_or("simulator".into(), |p| p.display().to_string()),
                o.window,
                o.warmup,
                if o.view_process { "process" } else { "overview" },
                o.size.0,
                o.size.1,
                if o.nvml { "polled" } else { "off" },
                machine()
            );
            let mut results = Vec::new();
            for i in 0..runs {
                println!("run {}:", i + 1);
                let r = run_once(&o);
                print_result(&r);
                results.push(r);
            }
            if runs > 1 {
                print_medians(&results);
            }
            if let Some(p) = flag(&args, "--json") {
                std::fs::write(p, serde_json::to_string_pretty(&results).unwrap()).unwrap();
            }
        }
        "stages" => stages(
            num(2, 2_000_000.0) as usize,
            num(3, 8.0) as usize,
            rec_arg(&args),
        ),
        "check" => check(
            num(2, 10.0),
            num(3, 100_000.0),
            rec_arg(&args),
            flag(&args, "--delay")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0),
        ),
        "inspect" => inspect(Path::new(if pos(2).is_empty() {
            DEFAULT_REC
        } else {
            pos(2)
        })),
        _ => eprintln!(
            "usage: live_bench run N RATE SECONDS [--runs R] [--warmup S] [--view process|overview] [--size CxR] [--only serve|dash] [--nvml] [--rec FILE | --sim] [--bin PATH] [--perf DIR [--perf-freq HZ]] [--heaptrack DIR] [--screen FILE] [--json FILE]\n       live_bench idle SECONDS [--runs R] ...\n       live_bench producer DIR RATE SECONDS [--rec FILE | --sim] [--status DIR]\n       live_bench check [SECONDS] [RATE] [--rec FILE | --sim]\n       live_bench stages [EVENTS] [PROCS] [--rec FILE | --sim]\n       live_bench inspect [FILE]"
        ),
    }
}
