//! `vramscope replay FILE`: a recording fed back through the model at any
//! speed; the final state printed, or with `--ui` played in the dashboard.
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use vramscope::collect::replay::{play, Pace, Progress};
use vramscope::collect::{Hub, Live};
use vramscope::demo::DemoStatus;
use vramscope::model::ViewOptions;
use vramscope::recording::Replayer;

use super::dashboard::UiFlags;
use super::out;
use super::value::Speed;

#[derive(Debug, clap::Args)]
pub struct Args {
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
    #[command(flatten)]
    view: UiFlags,
}

/// What the dashboard shows of a recording played back: the file, how far
/// into it (recorded time and inputs), and its end.
struct ReplayStatus {
    file: String,
    speed: f64,
    total_inputs: u64,
    total_ns: u64,
    progress: Arc<Progress>,
}

impl ReplayStatus {
    /// Reads the recording once for its length (inputs and recorded time).
    fn new(path: &std::path::Path, speed: f64) -> Result<ReplayStatus> {
        let mut r = Replayer::open(path)?;
        let (mut n, mut first, mut last) = (0u64, None, 0u64);
        while let Some((t, _)) = r.next_input()? {
            n += 1;
            first.get_or_insert(t);
            last = t;
        }
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |f| f.to_string_lossy().into(),
        );
        Ok(ReplayStatus {
            file: vramscope::ring::layout::printable(&file),
            speed,
            total_inputs: n,
            total_ns: last.saturating_sub(first.unwrap_or(last)),
            progress: Arc::default(),
        })
    }
}

impl vramscope::ui::DemoHandle for ReplayStatus {
    fn status(&self) -> DemoStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let inputs = self.progress.inputs.load(Relaxed);
        let at = self.progress.recorded_ns.load(Relaxed);
        let span = vramscope::ui::format::duration;
        let ended = inputs >= self.total_inputs || self.progress.done.load(Relaxed);
        let caption = if ended {
            format!(
                "END of the recording: {} recorded, {} inputs (q quits)",
                span(self.total_ns),
                self.total_inputs
            )
        } else {
            format!(
                "at {} of {} recorded, input {inputs} of {}",
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
            speed: self.speed,
            paused: false,
            runs: 0,
            replay: true,
        }
    }
    fn set_speed(&self, _speed: f64) {}
    fn toggle_pause(&self) {}
}

pub fn run(args: Args) -> Result<()> {
    let reader = Replayer::open(&args.file)?;
    if args.ui {
        let speed = args.speed.map_or(1.0, Speed::factor);
        let mut opts = args.view.options()?;
        // A recording cannot be sent commands.
        opts.readonly = true;
        let status = ReplayStatus::new(&args.file, speed)?;
        let live = Arc::new(
            Live::replay(reader, speed, status.progress.clone()).context("starting the replay")?,
        );
        return vramscope::ui::run(live.hub().clone(), live, Some(Arc::new(status)), opts);
    }
    let hub = Hub::default();
    let pace = args
        .speed
        .map_or(Pace::Fast, |s| Pace::Recorded(s.factor()));
    let played = super::runtime()?.block_on(play(reader, &hub, pace))?;
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
        eprintln!(
            "replayed {} inputs from {}",
            played.inputs,
            args.file.display()
        );
        out::print(&super::snapshot::table(&snap))
    }
}
