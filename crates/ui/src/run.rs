//! The dashboard as the shell runs it ([`super::shell`]): [`App`] decides,
//! and this carries out its [`Effect`]s: it takes a snapshot of the hub
//! when App asks (at most one per wake-up; the hub's lock is never held
//! while drawing), sends commands through the driver, and steers the demo
//! and a snapshot file's trace. The frame loop, the terminal and the
//! screenshots are the shell's.
//!
//! Snapshots are taken on a thread of their own ([`Taker`]): the loop
//! waits for one up to [`SNAPSHOT_WAIT`], and one that takes longer
//! comes later as an event on the loop's channel. Keys are read in the
//! meantime, so a long view never keeps `q` waiting (issue 44: 73 s).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ratatui::Frame;

use super::app::{App, AppEvent, Effect};
use super::shell::{Pace, Screen, Shell, Wake};
use crate::clipboard;
use crate::driver::{app_config, send_command, DemoHandle, Driver, UiOptions};
use vramscope_collect::{Hub, Snapshot, ADVISOR_CPU_SHARE};
use vramscope_core::model::{ProcessKey, ViewOptions};

/// How long the loop waits for a snapshot before it reads keys again (the
/// snapshot then comes as an event).
pub(crate) const SNAPSHOT_WAIT: Duration = Duration::from_millis(200);

/// Where a snapshot the loop waits for is handed over.
#[derive(Default)]
struct Handoff {
    /// The loop waits for the answer (else it goes to the loop's channel).
    waiting: bool,
    ready: Option<Snapshot>,
}

/// Takes the hub's snapshots on a thread of its own (module doc).
struct Taker {
    ask: Sender<(ViewOptions, Option<ProcessKey>)>,
    handoff: Arc<(Mutex<Handoff>, Condvar)>,
    /// A snapshot was asked for and has not come back.
    in_flight: bool,
    /// Another was wanted while one was in flight.
    again: bool,
    /// The hub itself, when the thread could not be started: snapshots
    /// are then taken on the loop's thread, as before there was one.
    fallback: Option<Arc<Hub>>,
}

impl Taker {
    /// The thread, answering to the loop's channel `tx` what the loop no
    /// longer waits for. It ends with the dashboard (its channel closed).
    fn start(hub: Arc<Hub>, tx: Sender<AppEvent>) -> Taker {
        let (ask, asked) = std::sync::mpsc::channel::<(ViewOptions, Option<ProcessKey>)>();
        let handoff: Arc<(Mutex<Handoff>, Condvar)> = Arc::default();
        let h = handoff.clone();
        let hub2 = hub.clone();
        let spawned = std::thread::Builder::new()
            .name("vramscope-snapshots".into())
            .spawn(move || {
                while let Ok((opts, focus)) = asked.recv() {
                    let snap = hub2.snapshot_for(&opts, focus);
                    let mut g = h.0.lock().unwrap_or_else(|p| p.into_inner());
                    if g.waiting {
                        g.ready = Some(snap);
                        h.1.notify_one();
                    } else if tx.send(AppEvent::Snapshot(Box::new(snap))).is_err() {
                        return;
                    }
                }
            });
        // (Nothing on standard error: the terminal is the dashboard's.)
        let fallback = spawned.is_err().then_some(hub);
        Taker {
            ask,
            handoff,
            in_flight: false,
            again: false,
            fallback,
        }
    }

    /// A snapshot with `opts` for `focus`, when it comes within
    /// [`SNAPSHOT_WAIT`]; else None, and it comes later as
    /// [`AppEvent::Snapshot`] (as does the one asked for before, while
    /// that is still in flight: this one is asked for after it).
    fn take(&mut self, opts: ViewOptions, focus: Option<ProcessKey>) -> Option<Snapshot> {
        if let Some(hub) = &self.fallback {
            return Some(hub.snapshot_for(&opts, focus));
        }
        if self.in_flight {
            self.again = true;
            return None;
        }
        let (lock, ready) = &*self.handoff;
        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
        g.waiting = true;
        if self.ask.send((opts, focus)).is_err() {
            g.waiting = false;
            return None;
        }
        let (mut g, _) = ready
            .wait_timeout_while(g, SNAPSHOT_WAIT, |g| g.ready.is_none())
            .unwrap_or_else(|p| p.into_inner());
        g.waiting = false;
        let snap = g.ready.take();
        self.in_flight = snap.is_none();
        snap
    }

    /// A late snapshot arrived; true when another is wanted.
    fn arrived(&mut self) -> bool {
        self.in_flight = false;
        std::mem::take(&mut self.again)
    }
}

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
    /// The hub's snapshots, off this thread.
    taker: Taker,
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
        let taker = Taker::start(hub.clone(), tx.clone());
        Dashboard {
            taker,
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
                Effect::ReplaySeek(to) => {
                    if let Some(d) = &self.demo {
                        d.seek(to);
                        self.app.set_demo_status(Some(d.status()));
                    }
                }
            }
        }
        refresh
    }

    /// The hub's picture for App's current screen (None: it comes later,
    /// as an event), and the demo's status.
    fn snapshot(&mut self) -> Option<Snapshot> {
        self.changed.store(false, Ordering::Release);
        let snap = (self.taker).take(self.app.view_options(), self.app.view_focus());
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
            if matches!(ev, AppEvent::Snapshot(_)) {
                refresh |= self.taker.arrived();
            }
            refresh |= self.apply(ev);
        }
        while refresh && !self.app.quit {
            let Some(snap) = self.snapshot() else {
                break;
            };
            refresh = self.apply(AppEvent::Snapshot(Box::new(snap)));
        }
    }

    fn pace(&mut self) -> &mut dyn Pace {
        &mut self.app
    }

    fn draw(&self, frame: &mut Frame) {
        crate::draw::draw(frame, &self.app)
    }

    fn take_terminal_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.to_terminal)
    }
}

/// Runs the dashboard on the terminal until the user quits or a signal
/// arrives. Commands and signals go through `driver`; `demo` is the running
/// demo, if any. The terminal is restored on every path out, panics
/// included.
pub fn run(
    hub: Arc<Hub>,
    driver: Arc<dyn Driver>,
    demo: Option<Arc<dyn DemoHandle>>,
    opts: UiOptions,
) -> anyhow::Result<()> {
    let mut app = App::new(app_config(&opts, crate::shell::no_color_env()));
    app.set_trace(driver.trace());
    let shell = Shell::new(opts.shell());
    let mut dashboard = Dashboard::new(app, hub, driver, demo, &shell);
    shell.run(&mut dashboard)
}

#[cfg(test)]
mod tests {
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::fixtures::{app_with, Fixture};
    use crate::{AppConfig, Overlay, ShellOptions};

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

    /// Issue 44, item 1: a view that takes seconds (the hub's lock held
    /// meanwhile) never keeps the loop from reading `q`: the snapshot
    /// asked for is waited for a moment, then comes later.
    #[test]
    fn item1_a_long_view_never_keeps_q_waiting() {
        let fx = Fixture::new(2);
        let app = app_with(&fx, AppConfig::default(), 80, 24);
        let shell = Shell::new(ShellOptions {
            size: Some((80, 24)),
            ..ShellOptions::default()
        });
        let hub = Arc::new(Hub::default());
        let mut d = Dashboard::new(app, hub.clone(), Arc::new(Local), None, &shell);
        let held = hub.hold_for(std::time::Duration::from_secs(5));
        let start = std::time::Instant::now();
        // New data: a snapshot is asked for, and not waited for long.
        d.wake(vec![AppEvent::Changed]);
        assert!(
            d.taker.in_flight,
            "the snapshot came while the hub was held"
        );
        // Another change meanwhile asks for no second one at once.
        d.wake(vec![AppEvent::Changed]);
        d.wake(vec![key('q')]);
        assert!(d.pace().quit());
        let took = start.elapsed();
        assert!(
            took < std::time::Duration::from_secs(2),
            "q heard after {took:?}"
        );
        let _ = held.join();
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
        snap.processes[0].advice = Some(crate::advisor::tests::advice());
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
