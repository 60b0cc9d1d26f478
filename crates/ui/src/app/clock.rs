//! Time and frames: the start, the slow tick and the freshness label, the
//! data-rate gate, the `--pid` wait, screenshots, and when to wake up and
//! draw ([`App::deadline_ns`], [`App::should_draw`], [`App::frame_drawn`]).

use std::path::PathBuf;

use super::{
    App, Effect, Overlay, Screen, Shot, IDLE_AFTER_NS, IDLE_TICK_NS, MIN_FRAME_NS, PID_WAIT_NS,
    TICK_NS,
};
use crate::shell::Pace;
use vramscope_collect::Snapshot;
use vramscope_text::format;

impl App {
    /// How fresh the data is (the header's right end); a snapshot file's
    /// is the file's.
    pub fn age_label(&self) -> String {
        if self.trace.is_some() {
            return "file".into();
        }
        if self.clock.changed_ns == 0 {
            return "waiting for data".into();
        }
        let age = self.clock.now_ns.saturating_sub(self.clock.changed_ns);
        const S: u64 = 1_000_000_000;
        if age < 2 * S {
            "live".into()
        } else if age < 60 * S {
            format!("updated {}s ago", age / S)
        } else {
            // Minutes only: the idle tick is slow.
            format!("updated {} ago", format::span(age / (60 * S) * 60 * S))
        }
    }

    pub(super) fn data_interval_ns(&self) -> u64 {
        self.config.data_interval.as_nanos() as u64
    }

    /// The data interval has passed since data was last taken.
    pub(super) fn data_due(&self) -> bool {
        self.clock
            .data_ns
            .is_none_or(|t| self.clock.now_ns >= t + self.data_interval_ns())
    }

    /// New hub data is taken at most every data interval: a busy job
    /// changes the model every 50 ms, and redrawing that often costs CPU
    /// and ssh bandwidth for nothing a person can read.
    pub(super) fn changed(&mut self) -> Vec<Effect> {
        self.clock.changed_ns = self.clock.now_ns;
        if self.paused {
            return vec![];
        }
        if self.data_due() {
            vec![Effect::Refresh]
        } else {
            self.clock.data_pending = true;
            vec![]
        }
    }

    /// Time passed: start, the slow tick (a redraw only when the freshness
    /// label moved), data held back by the gate, the automatic screenshot.
    pub(super) fn tick(&mut self, now: u64) -> Vec<Effect> {
        self.clock.now_ns = now;
        let Some(started) = self.clock.started_ns else {
            self.clock.started_ns = Some(now);
            self.clock.next_tick_ns = now + TICK_NS;
            return vec![Effect::Refresh];
        };
        let mut fx = Vec::new();
        if now >= self.clock.next_tick_ns {
            let idle = now.saturating_sub(self.clock.changed_ns) > IDLE_AFTER_NS;
            self.clock.next_tick_ns = now + if idle { IDLE_TICK_NS } else { TICK_NS };
            if self.age_label() != self.redraw.label {
                self.dirty = true;
            }
            // The advisor publishes its advice on its own thread without
            // telling the hub's listeners: a quiet job's (a replay at its
            // end) would never show. While its overlay is up, look again.
            if matches!(self.overlay, Some(Overlay::Advisor(_) | Overlay::Fit)) {
                fx.push(Effect::Refresh);
            }
        }
        if self.message.is_some() && now >= self.message_until_ns {
            self.message = None;
            self.dirty = true;
        }
        if self.startup.wanted_pid.is_some() {
            // The wait ends on time even when no data arrives at all.
            fx.extend(self.open_wanted());
        }
        if self.clock.data_pending && self.data_due() {
            self.clock.data_pending = false;
            fx.push(Effect::Refresh);
        }
        if let Some(s) = &self.startup.screenshot {
            if now >= started + s.after.as_nanos() as u64 {
                self.redraw.shot = Some(Shot {
                    path: Some(s.path.clone()),
                    then_quit: true,
                });
                self.startup.screenshot = None;
                self.dirty = true;
            }
        }
        fx
    }

    /// The snapshot asked for arrived; `--pid` opens its view once it shows.
    pub(super) fn snapshot_taken(&mut self, snap: Snapshot) -> Vec<Effect> {
        self.clock.data_ns = Some(self.clock.now_ns);
        self.clock.data_pending = false;
        self.set_snapshot(snap);
        if self.clock.changed_ns == 0 {
            self.clock.changed_ns = self.clock.now_ns;
        }
        self.open_wanted()
    }

    pub(super) fn open_wanted(&mut self) -> Vec<Effect> {
        let Some(pid) = self.startup.wanted_pid else {
            return vec![];
        };
        if self.screen != Screen::Overview {
            return vec![];
        }
        if self.open_pid(pid) {
            self.startup.wanted_pid = None;
            self.message = None;
            return vec![Effect::Refresh];
        }
        let waited = self
            .clock
            .now_ns
            .saturating_sub(self.clock.started_ns.unwrap_or(self.clock.now_ns));
        if waited > PID_WAIT_NS {
            self.startup.wanted_pid = None;
            self.say(format!("pid {pid} is not an instrumented or GPU process"));
        } else {
            self.say(format!("waiting for pid {pid} to appear..."));
        }
        vec![]
    }

    pub(super) fn screenshot_written(&mut self, result: Result<PathBuf, String>) -> Vec<Effect> {
        let then_quit = self.redraw.writing.take().is_some_and(|s| s.then_quit);
        self.say(crate::svg::written_said(&result));
        // The message shows in the next frame (unless quitting).
        self.dirty = true;
        if then_quit {
            self.quit = true;
            return vec![Effect::Quit];
        }
        vec![]
    }
}

impl Pace for App {
    fn quit(&self) -> bool {
        self.quit
    }

    fn shot_pending(&self) -> bool {
        self.redraw.shot.is_some()
    }

    /// When the loop must wake up even if nothing arrives (collector ns):
    /// the slow tick, the frame gap, held-back data, the automatic
    /// screenshot. Before the first tick: at once.
    fn deadline_ns(&self) -> u64 {
        let Some(started) = self.clock.started_ns else {
            return 0;
        };
        let mut d = self.clock.next_tick_ns;
        if self.dirty {
            d = d.min(self.redraw.last_ns.map_or(0, |t| t + MIN_FRAME_NS));
        }
        if self.clock.data_pending {
            if let Some(t) = self.clock.data_ns {
                d = d.min(t + self.data_interval_ns());
            }
        }
        if let Some(s) = &self.startup.screenshot {
            d = d.min(started + s.after.as_nanos() as u64);
        }
        if self.message.is_some() {
            d = d.min(self.message_until_ns);
        }
        d
    }

    /// Draw now: something changed, and the last frame is at least
    /// [`MIN_FRAME_NS`] old.
    fn should_draw(&self, now_ns: u64) -> bool {
        self.dirty
            && self
                .redraw
                .last_ns
                .is_none_or(|t| now_ns >= t + MIN_FRAME_NS)
    }

    /// The loop drew a frame at `now_ns`. Returns the screenshot this frame
    /// is to be written as, if one was asked for; the loop answers with
    /// [`AppEvent::ScreenshotWritten`](super::AppEvent::ScreenshotWritten).
    fn frame_drawn(&mut self, now_ns: u64) -> Option<Shot> {
        self.dirty = false;
        self.redraw.last_ns = Some(now_ns);
        self.redraw.label = self.age_label();
        let shot = self.redraw.shot.take();
        self.redraw.writing = shot.clone();
        shot
    }
}
