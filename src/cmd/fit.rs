//! `vramscope fit REC:BATCH [REC2:BATCH2]`: the job's peak memory at other
//! batch sizes, and the largest batch that fits a limit, by replaying the
//! predicted steps through the simulator (`vramscope_core::sim::fit`).
//!
//! Two recordings of one job at two batch sizes are matched request by
//! request; where they do not match (other jobs, other steps) `fit` says
//! so and scales the first one by its roles instead. The limit is
//! `--limit`, else `--fraction` of the device, else what the recording
//! shows (the limit the job's agent stated, its GPU's memory), as
//! `advise` takes it.
use anyhow::{bail, Result};
use serde::Serialize;

use vramscope_collect::recorded::Recorded;
use vramscope_core::sim::fit::{self, FitError, Method, Prediction, Run, Shape};
use vramscope_core::sim::SimConfig;
use vramscope_text::format::bytes;

use super::advise::setting;
use super::out;
use super::sim::{recorded, say_notes, Process};
use super::value::{Batch, Bytes, Fraction, Gib, RunAt};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// One or two recordings of the job (`vramscope record`), each with the
    /// batch size it ran at: `run-b8.vsrec:8 run-b16.vsrec:16`.
    #[arg(value_name = "REC:BATCH", required = true, num_args = 1..=2)]
    runs: Vec<RunAt>,
    /// A batch size to predict (again for more); default: the recordings'
    /// batches, twice the larger, and the largest that fits and one more.
    #[arg(long = "at", value_name = "N")]
    at: Vec<Batch>,
    /// The most the allocator may reserve (bytes, or e.g. 40GiB).
    #[arg(long, value_name = "BYTES", conflicts_with = "fraction")]
    limit: Option<Bytes>,
    /// As torch.cuda.set_per_process_memory_fraction(F): the limit is F ×
    /// the device's memory.
    #[arg(long, allow_negative_numbers = true, value_name = "F")]
    fraction: Option<Fraction>,
    /// Device memory in GiB (default: the total NVML reported for the
    /// process's GPU in the recording, else 80).
    #[arg(long, allow_negative_numbers = true, value_name = "GIB")]
    capacity_gib: Option<Gib>,
    /// The allocator setting to replay under, as in PYTORCH_CUDA_ALLOC_CONF
    /// (default: what the first recording shows, else PyTorch's defaults).
    #[arg(long, value_name = "CONF")]
    conf: Option<String>,
    #[command(flatten)]
    process: Process,
    /// The answer as one JSON object.
    #[arg(long)]
    json: bool,
}

/// What `fit --json` prints.
#[derive(Debug, Serialize)]
struct Answer {
    method: Method,
    /// Why two recordings were not matched (then `method` is `roles`).
    #[serde(skip_serializing_if = "Option::is_none")]
    fallback: Option<String>,
    /// The batches the shape was made from.
    from: Vec<u64>,
    steps: usize,
    requests: usize,
    /// Allocations whose size depends on the batch.
    scaled: usize,
    /// Two runs: the requests of the larger batch and of the smaller that
    /// the matching left out.
    unmatched: (usize, usize),
    /// What the job holds whatever the batch.
    fixed_bytes: u64,
    conf: String,
    /// The most the allocator may reserve.
    limit: u64,
    capacity: u64,
    memory_fraction: Option<f64>,
    predictions: Vec<Prediction>,
    /// The largest batch with no OOM under the limit (None: not even 1).
    largest_batch: Option<u64>,
    /// The search reached the largest batch `fit` considers.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    largest_at_most: bool,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let mut recs: Vec<(Recorded, u64)> = Vec::with_capacity(args.runs.len());
    for r in &args.runs {
        let given = vramscope_collect::given::Given::open(&r.path)?;
        let rec = recorded(&given, &args.process)?;
        say_notes(&rec);
        recs.push((rec, r.batch));
    }
    let named = |i: usize| {
        format!(
            "{} (batch {})",
            args.runs[i].path.display(),
            args.runs[i].batch
        )
    };
    // Two runs give a shape with each one's requests as the template; a
    // batch is replayed with the nearer one.
    let (shapes, fallback) = match recs.as_slice() {
        [one] => (Shape::roles(as_run(one)).map(|s| vec![s]), None),
        [x, y] => match Shape::two_runs(as_run(x), as_run(y)) {
            Ok(s) => {
                let mut shapes = vec![s];
                shapes.extend(Shape::two_runs(as_run(y), as_run(x)).ok());
                (Ok(shapes), None)
            }
            Err(e @ (FitError::Mismatch(_) | FitError::SameBatch(_) | FitError::NoSteps)) => {
                let why = format!("{e}");
                vramscope_text::stderr_line(format_args!(
                    "fit: {why}; scaling {} by its roles instead",
                    named(0)
                ));
                (Shape::roles(as_run(x)).map(|s| vec![s]), Some(why))
            }
            Err(e) => (Err(e), None),
        },
        _ => bail!("fit takes one or two recordings"),
    };
    let shapes = shapes.map_err(|e| anyhow::anyhow!("fit: {}: {e}", named(0)))?;
    let shape = &shapes[0];
    let (conf, mut cfg) = setting(
        args.conf.as_deref(),
        args.fraction,
        args.capacity_gib,
        args.process.device,
        &recs[0].0,
    )?;
    if let Some(l) = args.limit {
        cfg.capacity = l.get();
        cfg.memory_fraction = None;
    }
    let limit = limit_of(&cfg);
    let fixed = shape.fixed_bytes();
    let mut tried = Vec::new();
    let largest = if fixed > limit {
        vramscope_text::stderr_line(format_args!(
            "fit: the limit {} is below what the job holds whatever the batch ({}: parameters, optimizer state and what it keeps): no batch fits",
            bytes(limit),
            bytes(fixed)
        ));
        None
    } else {
        fit::largest_batch(&shapes, &cfg, fit::MAX_BATCH, &mut tried)
    };
    let mut batches: Vec<u64> = if args.at.is_empty() {
        let top = shape.from.iter().copied().max().unwrap_or(1);
        let mut b = shape.from.clone();
        b.push(top.saturating_mul(2).min(fit::MAX_BATCH));
        b.extend(largest);
        b.extend(largest.map(|l| l + 1).filter(|&l| l <= fit::MAX_BATCH));
        b
    } else {
        args.at.iter().map(|b| b.get()).collect()
    };
    batches.sort_unstable();
    batches.dedup();
    let predictions: Vec<Prediction> = batches
        .iter()
        .map(|&b| match tried.iter().find(|p| p.batch == b) {
            Some(p) => p.clone(),
            None => fit::predict(fit::nearest(&shapes, b), b, &cfg),
        })
        .collect();
    let answer = Answer {
        method: shape.method,
        fallback,
        from: shape.from.clone(),
        steps: shape.steps,
        requests: shape.requests,
        scaled: shape.scaled,
        unmatched: shape.unmatched,
        fixed_bytes: fixed,
        conf,
        limit,
        capacity: cfg.capacity,
        memory_fraction: cfg.memory_fraction,
        predictions,
        largest_batch: largest,
        largest_at_most: largest == Some(fit::MAX_BATCH),
    };
    if args.json {
        return out::print(&format!("{}\n", serde_json::to_string(&answer)?));
    }
    out::print(&text(&answer, &args))
}

/// One recording as the fit reads it.
fn as_run((rec, batch): &(Recorded, u64)) -> Run<'_> {
    Run {
        batch: *batch,
        requests: &rec.got.requests,
        marks: &rec.got.marks,
    }
}

/// The most the allocator may reserve under `cfg`.
fn limit_of(cfg: &SimConfig) -> u64 {
    match cfg.memory_fraction {
        Some(f) => (cfg.capacity as f64 * f) as u64,
        None => cfg.capacity,
    }
}

/// The answer as a few lines and a table.
fn text(a: &Answer, args: &Args) -> String {
    let from: Vec<String> = (args.runs.iter())
        .map(|r| format!("{} (batch {})", r.path.display(), r.batch))
        .collect();
    let how = match a.method {
        Method::TwoRuns => format!(
            "{}: {} steps matched request by request ({} requests; {} allocations grow with the batch, as a + b·batch)",
            from.join(" and "),
            a.steps,
            a.requests,
            a.scaled
        ),
        Method::Roles => format!(
            "{}: {} steps, scaled by roles ({} requests; {} allocations born and freed within a step scale with the batch, the rest stay)",
            from[0], a.steps, a.requests, a.scaled
        ),
    };
    let limit = match a.memory_fraction {
        Some(f) => format!("{} ({f} of {})", bytes(a.limit), bytes(a.capacity)),
        None => bytes(a.limit),
    };
    let conf = if a.conf.is_empty() {
        "PyTorch's defaults".to_string()
    } else {
        a.conf.clone()
    };
    let mut s = format!(
        "{how}\nlimit {limit}, under {conf}; held whatever the batch: {}\n\n{:>7}  {:>14}  {:>14}  {}\n",
        bytes(a.fixed_bytes),
        "batch",
        "peak reserved",
        "peak allocated",
        "out of memory"
    );
    for p in &a.predictions {
        let oom = match &p.first_oom {
            Some(o) => format!("{} (first: {} at step {})", p.ooms, bytes(o.bytes), o.step),
            None => "no".to_string(),
        };
        s.push_str(&format!(
            "{:>7}  {:>14}  {:>14}  {oom}\n",
            p.batch,
            bytes(p.peak_reserved),
            bytes(p.peak_allocated)
        ));
    }
    s.push('\n');
    s.push_str(&match a.largest_batch {
        Some(b) if a.largest_at_most => {
            format!("largest batch that fits: at least {b} (the most fit searches)\n")
        }
        Some(b) => format!("largest batch that fits {}: {b}\n", bytes(a.limit)),
        None => format!("no batch fits {}\n", bytes(a.limit)),
    });
    s
}
