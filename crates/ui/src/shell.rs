//! The terminal shell: what every screen that takes over the terminal
//! shares (the dashboard, `open`, `replay --ui`, `fleet`), written once.
//!
//! The shell owns the terminal (set up and restored by [`super::terminal`]
//! on every way out), the thread reading keys, one channel of the
//! screen's events, the colours, and the frame loop; the [`Screen`] it runs
//! decides everything else. On each wake-up the loop hands the screen a
//! [`Wake::Tick`] and everything queued, draws a frame only when the screen
//! says something changed (inside a synchronized update, so a terminal
//! never shows half a frame), writes the screenshot the screen asked for,
//! then sleeps until the screen's deadline or the next event. A signal
//! (SIGINT, SIGTERM, SIGHUP, through [`Shell::signal`]) ends every screen
//! the same way: the screen hears of it, and the shell returns.
//!
//! With a size and no terminal ([`ShellOptions::size`]) nothing is read and
//! only the frames to be written are drawn (`--screenshot`, CI, reports).

use std::io::{self, BufWriter, Stdout};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use crossterm::event::Event;
use crossterm::terminal::{BeginSynchronizedUpdate, EndSynchronizedUpdate};
use ratatui::backend::{CrosstermBackend, TestBackend};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal, TerminalOptions, Viewport};

use super::terminal;
use super::theme::Theme;
use vramscope_wire::ring::monotonic_ns;

/// A terminal that reports 0×0 (some ptys, some CI runners) is drawn as
/// this size.
pub const FALLBACK_SIZE: (u16, u16) = (80, 24);

/// A frame to write as SVG: to `path`, or the next free numbered file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shot {
    pub path: Option<PathBuf>,
    /// Quit once written (automation).
    pub then_quit: bool,
}

/// What the shell tells a screen, besides the news of its own sources.
#[derive(Debug)]
pub enum Wake {
    /// Time passed: one on every wake-up, before the events drained
    /// (monotonic ns, the collector's clock).
    Tick { now_ns: u64 },
    /// A key, a click or a resize (a 0×0 size arrives as
    /// [`FALLBACK_SIZE`]). The first event of all is the terminal's size.
    Input(Event),
    /// SIGINT, SIGTERM or SIGHUP: the shell returns after this wake-up.
    Signal,
    /// The frame [`Pace::frame_drawn`] asked for was written (to this
    /// path), or why not.
    ScreenshotWritten(Result<PathBuf, String>),
}

/// A screen the shell runs: the state that decides, and whatever carries
/// out its effects (snapshots of the hub, queries, commands).
pub trait Screen {
    /// Everything the screen hears: the shell's [`Wake`]s and its own
    /// sources' news, through one channel ([`Shell::sender`]).
    type Event: From<Wake> + Send + 'static;
    /// One wake-up: the tick, then everything queued since, in order.
    fn wake(&mut self, events: Vec<Self::Event>);
    /// The state that decides when to wake, draw and stop.
    fn pace(&mut self) -> &mut dyn Pace;
    /// The whole frame. Renders only.
    fn draw(&self, frame: &mut Frame);
    /// Bytes for the terminal itself rather than the screen (an OSC 52
    /// copy to the clipboard), written as they are between two frames;
    /// without a terminal they are dropped.
    fn take_terminal_bytes(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

/// What the shell asks of a screen's state between wake-ups: whether it is
/// done, when to wake, whether to draw, and the screenshot a drawn frame is
/// to be written as. The dashboard's [`App`](crate::App) and the fleet's
/// state answer it themselves; a [`Screen`] hands its state over.
pub trait Pace {
    /// The screen is done.
    fn quit(&self) -> bool;
    /// When to wake up if nothing arrives (monotonic ns).
    fn deadline_ns(&self) -> u64;
    /// Draw now: something changed, and the frame gap has passed.
    fn should_draw(&self, now_ns: u64) -> bool;
    /// The next frame is to be written (without a terminal, no other frame
    /// is drawn).
    fn shot_pending(&self) -> bool;
    /// A frame was drawn at `now_ns`; the screenshot it is to be written
    /// as, if one was asked for (the answer comes back as
    /// [`Wake::ScreenshotWritten`]).
    fn frame_drawn(&mut self, now_ns: u64) -> Option<Shot>;
}

/// How the shell runs, for every screen.
#[derive(Debug, Clone)]
pub struct ShellOptions {
    /// Report mouse clicks and the wheel.
    pub mouse: bool,
    /// No terminal: draw at this size (columns, rows), only the frames to
    /// be written.
    pub size: Option<(u16, u16)>,
    /// No colours, as asked (`--no-color`, the settings file); `NO_COLOR`
    /// is applied in [`ShellOptions::theme`].
    pub monochrome: bool,
    /// No braille, box-drawing or block glyphs.
    pub ascii: bool,
    /// Where screenshots without a name of their own go (`S`).
    pub shots_dir: PathBuf,
}

impl Default for ShellOptions {
    fn default() -> Self {
        ShellOptions {
            mouse: true,
            size: None,
            monochrome: false,
            ascii: false,
            shots_dir: PathBuf::from("."),
        }
    }
}

impl ShellOptions {
    /// The theme every screen draws with: the one place colour is decided.
    pub fn theme(&self) -> Theme {
        theme(self.monochrome, self.ascii, no_color_env())
    }
}

/// `NO_COLOR` set to anything but the empty string (no-color.org).
pub(crate) fn no_color_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// The theme for `--no-color`/the settings file (`monochrome`), `--ascii`
/// and the environment's `NO_COLOR` (`no_color`).
pub(crate) fn theme(monochrome: bool, ascii: bool, no_color: bool) -> Theme {
    Theme::new(!(monochrome || no_color), ascii)
}

/// The shell, before it runs: its channel, for the screen's sources.
pub struct Shell<E> {
    tx: Sender<E>,
    rx: Receiver<E>,
    signalled: Arc<AtomicBool>,
    opts: ShellOptions,
}

impl<E: From<Wake> + Send + 'static> Shell<E> {
    pub fn new(opts: ShellOptions) -> Shell<E> {
        let (tx, rx) = mpsc::channel();
        Shell {
            tx,
            rx,
            signalled: Arc::new(AtomicBool::new(false)),
            opts,
        }
    }

    pub fn options(&self) -> &ShellOptions {
        &self.opts
    }

    /// A way into the loop for the screen's sources (answers, changes).
    pub fn sender(&self) -> Sender<E> {
        self.tx.clone()
    }

    /// What a signal handler calls, on every SIGINT, SIGTERM and SIGHUP:
    /// the screen hears [`Wake::Signal`], and the shell returns.
    pub fn signal(&self) -> impl Fn() + Send + Sync + 'static {
        let (tx, signalled) = (self.tx.clone(), self.signalled.clone());
        move || {
            signalled.store(true, Ordering::SeqCst);
            let _ = tx.send(Wake::Signal.into());
        }
    }

    /// Takes the terminal (unless headless) and runs `screen` until it
    /// quits or a signal comes; the terminal is given back on every way
    /// out, errors and panics included.
    pub(crate) fn run<S: Screen<Event = E>>(self, screen: &mut S) -> Result<()> {
        let mut out = match self.opts.size {
            Some((w, h)) => Output::Headless(Rect::new(0, 0, w, h)),
            None => Output::tty(self.opts.mouse, &self.tx)?,
        };
        let mut shots = Shots {
            dir: self.opts.shots_dir.clone(),
            n: 0,
        };
        let size = out.size()?;
        let mut events = vec![E::from(Wake::Input(Event::Resize(size.0, size.1)))];
        loop {
            events.insert(
                0,
                Wake::Tick {
                    now_ns: monotonic_ns(),
                }
                .into(),
            );
            screen.wake(std::mem::take(&mut events));
            if self.done(screen) {
                return Ok(());
            }
            out.write_raw(&screen.take_terminal_bytes())?;
            if screen.pace().should_draw(monotonic_ns()) {
                if let Some(written) = out.draw(screen, &mut shots)? {
                    screen.wake(vec![Wake::ScreenshotWritten(written).into()]);
                    if self.done(screen) {
                        return Ok(());
                    }
                }
            }
            let wait = screen.pace().deadline_ns().saturating_sub(monotonic_ns());
            match self.rx.recv_timeout(Duration::from_nanos(wait)) {
                Ok(ev) => events.push(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            events.extend(self.rx.try_iter());
        }
    }

    fn done(&self, screen: &mut impl Screen) -> bool {
        screen.pace().quit() || self.signalled.load(Ordering::SeqCst)
    }
}

/// Where frames go: the terminal (restored by its guard when dropped, after
/// the terminal itself), or nowhere but screenshots, at a fixed size.
enum Output {
    Tty {
        term: TtyTerminal,
        _guard: terminal::Guard,
    },
    Headless(Rect),
}

/// ratatui's terminal on the real one. ratatui shows a hidden cursor when
/// its terminal is dropped and reports a failure with `eprintln!`, which
/// panics when standard error is that same terminal, gone (a closed
/// window, a dropped ssh: SIGHUP). A panic there skipped everything after
/// the dashboard, the demo's segment left in `/dev/shm` among it (issue 46,
/// item 7). So the cursor is shown here first, and a terminal that cannot
/// show it (nothing to show it on) is not dropped.
struct TtyTerminal(Option<Terminal<CrosstermBackend<BufWriter<Stdout>>>>);

impl std::ops::Deref for TtyTerminal {
    type Target = Terminal<CrosstermBackend<BufWriter<Stdout>>>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl std::ops::DerefMut for TtyTerminal {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("taken only when dropped")
    }
}

impl Drop for TtyTerminal {
    fn drop(&mut self) {
        if let Some(mut term) = self.0.take() {
            if term.show_cursor().is_err() {
                std::mem::forget(term);
            }
        }
    }
}

impl Output {
    /// The terminal, set up, and the input thread reading it into `tx`.
    fn tty<E: From<Wake> + Send + 'static>(mouse: bool, tx: &Sender<E>) -> Result<Output> {
        use std::io::IsTerminal;
        if !io::stdin().is_terminal() || !io::stdout().is_terminal() {
            anyhow::bail!(
                "the dashboard needs a terminal (standard input and output are not one): without one, use `vramscope demo --headless`, `vramscope snapshot` or `vramscope serve`"
            );
        }
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
                    if input.send(Wake::Input(ev).into()).is_err() {
                        break;
                    }
                }
            })
            .context("starting the input thread")?;
        Ok(Output::Tty {
            term: TtyTerminal(Some(term)),
            _guard: guard,
        })
    }

    /// `bytes` to the terminal as they are, outside any frame (nowhere
    /// without one).
    fn write_raw(&mut self, bytes: &[u8]) -> Result<()> {
        use std::io::Write;
        if let (Output::Tty { term, .. }, false) = (self, bytes.is_empty()) {
            let out = term.backend_mut();
            out.write_all(bytes)?;
            out.flush()?;
        }
        Ok(())
    }

    /// Columns and rows.
    fn size(&mut self) -> Result<(u16, u16)> {
        Ok(match self {
            Output::Tty { term, .. } => match term.size()? {
                s if s.width > 0 && s.height > 0 => (s.width, s.height),
                _ => FALLBACK_SIZE,
            },
            Output::Headless(r) => (r.width, r.height),
        })
    }

    /// One frame of `screen`, and the screenshot it asked for of it: where
    /// it was written, or why not.
    fn draw(
        &mut self,
        screen: &mut impl Screen,
        shots: &mut Shots,
    ) -> Result<Option<Result<PathBuf, String>>> {
        Ok(match self {
            Output::Tty { term, .. } => {
                crossterm::queue!(term.backend_mut(), BeginSynchronizedUpdate)?;
                let frame = term.draw(|f| screen.draw(f))?;
                let written = (screen.pace())
                    .frame_drawn(monotonic_ns())
                    .map(|s| shots.write(frame.buffer, s));
                crossterm::execute!(term.backend_mut(), EndSynchronizedUpdate)?;
                written
            }
            Output::Headless(r) => {
                // Only frames to be written are drawn.
                let buf = screen.pace().shot_pending().then(|| {
                    let mut t = Terminal::new(TestBackend::new(r.width, r.height))
                        .expect("drawing into memory");
                    let frame = t.draw(|f| screen.draw(f)).expect("drawing into memory");
                    frame.buffer.clone()
                });
                let shot = screen.pace().frame_drawn(monotonic_ns());
                shot.zip(buf).map(|(s, b)| shots.write(&b, s))
            }
        })
    }
}

/// Where screenshots without a name go, and the last number taken.
struct Shots {
    dir: PathBuf,
    n: u32,
}

impl Shots {
    fn write(&mut self, buf: &Buffer, shot: Shot) -> Result<PathBuf, String> {
        match shot.path {
            // A file the user named on the command line.
            Some(path) => crate::svg::write_svg(buf, &path).map(|()| path),
            None => write_new_screenshot(buf, &self.dir, &mut self.n),
        }
        .map_err(|e| format!("{e:#}"))
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
                crate::svg::write_svg_into(buf, file, &path)?;
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
