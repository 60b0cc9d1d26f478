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
use super::{clipboard, send_command, DemoHandle, Driver};
use crate::collect::{Hub, Snapshot, ADVISOR_CPU_SHARE};

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
    /// Bytes for the terminal itself (OSC 52), written by the shell
    /// before the next frame.
    to_terminal: Vec<u8>,
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
            to_terminal: Vec::new(),
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
                Effect::Advise { key, host } => {
                    // The advisor's worker starts once, on the first `A`
                    // (nothing is replayed before anyone asks), within its
                    // share of a core; then this process joins it.
                    self.hub
                        .enable_advisor(false, host, Some(ADVISOR_CPU_SHARE));
                    if let Err(why) = self.hub.advise(key) {
                        self.app.advise_refused(key, &why);
                    }
                    refresh = true;
                }
                Effect::Copy(text) => {
                    self.to_terminal
                        .extend_from_slice(clipboard::osc52(&text).as_bytes());
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

    fn take_terminal_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.to_terminal)
    }
}

#[cfg(test)]
mod tests {
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::ui::fixtures::{app_with, Fixture};
    use crate::ui::{AppConfig, Overlay, ShellOptions};

    /// A driver whose processes may be sent commands (none are here).
    struct Local;

    impl Driver for Local {
        fn refusal(&self) -> Option<&str> {
            None
        }
        fn on_signal(&self, _f: Box<dyn Fn() + Send + Sync>) {}
    }

    fn key(c: char) -> AppEvent {
        AppEvent::Input(Event::Key(KeyEvent::new(
            KeyCode::Char(c),
            KeyModifiers::NONE,
        )))
    }

    /// `A` starts the hub's advisor and advises the process; the hub
    /// refuses one its model does not follow, and the footer says why.
    /// `y` leaves the OSC 52 sequence for the shell to write.
    #[test]
    fn the_loop_advises_through_the_hub_and_copies_through_the_terminal() {
        let fx = Fixture::new(2);
        let mut app = app_with(&fx, AppConfig::default(), 80, 24);
        app.overview.selected = Some(app.snap.processes[0].key());
        app.open();
        let shell = Shell::new(ShellOptions {
            size: Some((80, 24)),
            ..ShellOptions::default()
        });
        let hub = Arc::new(Hub::default());
        let mut d = Dashboard::new(app, hub.clone(), Arc::new(Local), None, &shell);
        assert!(d.apply(key('A')));
        assert_eq!(d.app.overlay, None);
        let said = d.app.message.clone().unwrap_or_default();
        assert!(
            said.starts_with("advisor: ") && said.contains("not followed"),
            "{said}"
        );
        assert!(d.take_terminal_bytes().is_empty());
        // With advice to copy: `y` hands the shell the OSC 52 sequence.
        let mut snap = (*d.app.snap).clone();
        snap.processes[0].advice = Some(crate::ui::advisor::tests::advice());
        d.app.set_snapshot(snap);
        assert!(!d.apply(key('A')));
        assert!(matches!(d.app.overlay, Some(Overlay::Advisor(_))));
        assert!(!d.apply(key('y')));
        assert_eq!(
            d.take_terminal_bytes(),
            clipboard::osc52("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512").into_bytes()
        );
        assert!(d.take_terminal_bytes().is_empty());
    }
}
