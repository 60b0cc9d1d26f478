//! `vramscope replay FILE`: a recording fed back through the model at any
//! speed; the final state printed, or with `--ui` played in the dashboard.
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use vramscope_collect::demo::DemoStatus;
use vramscope_collect::given::Given;
use vramscope_collect::replay::{play, Control, Pace, Progress, Seek};
use vramscope_collect::{Hub, Live};
use vramscope_core::input::Input;
use vramscope_core::model::ViewOptions;
use vramscope_core::recording::Replayer;
use vramscope_ui::ReplaySeek;

use super::dashboard::UiFlags;
use super::out;
use super::value::{Speed, StepRange};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    file: PathBuf,
    /// Playback speed (recorded seconds per second, 0.001 to 1000000).
    /// Without it: as fast as possible, or 1 with --ui.
    #[arg(long, allow_negative_numbers = true)]
    speed: Option<Speed>,
    /// Print the state at the end as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Watch the recording in the dashboard, at --speed (default 1).
    #[arg(long)]
    ui: bool,
    /// Run the live advisor on every process while playing (its advice in
    /// the table and the JSON, and under `A` with --ui).
    #[arg(long, conflicts_with = "diff")]
    advise: bool,
    /// Step diff: what each process allocated in step K that is still
    /// alive when its step N ends, by module, phase and size (`3..8`).
    #[arg(long, value_name = "K..N", conflicts_with_all = ["ui", "speed"])]
    diff: Option<StepRange>,
    #[command(flatten)]
    view: UiFlags,
}

/// What the dashboard shows of a recording played back (the file, how far
/// into it: recorded time, step and inputs, its end) and its controls:
/// pause, speed, and a step back or on, the start or the end.
struct ReplayStatus {
    file: String,
    total_inputs: u64,
    total_ns: u64,
    /// Where each step begins: the inputs up to its boundary marker, and
    /// the boundary's time after the first input (as recorded).
    steps: Vec<Seek>,
    progress: Arc<Progress>,
    control: Arc<Control>,
}

impl ReplayStatus {
    /// Reads the recording once for its length (inputs and recorded time)
    /// and where its steps begin.
    fn new(reader: &Replayer, path: &std::path::Path, speed: f64) -> Result<ReplayStatus> {
        let mut r = reader.again()?;
        let (mut n, mut first, mut last) = (0u64, None, 0u64);
        let mut steps = Vec::new();
        while let Some((t, input)) = r.next_input()? {
            n += 1;
            let t0 = *first.get_or_insert(t);
            last = t;
            if marks_a_step(&input) {
                steps.push(Seek {
                    inputs: n,
                    at_ns: t.saturating_sub(t0),
                });
            }
        }
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into(),
        );
        Ok(ReplayStatus {
            file: vramscope_text::printable(&file),
            total_inputs: n,
            total_ns: last.saturating_sub(first.unwrap_or(last)),
            steps,
            progress: Arc::default(),
            control: Arc::new(Control::new(speed)),
        })
    }

    /// The steps begun by the `inputs` applied so far.
    fn steps_begun(&self, inputs: u64) -> usize {
        self.steps.partition_point(|s| s.inputs <= inputs)
    }
}

/// A step boundary: a `vramscope.mark()` or an optimizer step (or a 1.0
/// producer's marker, which were all steps).
fn marks_a_step(input: &Input) -> bool {
    use vramscope_wire::event::{EventKind, MarkSource};
    let Input::Events(b) = input else {
        return false;
    };
    b.events.iter().any(|e| {
        matches!(
            e.kind,
            EventKind::Marker {
                source: MarkSource::User | MarkSource::OptimizerStep { .. } | MarkSource::Unknown,
                ..
            }
        )
    })
}

impl vramscope_ui::DemoHandle for ReplayStatus {
    fn status(&self) -> DemoStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let inputs = self.progress.inputs.load(Relaxed);
        let at = self.progress.recorded_ns.load(Relaxed);
        let span = vramscope_text::format::duration;
        let ended = inputs >= self.total_inputs || self.progress.done.load(Relaxed);
        let paused = self.control.paused();
        let step = match self.steps.len() {
            0 => String::new(),
            n => format!("step {} of {n}, ", self.steps_begun(inputs)),
        };
        let caption = if ended {
            format!(
                "END of the recording: {} recorded, {}{} inputs (Home: again; q quits)",
                span(self.total_ns),
                step,
                self.total_inputs
            )
        } else {
            format!(
                "at {} of {} recorded, {step}input {inputs} of {}",
                span(at),
                span(self.total_ns),
                self.total_inputs
            )
        };
        DemoStatus {
            scenario: self.file.clone(),
            caption,
            progress: if self.total_inputs == 0 {
                1.0
            } else {
                inputs as f64 / self.total_inputs as f64
            },
            speed: self.control.speed(),
            paused,
            runs: 0,
            replay: true,
            ended,
        }
    }

    fn set_speed(&self, speed: f64) {
        self.control.set_speed(speed);
    }

    fn toggle_pause(&self) {
        self.control.set_paused(!self.control.paused());
    }

    /// A step back goes to the start of the step before the one playing;
    /// on, to the next step's start. Without steps, a twentieth of the
    /// recording back or on.
    fn seek(&self, to: ReplaySeek) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.progress.inputs.load(Relaxed);
        let start = Seek {
            inputs: 0,
            at_ns: 0,
        };
        let end = Seek {
            inputs: self.total_inputs,
            at_ns: self.total_ns,
        };
        let target = match to {
            ReplaySeek::Start => start,
            ReplaySeek::End => end,
            ReplaySeek::NextStep | ReplaySeek::PrevStep if self.steps.is_empty() => {
                let part = (self.total_inputs / 20).max(1);
                let inputs = match to {
                    ReplaySeek::NextStep => now.saturating_add(part).min(self.total_inputs),
                    _ => now.saturating_sub(part),
                };
                // The time of a place between steps is not known: where
                // it lands is taken as proportionally far in.
                let at_ns =
                    (self.total_ns as f64 * inputs as f64 / self.total_inputs.max(1) as f64) as u64;
                Seek { inputs, at_ns }
            }
            ReplaySeek::NextStep => {
                let i = self.steps_begun(now);
                self.steps.get(i).copied().unwrap_or(end)
            }
            ReplaySeek::PrevStep => {
                let i = self.steps_begun(now);
                match i.checked_sub(2) {
                    Some(j) => self.steps[j],
                    None => start,
                }
            }
        };
        self.control.seek(target);
    }
}

/// The live advisor's share of one core, as the dashboard's.
const ADVISOR_SHARE: f64 = vramscope_collect::ADVISOR_CPU_SHARE;

pub(crate) fn run(args: Args) -> Result<()> {
    let reader = Given::open(&args.file)?.replayer()?;
    if let Some(range) = args.diff {
        return diff::run(reader, range, args.json);
    }
    if args.ui {
        let speed = args.speed.map_or(1.0, Speed::factor);
        let mut opts = args.view.options()?;
        // A recording cannot be sent commands.
        opts.readonly = true;
        let status = ReplayStatus::new(&reader, &args.file, speed)?;
        let live = Arc::new(
            Live::replay(reader, status.control.clone(), status.progress.clone())
                .context("starting the replay")?,
        );
        if args.advise {
            live.hub().enable_advisor(true, false, Some(ADVISOR_SHARE));
        }
        return vramscope_ui::run(live.hub().clone(), live, Some(Arc::new(status)), opts);
    }
    let hub = Hub::default();
    let pace = args
        .speed
        .map_or(Pace::Fast, |s| Pace::Recorded(s.factor()));
    if args.advise {
        // Played as fast as it is read, the advisor is waited for; at a
        // recorded pace it keeps the share a live one has.
        let share = matches!(pace, Pace::Recorded(_)).then_some(ADVISOR_SHARE);
        hub.enable_advisor(true, false, share);
    }
    let played = super::common::runtime()?.block_on(play(reader, &hub, pace))?;
    if args.advise {
        hub.advisor_flush(std::time::Duration::from_secs(600));
    }
    // Figures as of the end of the recording, whatever the clock says now.
    let opts = ViewOptions {
        block_map: args.json,
        recent_events: 16,
        timeline: None,
    };
    let snap = hub.snapshot_at(played.last_ns, &opts);
    if args.json {
        out::line(&serde_json::to_string_pretty(&snap)?)
    } else {
        vramscope_text::stderr_line(format_args!(
            "replayed {} inputs from {}",
            played.inputs,
            args.file.display()
        ));
        out::print(&super::snapshot::table(&snap))
    }
}

/// `replay --diff K..N`.
mod diff {
    use std::collections::BTreeMap;
    use std::fmt::Write;

    use anyhow::Result;
    use serde::Serialize;

    use vramscope_collect::Hub;
    use vramscope_core::input::Input;
    use vramscope_core::model::stepdiff::{step_diff, StepDiff};
    use vramscope_core::model::{ProcessKey, ViewOptions};
    use vramscope_core::recording::Replayer;
    use vramscope_text::format::bytes;

    use super::super::out;
    use super::StepRange;

    /// One process's answer.
    #[derive(Debug, Serialize)]
    struct ProcessDiff {
        key: ProcessKey,
        /// Step N was seen and ended (or the recording ended in it).
        reached: bool,
        /// The last step seen.
        last_step: Option<u64>,
        #[serde(flatten)]
        diff: Option<StepDiff>,
    }

    /// Plays the recording as fast as it can, splitting each batch of
    /// events after its step boundaries: when a boundary moves a process
    /// off step N, its blocks are those of the end of step N (a boundary
    /// changes no block), and the diff is taken there.
    pub(super) fn run(mut reader: Replayer, range: StepRange, json: bool) -> Result<()> {
        let hub = Hub::default();
        let mut taken: BTreeMap<ProcessKey, StepDiff> = BTreeMap::new();
        let mut keys: Vec<ProcessKey> = Vec::new();
        let mut last_ns = 0;
        let take = |hub: &Hub, key: ProcessKey, now: u64| {
            let opts = ViewOptions {
                block_map: true,
                recent_events: 0,
                timeline: None,
            };
            let snap = hub.snapshot_at(now, &opts);
            let view = snap.processes.iter().find(|p| p.view.key == key)?;
            let mut d = step_diff(&view.view, range.from);
            d.at = Some(range.to);
            Some(d)
        };
        while let Some((t, input)) = reader.next_input()? {
            last_ns = t;
            let Input::Events(batch) = input else {
                hub.apply(input);
                continue;
            };
            let key = batch.key;
            if !keys.contains(&key) {
                keys.push(key);
            }
            for piece in batch.split_after_markers() {
                let before = hub.step(key);
                hub.apply(Input::Events(piece));
                if before == Some(range.to) && hub.step(key) != before && !taken.contains_key(&key)
                {
                    if let Some(d) = take(&hub, key, t) {
                        taken.insert(key, d);
                    }
                }
            }
        }
        let mut all = Vec::new();
        for key in keys {
            let last_step = hub.step(key);
            let diff = match taken.remove(&key) {
                Some(d) => Some(d),
                // The recording ended in step N.
                None if last_step == Some(range.to) => take(&hub, key, last_ns),
                None => None,
            };
            all.push(ProcessDiff {
                key,
                reached: diff.is_some(),
                last_step,
                diff,
            });
        }
        // No process reached the step: nothing to show, one line, exit 1.
        if !all.is_empty() && all.iter().all(|p| !p.reached) {
            let ends: Vec<String> = (all.iter())
                .map(|p| {
                    let last = p.last_step.map_or("none".into(), |s| s.to_string());
                    format!("pid {}: last step {last}", p.key.pid)
                })
                .collect();
            anyhow::bail!(
                "--diff {}..{}: step {} not reached ({})",
                range.from,
                range.to,
                range.to,
                ends.join("; ")
            );
        }
        if json {
            return out::line(&serde_json::to_string_pretty(&all)?);
        }
        out::print(&table(&all, range))
    }

    fn table(all: &[ProcessDiff], range: StepRange) -> String {
        let mut o = String::new();
        if all.is_empty() {
            let _ = writeln!(o, "no process in the recording");
        }
        for p in all {
            let Some(d) = &p.diff else {
                let last = p.last_step.map_or("none".to_string(), |s| s.to_string());
                let _ = writeln!(
                    o,
                    "pid {}: step {} not reached (last step: {last})",
                    p.key.pid, range.to
                );
                continue;
            };
            let _ = writeln!(
                o,
                "pid {}: born in step {} and alive at the end of step {}: {} in {} blocks",
                p.key.pid,
                range.from,
                range.to,
                bytes(d.bytes),
                d.blocks
            );
            if d.rows.is_empty() {
                continue;
            }
            let width = (d.rows.iter())
                .map(|r| r.module.chars().count())
                .max()
                .unwrap_or(0)
                .max(12);
            let _ = writeln!(
                o,
                "  {:<width$}  {:<9}  {:<11}  {:>10}  {:>6}  {:>10}",
                "MODULE", "PHASE", "ROLE", "ASKED", "BLOCKS", "HELD"
            );
            for r in &d.rows {
                let module = if r.module.is_empty() {
                    "(no module)"
                } else {
                    &r.module
                };
                let _ = writeln!(
                    o,
                    "  {module:<width$}  {:<9}  {:<11}  {:>10}  {:>6}  {:>10}",
                    r.phase.name(),
                    r.role.label(),
                    bytes(r.size),
                    r.blocks,
                    bytes(r.bytes)
                );
                if !r.stack.is_empty() {
                    let _ = writeln!(o, "    at {}", r.stack.join(" <- "));
                }
            }
        }
        o
    }
}
