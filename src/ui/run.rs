//! The dashboard as the shell runs it ([`super::shell`]): [`App`] decides,
//! and this carries out its [`Effect`]s: it takes a snapshot of the hub
//! when App asks (at most one per wake-up; the hub's lock is never held
//! while drawing), sends commands through the driver, and steers the demo
//! and a snapshot file's trace. The frame loop, the terminal and the
//! screenshots are the shell's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use ratatui::Frame;

use super::app::{App, AppEvent, Effect, Shot};
use super::shell::{Screen, Shell, Wake};
use super::{send_command, DemoHandle, Driver};
use crate::collect::{Hub, Snapshot};

pub use super::shell::FALLBACK_SIZE;

/// The running dashboard.
pub(crate) struct Dashboard {
    app: App,
    hub: Arc<Hub>,
    driver: Arc<dyn Driver>,
    demo: Option<Arc<dyn DemoHandle>>,
    tx: Sender<AppEvent>,
    /// A `Changed` is queued (or held back by App), and no snapshot was
    /// taken since: the hub queues no more.
    changed: Arc<AtomicBool>,
}

impl Dashboard {
    /// Wires the hub's changes and the driver's signals into the shell's
    /// channel.
    pub(crate) fn new(
        app: App,
        hub: Arc<Hub>,
        driver: Arc<dyn Driver>,
        demo: Option<Arc<dyn DemoHandle>>,
        shell: &Shell<AppEvent>,
    ) -> Dashboard {
        let tx = shell.sender();
        let changed = Arc::new(AtomicBool::new(false));
        hub.on_change({
            let (tx, changed) = (tx.clone(), changed.clone());
            move || {
                if !changed.swap(true, Ordering::AcqRel) {
                    let _ = tx.send(AppEvent::Changed);
                }
            }
        });
        driver.on_signal(Box::new(shell.signal()));
        Dashboard {
            app,
            hub,
            driver,
            demo,
            tx,
            changed,
        }
    }

    /// Hands `ev` to App and carries out its effects; true when App wants a
    /// snapshot.
    fn apply(&mut self, ev: AppEvent) -> bool {
        let mut refresh = false;
        for fx in self.app.handle(ev) {
            match fx {
                Effect::Quit => {}
                Effect::Refresh => refresh = true,
                Effect::RunCommand {
                    key,
                    pid,
                    segment,
                    command,
                } => send_command(
                    &*self.driver,
                    &self.hub,
                    &self.tx,
                    key,
                    pid,
                    segment,
                    command,
                ),
                Effect::DemoSpeed(speed) => {
                    if let Some(d) = &self.demo {
                        d.set_speed(speed);
                        self.app.set_demo_status(Some(d.status()));
                    }
                }
                Effect::Seek(at) => {
                    if let Some(s) = self.driver.seek(at) {
                        self.app.set_trace(Some(s));
                        refresh = true;
                    }
                }
                Effect::DemoTogglePause => {
                    if let Some(d) = &self.demo {
                        d.toggle_pause();
                        self.app.set_demo_status(Some(d.status()));
                    }
                }
            }
        }
        refresh
    }

    /// The hub's picture for App's current screen, and the demo's status.
    fn snapshot(&mut self) -> Snapshot {
        self.changed.store(false, Ordering::Release);
        let snap = (self.hub).snapshot_for(&self.app.view_options(), self.app.view_focus());
        self.app
            .set_demo_status(self.demo.as_ref().map(|d| d.status()));
        snap
    }
}

impl From<Wake> for AppEvent {
    fn from(w: Wake) -> AppEvent {
        match w {
            Wake::Tick { now_ns } => AppEvent::Tick { now_ns },
            Wake::Input(ev) => AppEvent::Input(ev),
            Wake::Signal => AppEvent::Signal,
            Wake::ScreenshotWritten(r) => AppEvent::ScreenshotWritten(r),
        }
    }
}

impl Screen for Dashboard {
    type Event = AppEvent;

    /// The events, then one snapshot if any asked for it (and another if
    /// that one's answer does: opening a process).
    fn wake(&mut self, events: Vec<AppEvent>) {
        let mut refresh = false;
        for ev in events {
            refresh |= self.apply(ev);
        }
        while refresh && !self.app.quit {
            let snap = self.snapshot();
            refresh = self.apply(AppEvent::Snapshot(Box::new(snap)));
        }
    }

    fn quit(&self) -> bool {
        self.app.quit
    }

    fn deadline_ns(&self) -> u64 {
        self.app.deadline_ns()
    }

    fn should_draw(&self, now_ns: u64) -> bool {
        self.app.should_draw(now_ns)
    }

    fn shot_pending(&self) -> bool {
        self.app.redraw.shot.is_some()
    }

    fn draw(&self, frame: &mut Frame) {
        super::draw(frame, &self.app)
    }

    fn frame_drawn(&mut self, now_ns: u64) -> Option<Shot> {
        self.app.frame_drawn(now_ns)
    }
}
