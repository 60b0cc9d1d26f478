//! `vramscope record -o FILE`: NVML readings and every process's events,
//! written to a recording (format: `crates/core/src/recording.rs`) until Ctrl-C,
//! SIGTERM, SIGHUP or `--duration`. It starts now: what the rings held
//! before is skipped (the model anchors on a snapshot it asks for), unless
//! `--backlog`.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use vramscope_collect::{signals, Collector, Hub};
use vramscope_core::input::Input;
use vramscope_core::model::device::Problem;
use vramscope_core::model::ViewOptions;
use vramscope_core::recording::Recorder;

use super::common::CollectFlags;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The recording file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    duration: Option<super::value::Seconds>,
    /// Also record what the processes' rings still hold from before the
    /// start (by default a recording starts now: the segments already
    /// there are read from their head, and each process is asked for a
    /// state snapshot to anchor on, as the dashboard does when it attaches
    /// mid-run).
    #[arg(long)]
    backlog: bool,
    #[command(flatten)]
    collect: CollectFlags,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let mut cfg = args.collect.config();
    cfg.backlog = args.backlog;
    let mut collector = Collector::new(cfg);
    let hub = collector.hub().clone();
    hub.record_to(Recorder::create(&args.output)?);
    let start = Instant::now();
    vramscope_text::stderr_line(format_args!(
        "recording to {} from {} (Ctrl-C to stop)",
        args.output.display(),
        if args.backlog {
            "the oldest record the rings hold (--backlog)"
        } else {
            "now (what the rings hold from before is left out; --backlog keeps it)"
        }
    ));
    let limit = args.duration.map(super::value::Seconds::duration);
    super::common::runtime()?.block_on(async {
        let failed = async {
            // A write that failed (a full disk) ends the recording: stop
            // at once rather than collect what nothing will keep.
            while !hub.recording_failed() {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        };
        let stop = async {
            match limit {
                Some(d) => tokio::select! {
                    _ = signals::stopped() => {}
                    _ = tokio::time::sleep(d) => {}
                    _ = failed => {}
                },
                None => tokio::select! {
                    _ = signals::stopped() => {}
                    _ = failed => {}
                },
            }
        };
        collector.run_until(stop).await;
    });
    say_unanchored(&hub);
    hub.stop_recording()
        .with_context(|| format!("writing the recording {}", args.output.display()))?;
    let snap = hub.snapshot(&ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    });
    let events: u64 = snap.processes.iter().map(|p| p.source.delivered).sum();
    vramscope_text::stderr_line(format_args!(
        "recorded {:.1} s, {} process(es), {events} events to {}",
        start.elapsed().as_secs_f64(),
        snap.processes.len(),
        args.output.display()
    ));
    Ok(())
}

/// What the recording holds of a process watched from mid-run whose state
/// never anchored (issue 44, item 4): its events, but no snapshot to apply
/// them on (the producer never answered, failed, or sent one that could
/// not be used), so a replay shows nothing of them. Said on standard error
/// and in the recording itself (a drop count, `events_without_an_anchor`,
/// which the replay shows).
fn say_unanchored(hub: &Hub) {
    let snap = hub.snapshot(&ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    });
    for p in snap
        .processes
        .iter()
        .filter(|p| p.view.watch.waiting_for_anchor)
    {
        let held = p.view.figures.events_total;
        let why = match p.view.last_problem.map(|r| r.problem) {
            Some(Problem::AnchorPastHead { .. }) => {
                "its snapshot was placed past its ring's head, and refused"
            }
            _ if p.view.snapshots_discarded > 0 => "its snapshots could not be used",
            _ => "it never answered a snapshot request with one",
        };
        vramscope_text::stderr_line(format_args!(
            "vramscope: process {} ({}): no usable anchor snapshot came ({why}): its {held} events are recorded, but a replay has no state to apply them on (record --backlog keeps what its rings hold from before)",
            p.identity.host_pid,
            p.identity.name,
        ));
        hub.apply(Input::Dropped {
            key: Some(p.key()),
            what: "events_without_an_anchor".into(),
            count: held,
        });
    }
}
