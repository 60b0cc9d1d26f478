//! What the dashboard is given to run: its options ([`UiOptions`]), what
//! feeds it besides the hub ([`Driver`], [`DemoHandle`]), and the one way
//! a command reaches a process ([`send_command`]).

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use vramscope_collect::demo::{DemoControl, DemoStatus};
use vramscope_collect::trace::TraceStatus;
use vramscope_collect::Hub;
use vramscope_core::model::ProcessKey;
use vramscope_wire::ring::client::{self, Expect};
use vramscope_wire::ring::{Command, Outcome, Status};

use crate::app::{AppConfig, AppEvent, CommandDone, ScreenshotAfter};
use crate::rows;
use crate::shell::{self, ShellOptions};

/// How the dashboard runs (the CLI fills this in).
#[derive(Debug, Clone)]
pub struct UiOptions {
    /// No actions: `e`, `r` and `s` do nothing and nothing is sent to any process.
    pub readonly: bool,
    /// No braille, box-drawing or block glyphs.
    pub ascii: bool,
    /// No colours, as asked on the command line. `NO_COLOR` (set and not
    /// empty) is applied by the shell ([`shell::theme`]).
    pub monochrome: bool,
    /// Report mouse clicks and the wheel (on by default).
    pub mouse: bool,
    /// Where `S` writes screenshots (default: the current directory).
    pub screenshot_dir: Option<PathBuf>,
    /// Automation: write the frame shown `after` the start to `path` as SVG,
    /// then quit.
    pub screenshot: Option<ScreenshotAfter>,
    /// Open the process view of this pid at start (when it is visible).
    pub initial_process: Option<u32>,
    /// No terminal: draw at this size (columns, rows), only for
    /// `screenshot`.
    pub size: Option<(u16, u16)>,
    /// The overview's sort at start: a column, and largest first (None:
    /// the column's natural order).
    pub sort: Option<(rows::Col, Option<bool>)>,
    /// New data is drawn at most this often (input is answered at once).
    pub data_interval: Duration,
    /// A still ([`screenshot_now`](crate::draw::screenshot_now)): keys pressed before the picture is
    /// taken (`demo --headless --keys`).
    pub keys: String,
}

impl UiOptions {
    /// How the shell runs the dashboard.
    pub(crate) fn shell(&self) -> ShellOptions {
        ShellOptions {
            mouse: self.mouse,
            size: self.size,
            monochrome: self.monochrome,
            ascii: self.ascii,
            shots_dir: (self.screenshot_dir.clone()).unwrap_or_else(|| PathBuf::from(".")),
        }
    }
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions {
            readonly: false,
            ascii: false,
            monochrome: false,
            mouse: true,
            screenshot_dir: None,
            screenshot: None,
            initial_process: None,
            size: None,
            sort: None,
            data_interval: Duration::from_millis(250),
            keys: String::new(),
        }
    }
}

/// What App needs of `opts`, with `no_color` (the environment's
/// `NO_COLOR`) applied by the shell's [`shell::theme`], as every screen's.
pub fn app_config(opts: &UiOptions, no_color: bool) -> AppConfig {
    AppConfig {
        readonly: opts.readonly,
        theme: shell::theme(opts.monochrome, opts.ascii, no_color),
        data_interval: opts.data_interval,
        initial_process: opts.initial_process,
        screenshot: opts.screenshot.clone(),
        sort: opts.sort,
    }
}

/// What the dashboard needs from whatever feeds it, besides the hub's
/// snapshots: whether its processes may be sent commands, and the signals.
pub trait Driver: Send + Sync {
    /// Why the processes shown must be sent no command (`--readonly`, a
    /// recording played back, a snapshot file); None: a command goes to the
    /// segment the snapshot shows for its process ([`send_command`]).
    fn refusal(&self) -> Option<&str>;
    /// Calls `f` on every SIGINT, SIGTERM and SIGHUP from now on.
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>);
    /// A snapshot file's trace: where the hub's state is in it (None: the
    /// hub shows no file).
    fn trace(&self) -> Option<TraceStatus> {
        None
    }
    /// Rebuilds the hub's state at event `at` of the file's trace; returns
    /// where it now is (None: no trace to step through).
    fn seek(&self, _at: usize) -> Option<TraceStatus> {
        None
    }
}

/// The real driver: the collector running on its own runtime.
impl Driver for vramscope_collect::Live {
    fn refusal(&self) -> Option<&str> {
        vramscope_collect::Live::refusal(self)
    }
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>) {
        vramscope_collect::Live::on_signal(self, f)
    }
}

/// How long the dashboard waits for a process to answer a command.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `command` to the process `key` (shown as `pid`) through
/// `segment`, the segment the snapshot shows for it ([`client::command`],
/// refusing a segment that names another process by now), on a thread of
/// its own: the dashboard never blocks on a process. The answer comes back
/// on `tx` as [`AppEvent::CommandDone`]; a successful peak reset is applied
/// to `hub`'s model first. When `driver` refuses commands, nothing is sent
/// and its reason is the answer.
pub fn send_command(
    driver: &dyn Driver,
    hub: &Arc<Hub>,
    tx: &Sender<AppEvent>,
    key: ProcessKey,
    pid: u32,
    segment: PathBuf,
    command: Command,
) {
    let reply = move |tx: &Sender<AppEvent>, result: Result<Outcome, String>| {
        let _ = tx.send(AppEvent::CommandDone(CommandDone {
            key,
            pid,
            command,
            result,
        }));
    };
    if let Some(why) = driver.refusal() {
        return reply(tx, Err(why.to_string()));
    }
    let (hub, answers) = (hub.clone(), tx.clone());
    let expect = Expect {
        pid: key.pid,
        start_time: key.start_time,
    };
    let sent = std::thread::Builder::new()
        .name("vramscope-command".into())
        .spawn(move || {
            let out = client::command(&segment, Some(expect), command, COMMAND_TIMEOUT);
            if let (Command::ResetPeaks { .. }, Ok(o)) = (command, &out) {
                if o.status == Status::Ok {
                    hub.reset_peaks(key);
                }
            }
            reply(&answers, out.map_err(|e| e.to_string()))
        });
    if let Err(e) = sent {
        reply(tx, Err(format!("starting a thread for the command: {e}")));
    }
}

/// What the dashboard reads from and changes in a running demo.
pub trait DemoHandle: Send + Sync {
    fn status(&self) -> DemoStatus;
    fn set_speed(&self, speed: f64);
    fn toggle_pause(&self);
    /// A recording played back: go to another place in it (a demo's
    /// simulation cannot).
    fn seek(&self, _to: crate::keys::ReplaySeek) {}
}

impl DemoHandle for DemoControl {
    fn status(&self) -> DemoStatus {
        DemoControl::status(self)
    }
    fn set_speed(&self, speed: f64) {
        DemoControl::set_speed(self, speed)
    }
    fn toggle_pause(&self) {
        DemoControl::toggle_pause(self)
    }
}
