//! The frame loop: the dashboard's one thread. It owns the channel, the
//! terminal and the screenshot files, and decides nothing: it waits until
//! [`App::deadline_ns`], hands App a tick and everything queued, carries out
//! the [`Effect`]s, takes a snapshot when App asks (the hub's lock is never
//! held while drawing), draws when [`App::should_draw`] says so (inside a
//! synchronized update), and writes the screenshots App asks for.

use std::io::{self, BufWriter, Stdout};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use crossterm::event::Event;
use crossterm::terminal::{BeginSynchronizedUpdate, EndSynchronizedUpdate};
use ratatui::backend::CrosstermBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Terminal, TerminalOptions, Viewport};

use super::app::{App, AppEvent, Effect, Shot};
use super::{send_command, terminal, write_svg, DemoHandle, Driver};
use crate::collect::{Hub, Snapshot};
use crate::ring::monotonic_ns;

/// Where frames go: the terminal (restored by its guard when dropped, after
/// the terminal itself), or nowhere but screenshots, at a fixed size (no
/// terminal needed: `--size`, CI, reports).
enum Output {
    Tty {
        term: Terminal<CrosstermBackend<BufWriter<Stdout>>>,
        _guard: terminal::Guard,
    },
    Headless(Rect),
}

/// A terminal that reports 0×0 (some ptys, some CI runners) is drawn as
/// this size.
pub const FALLBACK_SIZE: (u16, u16) = (80, 24);

/// The running dashboard.
pub struct Dashboard {
    hub: Arc<Hub>,
    driver: Arc<dyn Driver>,
    demo: Option<Arc<dyn DemoHandle>>,
    tx: Sender<AppEvent>,
    rx: Receiver<AppEvent>,
    /// A `Changed` is queued (or held back by App), and no snapshot was
    /// taken since: the hub queues no more.
    changed: Arc<AtomicBool>,
    out: Output,
    shots_dir: PathBuf,
    shots: u32,
}

impl Dashboard {
    /// Wires the hub's changes and the driver's signals into one channel,
    /// then takes the terminal and starts the input thread; with `headless`
    /// (a size), no terminal and no input: frames are only drawn for
    /// screenshots.
    pub fn new(
        hub: Arc<Hub>,
        driver: Arc<dyn Driver>,
        demo: Option<Arc<dyn DemoHandle>>,
        mouse: bool,
        shots_dir: PathBuf,
        headless: Option<(u16, u16)>,
    ) -> Result<Dashboard> {
        let (tx, rx) = mpsc::channel();
        let changed = Arc::new(AtomicBool::new(false));
        hub.on_change({
            let (tx, changed) = (tx.clone(), changed.clone());
            move || {
                if !changed.swap(true, Ordering::AcqRel) {
                    let _ = tx.send(AppEvent::Changed);
                }
            }
        });
        driver.on_signal(Box::new({
            let tx = tx.clone();
            move || {
                let _ = tx.send(AppEvent::Signal);
            }
        }));
        let out = match headless {
            Some((w, h)) => Output::Headless(Rect::new(0, 0, w, h)),
            None => Self::tty(mouse, &tx)?,
        };
        Ok(Dashboard {
            hub,
            driver,
            demo,
            tx,
            rx,
            changed,
            out,
            shots_dir,
            shots: 0,
        })
    }

    /// The terminal, set up, and the input thread reading it.
    fn tty(mouse: bool, tx: &Sender<AppEvent>) -> Result<Output> {
        let guard = terminal::enter(mouse).context("setting up the terminal")?;
        let out = BufWriter::with_capacity(1 << 16, io::stdout());
        let backend = CrosstermBackend::new(out);
        let term = match crossterm::terminal::size() {
            Ok((w, h)) if w > 0 && h > 0 => Terminal::new(backend),
            // 0×0 (or unknown): draw at a fixed size rather than nothing.
            _ => Terminal::with_options(
                backend,
                TerminalOptions {
                    viewport: Viewport::Fixed(Rect::new(0, 0, FALLBACK_SIZE.0, FALLBACK_SIZE.1)),
                },
            ),
        }
        .context("creating the terminal")?;
        let input = tx.clone();
        std::thread::Builder::new()
            .name("vramscope-input".into())
            .spawn(move || {
                while let Ok(ev) = crossterm::event::read() {
                    let ev = match ev {
                        Event::Resize(0, _) | Event::Resize(_, 0) => {
                            Event::Resize(FALLBACK_SIZE.0, FALLBACK_SIZE.1)
                        }
                        ev => ev,
                    };
                    if input.send(AppEvent::Input(ev)).is_err() {
                        break;
                    }
                }
            })
            .context("starting the input thread")?;
        Ok(Output::Tty {
            term,
            _guard: guard,
        })
    }

    /// Runs `app` until it quits (or every sender is gone).
    pub fn run(mut self, mut app: App) -> Result<()> {
        let size = match &mut self.out {
            Output::Tty { term, .. } => match term.size()? {
                s if s.width > 0 && s.height > 0 => s,
                _ => FALLBACK_SIZE.into(),
            },
            Output::Headless(r) => r.as_size(),
        };
        let mut events = vec![AppEvent::Input(Event::Resize(size.width, size.height))];
        loop {
            let now_ns = monotonic_ns();
            let mut refresh = self.apply(&mut app, AppEvent::Tick { now_ns });
            for ev in events.drain(..) {
                refresh |= self.apply(&mut app, ev);
            }
            while refresh && !app.quit {
                let snap = self.snapshot(&mut app);
                refresh = self.apply(&mut app, AppEvent::Snapshot(Box::new(snap)));
            }
            if !app.quit && app.should_draw(monotonic_ns()) {
                self.draw(&mut app)?;
            }
            if app.quit {
                return Ok(());
            }
            let wait = app.deadline_ns().saturating_sub(monotonic_ns());
            match self.rx.recv_timeout(Duration::from_nanos(wait)) {
                Ok(ev) => events.push(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            events.extend(self.rx.try_iter());
        }
    }

    /// Hands `ev` to App and carries out its effects; true when App wants a
    /// snapshot.
    fn apply(&mut self, app: &mut App, ev: AppEvent) -> bool {
        let mut refresh = false;
        for fx in app.handle(ev) {
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
                        app.set_demo_status(Some(d.status()));
                    }
                }
                Effect::Seek(at) => {
                    if let Some(s) = self.driver.seek(at) {
                        app.set_trace(Some(s));
                        refresh = true;
                    }
                }
                Effect::DemoTogglePause => {
                    if let Some(d) = &self.demo {
                        d.toggle_pause();
                        app.set_demo_status(Some(d.status()));
                    }
                }
            }
        }
        refresh
    }

    /// The hub's picture for App's current screen, and the demo's status.
    fn snapshot(&mut self, app: &mut App) -> Snapshot {
        self.changed.store(false, Ordering::Release);
        let snap = self.hub.snapshot(&app.view_options());
        app.set_demo_status(self.demo.as_ref().map(|d| d.status()));
        snap
    }

    /// One frame, and the screenshot App asked for of it.
    fn draw(&mut self, app: &mut App) -> Result<()> {
        let (dir, n) = (&self.shots_dir, &mut self.shots);
        let mut write = |buf: &Buffer, shot: Shot| {
            match shot.path {
                // A file the user named on the command line.
                Some(path) => write_svg(buf, &path).map(|()| path),
                None => write_new_screenshot(buf, dir, n),
            }
            .map_err(|e| format!("{e:#}"))
        };
        let written = match &mut self.out {
            Output::Tty { term, .. } => {
                crossterm::queue!(term.backend_mut(), BeginSynchronizedUpdate)?;
                let frame = term.draw(|f| super::draw(f, app))?;
                let written = app
                    .frame_drawn(monotonic_ns())
                    .map(|s| write(frame.buffer, s));
                crossterm::execute!(term.backend_mut(), EndSynchronizedUpdate)?;
                written
            }
            Output::Headless(r) => {
                // Only frames to be written are drawn.
                let buf = app
                    .redraw
                    .shot
                    .is_some()
                    .then(|| super::render_buffer(app, r.width, r.height));
                let shot = app.frame_drawn(monotonic_ns());
                shot.zip(buf).map(|(s, b)| write(&b, s))
            }
        };
        if let Some(result) = written {
            self.apply(app, AppEvent::ScreenshotWritten(result));
        }
        Ok(())
    }
}

/// Writes `buf` to `dir/vramscope-NNN.svg`, the first name not taken. The
/// file is made new (`O_EXCL|O_NOFOLLOW`): in a directory other users can
/// write (`/tmp`, a shared project folder), a link planted under the next
/// name is taken as a taken name, never followed.
fn write_new_screenshot(buf: &Buffer, dir: &Path, n: &mut u32) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    // Enough names for any session; a directory full of them is an error,
    // not an endless search.
    for _ in 0..10_000 {
        *n += 1;
        let path = dir.join(format!("vramscope-{:03}.svg", *n));
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o644)
            .open(&path);
        match made {
            Ok(file) => {
                super::write_svg_into(buf, file, &path)?;
                return Ok(path);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    anyhow::bail!(
        "{}: no free screenshot name (vramscope-NNN.svg)",
        dir.display()
    )
}
