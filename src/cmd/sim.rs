//! `vramscope sim --trace FILE`: allocation requests replayed under any
//! allocator configuration — a JSON-lines trace, or a recording of a real
//! process (then compared with the statistics it reported).
//!
//! Streams: a JSON-lines trace is read, checked, simulated and printed one
//! line at a time (`vramscope_core::sim::TraceReader`, lines of at most 1 MiB),
//! so memory follows the live tensors, not the trace's length: 10 M lines
//! (64 live tensors) piped into `sim --trace /dev/stdin` peaked at 9.8 MiB
//! resident (`/usr/bin/time -v`, debug build; it was 2.7–3.7 GB before),
//! and `tests/hostile/numbers.rs` checks a million lines stay under 64 MiB.
//! A recording is read twice (`vramscope_collect::recorded`): once for its
//! census (which process: `--pid`, its host or namespace pid, else the
//! one with the most allocator events), then keeping only that process's
//! events, which are sorted by time and turned into requests in memory
//! (one process's events, not the whole file). Statistics samples that
//! carry ring positions are compared after exactly the requests they
//! reflect (`vramscope_core::sim::samples`); others by time.
use std::io::{Read as _, Write as _};
use std::path::PathBuf;

use anyhow::{Context, Result};

use vramscope_collect::given::Given;
use vramscope_collect::recorded::Recorded;
use vramscope_core::recording::MAGIC;
use vramscope_core::sim::samples::{self, Checked, Difference, PlacedSummary, SampleCheck};
use vramscope_core::sim::spread::{Spread, SpreadReplay};
use vramscope_core::sim::{self, NullSink, StepReport};
use vramscope_text::format::bytes;
use vramscope_wire::event::Stats;

use super::out;
use super::value::{Fraction, Gib};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A JSON-lines request file (one request a line; its format: "Trace
    /// format for `vramscope sim`" in docs/formats.md, linked from the
    /// README), or a recording made by `vramscope record` of a real process.
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    #[command(flatten)]
    process: Process,
    /// Allocator settings, as in PYTORCH_CUDA_ALLOC_CONF.
    #[arg(long, value_name = "CONF")]
    conf: Option<String>,
    /// Device memory in GiB (more than 0, at most 1048576). Default: with a
    /// recording, the total NVML reported for the process's GPU; else 80.
    #[arg(long, allow_negative_numbers = true, value_name = "GIB")]
    capacity_gib: Option<Gib>,
    /// As torch.cuda.set_per_process_memory_fraction(F): reserved memory is
    /// capped at F × the capacity (more than 0, at most 1).
    #[arg(long, allow_negative_numbers = true, value_name = "F")]
    fraction: Option<Fraction>,
    /// One JSON object per request.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let alloc = match &args.conf {
        Some(c) => sim::AllocConf::parse(c).with_context(|| format!("--conf {c:?}"))?,
        None => sim::AllocConf::default(),
    };
    let mut cfg = sim::SimConfig {
        alloc,
        capacity: args.capacity_gib.map_or(DEFAULT_CAPACITY, Gib::bytes),
        memory_fraction: args.fraction.map(Fraction::get),
        ..sim::SimConfig::default()
    };
    let path = &args.trace;
    let mut printer = Printer::new(args.json);
    // Opened once, its first bytes read once: a pipe (`--trace /dev/stdin`)
    // works too.
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut magic = Vec::with_capacity(MAGIC.len());
    std::io::Read::by_ref(&mut file)
        .take(MAGIC.len() as u64)
        .read_to_end(&mut magic)
        .with_context(|| format!("reading {}", path.display()))?;
    if magic != MAGIC {
        let input = std::io::Read::chain(std::io::Cursor::new(magic), file);
        let mut reader = sim::TraceReader::new(std::io::BufReader::with_capacity(1 << 16, input));
        // Segments the trace does not place go in the driver's order, with
        // other placements beside it: a figure a tie between equal free
        // blocks decides is given as a range.
        let mut replay = SpreadReplay::new(&cfg, false);
        while let Some(req) = reader
            .next_request()
            .with_context(|| format!("in {}", path.display()))?
        {
            let (r, spread) = replay.step(&req);
            printer.report(&r, None, &[], spread.as_ref())?;
        }
        printer.finish()?;
        if let Some(t) = replay.totals() {
            let range = |r: sim::spread::Range| {
                if r.is_spread() {
                    format!("{} to {}", bytes(r.lo), bytes(r.hi))
                } else {
                    bytes(r.lo)
                }
            };
            vramscope_text::stderr_line(format_args!(
                "placement: segments the trace does not place go where the driver's address space would put them; {} of {} steps were decided by a tie between equal free blocks (their figures are ranges over {} placements); peak reserved {}, reserved at the end {}",
                replay.tied,
                replay.steps,
                sim::spread::BESIDE + 1,
                range(t.reserved_peak),
                range(t.reserved_now),
            ));
        }
        return Ok(());
    }
    // A recording: read more than once, so a pipe's bytes are kept (a
    // regular file is read again from its path).
    let given = if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        drop(file);
        Given::open(path)?
    } else {
        Given::from_stream(path, magic, file)?
    };
    let rec = recorded(&given, &args.process)?;
    vramscope_text::stderr_line(format_args!(
        "{}: {} requests on device {}",
        rec.process,
        rec.got.requests.len(),
        args.process.device
    ));
    say_notes(&rec);
    if let (None, Some((b, gpu))) = (args.capacity_gib, rec.capacity) {
        vramscope_text::stderr_line(format_args!(
            "capacity: {} (GPU {gpu}'s total in the recording's NVML readings)",
            bytes(b)
        ));
        cfg.capacity = b;
    }
    let mut replay = sim::Replay::new(&cfg);
    let mut compare = Compare::default();
    // Placed samples are checked after exactly the requests they reflect
    // (0: before the first); each is shown on the row where it closed.
    let got = rec.got;
    let mut check = SampleCheck::new(got.placed);
    let mut closed = check.at(0, &replay.stats());
    for (req, stats) in got.requests.iter().zip(&got.recorded) {
        let r = replay.step(req, &mut NullSink);
        compare.add(&r, stats.as_ref());
        closed.extend(check.at(r.step + 1, &replay.stats()));
        closed.iter().for_each(|c| compare.placed.add(c));
        printer.report(&r, stats.as_ref(), &closed, None)?;
        closed.clear();
    }
    closed.iter().for_each(|c| compare.placed.add(c));
    printer.finish()?;
    compare.summary(args.conf.as_deref());
    Ok(())
}

/// Prints each step as it is simulated (buffered), and the summary last.
struct Printer {
    json: bool,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    last: Option<StepReport>,
}

impl Printer {
    fn new(json: bool) -> Self {
        Printer {
            json,
            out: out::stream(),
            last: None,
        }
    }

    fn report(
        &mut self,
        r: &StepReport,
        recorded: Option<&Stats>,
        placed: &[Checked],
        spread: Option<&Spread>,
    ) -> Result<()> {
        if self.json {
            let mut v = serde_json::to_value(r)?;
            if let Some(s) = spread {
                v["tie_range"] = serde_json::to_value(s)?;
            }
            if let Some(s) = recorded {
                v["recorded"] = serde_json::to_value(s)?;
            }
            if !placed.is_empty() {
                v["placed_samples"] = serde_json::to_value(placed)?;
            }
            writeln!(self.out, "{v}").map_err(out::wrap)?;
        } else {
            if self.last.is_none() {
                self.out
                    .write_all(sim::table_header().as_bytes())
                    .map_err(out::wrap)?;
            }
            let mut row = sim::table_row(r);
            if let Some(s) = spread {
                row.pop();
                let spread: Vec<String> = [
                    ("reserved", s.reserved),
                    ("split", s.inactive_split),
                    ("allocated", s.allocated),
                ]
                .into_iter()
                .filter(|(_, r)| r.is_spread())
                .map(|(name, r)| format!("{name} {} to {}", bytes(r.lo), bytes(r.hi)))
                .chain(
                    [
                        ("segs", s.segments),
                        ("retries", s.alloc_retries),
                        ("OOMs", s.ooms),
                    ]
                    .into_iter()
                    .filter(|(_, r)| r.is_spread())
                    .map(|(name, r)| format!("{name} {} to {}", r.lo, r.hi)),
                )
                .collect();
                row.push_str(&format!("  (tie: {})\n", spread.join(", ")));
            }
            self.out.write_all(row.as_bytes()).map_err(out::wrap)?;
        }
        self.last = Some(r.clone());
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        if !self.json {
            let text = match &self.last {
                Some(last) => sim::table_summary(last),
                None => sim::table_header(),
            };
            self.out.write_all(text.as_bytes()).map_err(out::wrap)?;
        }
        self.out.flush().map_err(out::wrap)
    }
}

/// Which process of a recording, and which of its devices (`sim`,
/// `advise`).
#[derive(Debug, clap::Args)]
pub(crate) struct Process {
    /// With a recording: the process to replay, by its host pid or the pid
    /// it sees itself as in its container (default: the one with the most
    /// allocator events).
    #[arg(long, value_name = "PID")]
    pub(super) pid: Option<u32>,
    /// With a recording: the CUDA device to replay.
    #[arg(long, default_value_t = 0)]
    pub(super) device: u16,
}

/// Device memory when neither the flag nor the recording says (an H100).
pub(super) const DEFAULT_CAPACITY: u64 = 80 << 30;

/// The process of the recording `given` that `process` names, its
/// requests recovered (`vramscope_collect::recorded`).
pub(super) fn recorded(given: &Given, process: &Process) -> Result<Recorded> {
    given
        .recorded(process.pid, process.device)
        .map_err(anyhow::Error::msg)
}

/// What the reading of a recording found worth saying, on stderr.
pub(super) fn say_notes(rec: &Recorded) {
    for note in &rec.notes {
        vramscope_text::stderr_line(format_args!("{note}"));
    }
}

/// A replay compared with what the recorded process reported, as it goes.
#[derive(Default)]
struct Compare {
    /// Samples placed by time: compared, matching, the first difference.
    total: u64,
    same: u64,
    first_diff: Option<(usize, Vec<Difference>)>,
    /// Samples placed by ring positions.
    placed: PlacedSummary,
    ooms: u64,
}

impl Compare {
    fn add(&mut self, r: &StepReport, recorded: Option<&Stats>) {
        if r.oom.is_some() {
            self.ooms += 1;
        }
        let Some(s) = recorded else { return };
        self.total += 1;
        let sim = Stats {
            allocated: r.allocated,
            reserved: r.reserved,
            segments: r.segments,
            ..Stats::default()
        };
        let diffs = samples::differences(&samples::TIME_FIGURES, &sim, s);
        if diffs.is_empty() {
            self.same += 1;
        } else if self.first_diff.is_none() {
            self.first_diff = Some((r.step, diffs));
        }
    }

    /// The comparison, on stderr.
    fn summary(&self, conf: Option<&str>) {
        let under = conf.map_or("the default configuration".to_string(), |c| {
            format!("--conf {c}")
        });
        for line in self.placed.lines(&under) {
            vramscope_text::stderr_line(format_args!("{line}"));
        }
        let placed = self.placed.compared + self.placed.ambiguous;
        if self.total > 0 || placed == 0 {
            let by_time = if placed > 0 {
                "; these samples carry no position and were placed by time"
            } else {
                ""
            };
            vramscope_text::stderr_line(format_args!(
                "under {under}: {} of {} recorded statistics samples match the replay exactly ({}){by_time}",
                self.same,
                self.total,
                samples::names(&samples::TIME_FIGURES)
            ));
        }
        if let Some((step, diffs)) = &self.first_diff {
            vramscope_text::stderr_line(format_args!(
                "first difference of a sample placed by time, at request {step}: {}",
                samples::describe_all(diffs)
            ));
        }
        vramscope_text::stderr_line(format_args!(
            "out-of-memory requests in the replay: {}",
            self.ooms
        ));
    }
}
