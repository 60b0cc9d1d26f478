//! `vramscope replay FILE`: a recording fed back through the model at any
//! speed; the final state printed, or with `--ui` played in the dashboard.
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use vramscope::collect::replay::{play, Pace};
use vramscope::collect::{Hub, Live};
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

pub fn run(args: Args) -> Result<()> {
    let reader = Replayer::open(&args.file)?;
    if args.ui {
        let speed = args.speed.map_or(1.0, Speed::factor);
        let mut opts = args.view.options();
        // A recording cannot be sent commands.
        opts.readonly = true;
        let live = Arc::new(Live::replay(reader, speed).context("starting the replay")?);
        return vramscope::ui::run(live.hub().clone(), live, None, opts);
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
