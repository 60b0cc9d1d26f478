//! A recording played back into a hub, at any speed: the one pacing loop
//! behind `replay` and `replay --ui`.
//!
//! Paced playback never waits longer than [`MAX_WAIT`] between two inputs:
//! a longer gap (an idle stretch, or a crafted time centuries ahead) is
//! played as `MAX_WAIT`, and later inputs move up by what was cut, so a
//! recording always plays to its end. With `Pace::Live` the cut is taken
//! out of the moved times too (an event's time is never after its input's).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use vramscope_core::input::Input;
use vramscope_core::recording::{retime, RecordingError, Replayer};
use vramscope_wire::ring::monotonic_ns;

use crate::hub::Hub;

/// How a recording is played.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// As fast as it can be read, times as recorded.
    Fast,
    /// At this many recorded seconds per second, times as recorded.
    Recorded(f64),
    /// At this many recorded seconds per second, times moved onto this
    /// machine's clock (the recording's start is now; `speed` shrinks or
    /// stretches it), so a live view reads it as it would a live process.
    Live(f64),
}

/// The longest wall-clock wait between two inputs of a paced playback.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(5);

/// A controlled playback waits for an input at most this long before it
/// looks at its control again.
const CONTROL_SLICE: Duration = Duration::from_millis(20);

/// What a playback got through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Played {
    /// Inputs applied.
    pub inputs: u64,
    /// The last input's time, as recorded (or as moved, with `Pace::Live`).
    pub last_ns: u64,
}

/// How far a playback got, read from another thread (`replay --ui` shows
/// it): inputs applied, the recorded time reached (from the first input),
/// and whether the recording ended.
#[derive(Debug, Default)]
pub struct Progress {
    pub inputs: std::sync::atomic::AtomicU64,
    pub recorded_ns: std::sync::atomic::AtomicU64,
    pub done: std::sync::atomic::AtomicBool,
}

/// What a viewer asks of a paced playback (`replay --ui`), read by the
/// pacing loop between inputs: pause, speed, and where to go.
#[derive(Debug)]
pub struct Control {
    paused: AtomicBool,
    /// Recorded seconds per second (`f64` bits).
    speed: AtomicU64,
    seek: Mutex<Option<Seek>>,
}

/// Where a playback goes next: after its first `inputs` inputs, the last
/// of them `at_ns` after the first (as recorded). Behind the playback, it
/// starts over from the first input (the hub restarted); the inputs up to
/// there are applied at once, their times as they would have been played.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seek {
    pub inputs: u64,
    pub at_ns: u64,
}

impl Control {
    pub fn new(speed: f64) -> Control {
        Control {
            paused: AtomicBool::new(false),
            speed: AtomicU64::new(speed.to_bits()),
            seek: Mutex::new(None),
        }
    }
    pub fn paused(&self) -> bool {
        self.paused.load(Relaxed)
    }
    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
    }
    pub fn speed(&self) -> f64 {
        f64::from_bits(self.speed.load(Relaxed))
    }
    /// A speed that is not a positive number is not taken.
    pub fn set_speed(&self, speed: f64) {
        if speed > 0.0 && speed.is_finite() {
            self.speed.store(speed.to_bits(), Relaxed);
        }
    }
    pub fn seek(&self, to: Seek) {
        *self.seek.lock().expect("seek lock") = Some(to);
    }
    fn take_seek(&self) -> Option<Seek> {
        self.seek.lock().expect("seek lock").take()
    }
}

/// Applies every input of `reader` to `hub`, paced by `pace`.
pub async fn play(reader: Replayer, hub: &Hub, pace: Pace) -> Result<Played, RecordingError> {
    play_with(reader, hub, pace, &Progress::default(), None).await
}

/// Where a paced playback stands: recorded offset `rec` (from the first
/// input, long gaps cut) is due at `wall` and, moved onto this machine's
/// clock (`Pace::Live`), at `clock`. Taken again after a pause, a change
/// of speed or a seek, so the playback goes on from there.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    wall: Instant,
    rec: u64,
    clock: u64,
}

impl Anchor {
    fn now(rec: u64) -> Anchor {
        Anchor {
            wall: Instant::now(),
            rec,
            clock: monotonic_ns(),
        }
    }
}

/// [`play`], telling `progress` after every input and at the end, and
/// taking pauses, speeds and seeks from `control` when given.
pub(crate) async fn play_with(
    mut reader: Replayer,
    hub: &Hub,
    pace: Pace,
    progress: &Progress,
    control: Option<&Control>,
) -> Result<Played, RecordingError> {
    let paced = |s: f64| Some(s).filter(|s| *s > 0.0 && s.is_finite());
    let mut speed = match pace {
        Pace::Fast => None,
        Pace::Recorded(s) | Pace::Live(s) => paced(s),
    };
    let mut anchor = Anchor::now(0);
    let mut first: Option<u64> = None;
    let mut played = Played::default();
    // Recorded nanoseconds cut out of gaps longer than MAX_WAIT, and the
    // latest (cut) offset from the first input.
    let mut cut: u64 = 0;
    let mut latest: u64 = 0;
    // A seek under way: applied at once up to it, moved onto the clock
    // as if played up to `clock`.
    let mut seeking: Option<(Seek, u64)> = None;
    let mut held = false;
    // The next input, read and not yet applied (its time not come, or held
    // by a pause).
    let mut next: Option<(u64, Input)> = None;
    loop {
        if let (Some(c), Some(_)) = (control, speed) {
            if let Some(to) = c.take_seek() {
                if to.inputs < played.inputs {
                    hub.restart();
                    reader = reader.again()?;
                    (first, played, cut, latest, next) = (None, Played::default(), 0, 0, None);
                }
                seeking = Some((to, monotonic_ns()));
            }
            let asked = paced(c.speed());
            if asked.is_some() && asked != speed {
                speed = asked;
                anchor = Anchor::now(latest);
            }
            if c.paused() && seeking.is_none() {
                held = true;
                tokio::time::sleep(CONTROL_SLICE).await;
                continue;
            }
            if std::mem::take(&mut held) {
                anchor = Anchor::now(latest);
            }
        }
        // The seek landed: played on from here, from now (paused, it stays).
        if seeking.is_some_and(|(to, _)| played.inputs >= to.inputs) {
            seeking = None;
            anchor = Anchor::now(latest);
            progress.inputs.store(played.inputs, Relaxed);
            hub.changed();
            continue;
        }
        if next.is_none() {
            next = reader.next_input()?;
        }
        let Some((t, _)) = next.as_ref() else {
            break;
        };
        let t = *t;
        // Played as fast as it is read: the live advisor, when it runs,
        // is waited for rather than left behind.
        if speed.is_none() {
            while hub.advisor_backlog() > super::advisor::MAX_QUEUED / 2 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let t0 = *first.get_or_insert(t);
        let raw = t.saturating_sub(t0);
        let mut since = raw.saturating_sub(cut);
        if let (Some(speed), None) = (speed, seeking) {
            let max_gap = (MAX_WAIT.as_secs_f64() * 1e9 * speed) as u64;
            let gap = since.saturating_sub(latest);
            if gap > max_gap {
                cut = cut.saturating_add(gap - max_gap);
                since = latest.saturating_add(max_gap);
            }
            let after =
                Duration::try_from_secs_f64(since.saturating_sub(anchor.rec) as f64 / 1e9 / speed)
                    .unwrap_or(Duration::MAX);
            // Every wait is at most MAX_WAIT, so this is always a time the
            // clock can say; were it not, the input is applied at once.
            if let Some(due) = anchor.wall.checked_add(after) {
                let now = Instant::now();
                if due > now {
                    // Controlled: waited in slices, so a pause or a seek
                    // is heard before the input is applied.
                    match control {
                        Some(_) => tokio::time::sleep(CONTROL_SLICE.min(due - now)).await,
                        None => tokio::time::sleep_until(due).await,
                    }
                    if control.is_some() {
                        continue;
                    }
                }
            }
        }
        let Some((_, mut input)) = next.take() else {
            break;
        };
        latest = latest.max(since);
        played.last_ns = t;
        if let (Pace::Live(_), Some(speed)) = (pace, speed) {
            let map = |x: u64| match seeking {
                // Before the seek's end: back from where it lands.
                Some((to, clock)) => {
                    let back = to.at_ns.saturating_sub(x.saturating_sub(t0));
                    clock.saturating_sub((back as f64 / speed) as u64)
                }
                None => {
                    let off = x.saturating_sub(t0).saturating_sub(cut).min(since);
                    let ahead = off.saturating_sub(anchor.rec);
                    anchor.clock.saturating_add((ahead as f64 / speed) as u64)
                }
            };
            retime(&mut input, &map);
            played.last_ns = map(t);
        }
        hub.apply(input);
        played.inputs += 1;
        if seeking.is_none() {
            progress.inputs.store(played.inputs, Relaxed);
        }
        progress.recorded_ns.store(raw, Relaxed);
    }
    progress.inputs.store(played.inputs, Relaxed);
    progress.done.store(true, Relaxed);
    // The end is news too: a dashboard takes a snapshot on a change and
    // reads the progress with it. The last input's change may have come
    // before its count was stored, and nothing changes after it: without
    // this the dashboard would never see the end (its caption, and every
    // events/s 0; issue 34, item B).
    hub.changed();
    Ok(played)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::{Arc, Mutex};

    use super::*;
    use vramscope_core::input::{EventBatch, Identity, Input, Source};
    use vramscope_core::model::{Mode, ProcessKey, ViewOptions, Watch};
    use vramscope_core::recording::Recorder;
    use vramscope_wire::event::{Event, EventKind, Place};

    /// Issue 34, item B: `replay --ui` showed events/s at END. A dashboard
    /// reads the progress when a change makes it take a snapshot; the last
    /// change must come after the end is known, or it never sees the end.
    #[test]
    fn the_last_change_of_a_playback_comes_after_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let mut rec = Recorder::create(&path).unwrap();
        for t in 1..=3 {
            rec.write(t, &Input::Problems { problems: vec![] }).unwrap();
        }
        rec.finish().unwrap();
        let hub = Hub::default();
        let progress = Arc::new(Progress::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        hub.on_change({
            let (progress, seen) = (progress.clone(), seen.clone());
            move || {
                let p = (progress.inputs.load(Relaxed), progress.done.load(Relaxed));
                seen.lock().unwrap().push(p);
            }
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let reader = Replayer::open(&path).unwrap();
        let played = rt
            .block_on(play_with(reader, &hub, Pace::Live(1000.0), &progress, None))
            .unwrap();
        assert_eq!(played.inputs, 3);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.last(), Some(&(3, true)), "{seen:?}");
    }

    const MIB: u64 = 1 << 20;

    /// One batch of `key`'s allocator events on device 0, at `t`.
    fn events(key: ProcessKey, t: u64, kinds: Vec<EventKind>) -> Input {
        let events: Vec<Event> = (kinds.into_iter())
            .map(|kind| Event { time_ns: t, kind })
            .collect();
        Input::Events(EventBatch::whole(key, events))
    }

    /// Device 0's allocated bytes now, and its peaks of allocated, active
    /// and reserved bytes (the block map's: the process sends no
    /// statistics).
    fn peaks(hub: &Hub) -> (u64, u64, u64, u64) {
        let snap = hub.snapshot(&ViewOptions::default());
        let f = &snap.processes[0].view.devices[0].figures;
        (
            f.allocated,
            f.peak_allocated,
            f.peak_active,
            f.peak_reserved,
        )
    }

    /// A hub recording into `path`, with one process (pid 7) attached.
    fn recording_one_process(path: &std::path::Path) -> (Hub, ProcessKey) {
        let live = Hub::default();
        live.record_to(Recorder::create(path).unwrap());
        let key = ProcessKey {
            pid: 7,
            start_time: 9,
        };
        live.apply(Input::Attach {
            key,
            identity: Identity::of_pid(7),
            source: Source::unattached(Mode::Exact),
            watch: Watch::default(),
        });
        (live, key)
    }

    /// Issue 45: a peak reset is an input like any other: the recording
    /// of a hub holds it, and its replay resets the peaks where the live
    /// hub did (it used to keep the peak from before the reset).
    #[test]
    fn a_recorded_peak_reset_replays_to_the_live_peaks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let (live, key) = recording_one_process(&path);
        let (place, base) = (Place::default(), 0x7f00_0000_0000);
        // 48 MiB allocated and freed, then 8 MiB kept: the peak is 48.
        live.apply(events(
            key,
            1_000,
            vec![
                EventKind::SegmentAlloc {
                    place,
                    addr: base,
                    size: 64 * MIB,
                },
                EventKind::Alloc {
                    place,
                    addr: base,
                    size: 48 * MIB,
                },
                EventKind::FreeRequested {
                    place,
                    addr: base,
                    size: 48 * MIB,
                },
                EventKind::FreeCompleted {
                    place,
                    addr: base,
                    size: 48 * MIB,
                },
                EventKind::Alloc {
                    place,
                    addr: base,
                    size: 8 * MIB,
                },
            ],
        ));
        assert_eq!(peaks(&live).1, 48 * MIB);
        live.reset_peaks(key);
        live.apply(events(
            key,
            2_000,
            vec![EventKind::Alloc {
                place,
                addr: base + 8 * MIB,
                size: 4 * MIB,
            }],
        ));
        live.stop_recording().unwrap();
        // Live: the peaks since the reset.
        let want = peaks(&live);
        assert_eq!(want, (12 * MIB, 12 * MIB, 12 * MIB, 64 * MIB));
        let replayed = Hub::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let reader = Replayer::open(&path).unwrap();
        rt.block_on(play(reader, &replayed, Pace::Fast)).unwrap();
        assert_eq!(peaks(&replayed), want);
    }

    /// Issue 46, item 1: a playback a viewer controls. Paused, nothing is
    /// applied; a seek goes there even while paused (back: from the first
    /// input again, in a restarted hub, the figures as they were there);
    /// played on, it reaches the end.
    #[test]
    fn a_controlled_playback_pauses_seeks_both_ways_and_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let (live, key) = recording_one_process(&path);
        let (place, base) = (Place::default(), 0x7f00_0000_0000);
        let mut seg = vec![EventKind::SegmentAlloc {
            place,
            addr: base,
            size: 64 * MIB,
        }];
        // Inputs 2 to 11: a MiB more each, a second apart.
        for i in 0..10u64 {
            seg.push(EventKind::Alloc {
                place,
                addr: base + i * MIB,
                size: MIB,
            });
            live.apply(events(
                key,
                (i + 1) * 1_000_000_000,
                std::mem::take(&mut seg),
            ));
        }
        live.stop_recording().unwrap();
        let allocated = |hub: &Hub| {
            let snap = hub.snapshot(&ViewOptions::default());
            assert!(snap.processes.len() <= 1, "one process, never twice");
            snap.processes.first().map(|p| p.view.figures.allocated)
        };
        let hub = Arc::new(Hub::default());
        let progress = Arc::new(Progress::default());
        let control = Arc::new(Control::new(1.0));
        control.set_paused(true);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let task = rt.spawn({
            let (hub, progress, control) = (hub.clone(), progress.clone(), control.clone());
            let reader = Replayer::open(&path).unwrap();
            async move {
                play_with(reader, &hub, Pace::Live(1.0), &progress, Some(&control))
                    .await
                    .unwrap()
            }
        });
        let settle = || std::thread::sleep(Duration::from_millis(150));
        settle();
        assert_eq!(progress.inputs.load(Relaxed), 0, "paused from the start");
        control.seek(Seek {
            inputs: 6,
            at_ns: 4_000_000_000,
        });
        settle();
        assert_eq!(progress.inputs.load(Relaxed), 6);
        assert_eq!(allocated(&hub), Some(5 * MIB));
        // Still paused after the seek.
        settle();
        assert_eq!(progress.inputs.load(Relaxed), 6);
        control.seek(Seek {
            inputs: 3,
            at_ns: 1_000_000_000,
        });
        settle();
        assert_eq!(progress.inputs.load(Relaxed), 3);
        assert_eq!(allocated(&hub), Some(2 * MIB), "as it was there");
        control.set_speed(1e6);
        control.set_paused(false);
        let played = rt.block_on(task).unwrap();
        assert_eq!(played.inputs, 11);
        assert!(progress.done.load(Relaxed));
        assert_eq!(allocated(&hub), Some(10 * MIB));
    }
}
