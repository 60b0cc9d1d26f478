//! `vramscope` with no subcommand: the dashboard on every instrumented
//! process of this user and every GPU process NVML reports. Also the flags
//! every dashboard shares (`demo` and `replay --ui` open one too).
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use vramscope_collect::Live;
use vramscope_ui::DemoHandle;

use super::common::CollectFlags;
use super::value::{Millis, Seconds, TermSize};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Run the live advisor on every instrumented process from the start
    /// (`A` in a process view shows it; without this flag, `A` starts it
    /// for that process from then on), within 5 % of one core.
    #[arg(long)]
    pub advise: bool,
    #[command(flatten)]
    pub collect: CollectFlags,
    #[command(flatten)]
    pub exited: ExitedFlag,
    #[command(flatten)]
    pub ui: UiFlags,
}

/// How the dashboard looks and what it may do.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UiFlags {
    /// A dashboard that sends nothing to any process: no empty-cache, peak
    /// reset, snapshot or stack capture from its keys, and no resync
    /// snapshots either.
    /// (`vramscope empty-cache` is a separate command, which sends its one
    /// request.)
    #[arg(long)]
    pub readonly: bool,
    /// ASCII only: no braille, box-drawing or block glyphs.
    #[arg(long)]
    pub ascii: bool,
    /// No colours (also when NO_COLOR is set).
    #[arg(long)]
    pub no_color: bool,
    /// Do not capture the mouse.
    #[arg(long)]
    pub no_mouse: bool,
    /// Open this process's view at start.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Write the frame shown after --screenshot-after as SVG to this file, then quit.
    #[arg(long, value_name = "FILE.svg")]
    pub screenshot: Option<PathBuf>,
    /// Draw without a terminal at this size (COLSxROWS, e.g. 120x40), for
    /// --screenshot (also used when there is no terminal; default 80x24).
    #[arg(long, value_name = "COLSxROWS", requires = "screenshot")]
    pub size: Option<TermSize>,
    /// Milliseconds before --screenshot is taken.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "3000",
        value_name = "MS"
    )]
    pub screenshot_after: Millis,
    /// Draw new data at most every this many milliseconds (keys are answered
    /// at once) [default: 250, or the settings file's]
    #[arg(long, allow_negative_numbers = true, value_name = "MS")]
    pub refresh: Option<Millis>,
}

/// How long a live dashboard lists an exited process (not a recording's
/// or a file's: what they list was decided when they were made).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ExitedFlag {
    /// Seconds an exited process stays listed (dimmed, after the live ones)
    /// before it is dropped; `X` in the overview clears them at once
    /// [default: 60, or the settings file's `keep_exited_s`]
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    pub keep_exited: Option<Seconds>,
}

impl UiFlags {
    /// Drawn without a terminal: at `--size`, or at 80x24 when a screenshot
    /// is asked for and stdout is not a terminal.
    pub(crate) fn headless_size(&self) -> Option<(u16, u16)> {
        use std::io::IsTerminal;
        match self.size {
            Some(s) => Some((s.cols, s.rows)),
            None if self.screenshot.is_some() && !std::io::stdout().is_terminal() => {
                Some(vramscope_ui::run::FALLBACK_SIZE)
            }
            None => None,
        }
    }

    /// The dashboard's options: these flags over the settings file
    /// (`super::config`) over the defaults.
    pub(crate) fn options(&self) -> anyhow::Result<vramscope_ui::UiOptions> {
        let file = super::config::load()?.dashboard;
        let refresh = match (self.refresh, file.refresh_ms) {
            (Some(r), _) => r.duration(),
            (None, Some(ms)) => std::time::Duration::from_millis(u64::from(ms)),
            (None, None) => std::time::Duration::from_millis(250),
        };
        Ok(vramscope_ui::UiOptions {
            readonly: self.readonly || file.readonly == Some(true),
            ascii: self.ascii || file.ascii == Some(true),
            monochrome: self.no_color || file.color == Some(false),
            mouse: !self.no_mouse && file.mouse != Some(false),
            initial_process: self.pid,
            size: self.headless_size(),
            sort: file.sort_col().map(|c| (c, file.descending)),
            data_interval: refresh,
            screenshot_dir: std::env::var_os("VRAMSCOPE_SCREENSHOT_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .or(file.screenshot_dir),
            screenshot: self
                .screenshot
                .clone()
                .map(|path| vramscope_ui::ScreenshotAfter {
                    path,
                    after: self.screenshot_after.duration(),
                }),
            ..vramscope_ui::UiOptions::default()
        })
    }
}

impl ExitedFlag {
    /// The collector's configuration: `collect`'s, with how long an exited
    /// process stays listed (this flag over the settings file).
    pub(crate) fn collector(&self, collect: &CollectFlags) -> Result<vramscope_collect::Config> {
        let mut cfg = collect.config();
        let file = super::config::load()?.dashboard;
        if let Some(s) = self.keep_exited {
            cfg.exited_linger = s.duration();
        } else if let Some(s) = file.keep_exited_s {
            cfg.exited_linger = std::time::Duration::from_secs(u64::from(s));
        }
        Ok(cfg)
    }
}

pub(crate) fn run(args: Args) -> Result<()> {
    let cfg = args.exited.collector(&args.collect)?;
    open(cfg, None, args.ui.options()?, args.advise)
}

/// Starts the collector and opens the dashboard on it (and on the demo's
/// controls, in `vramscope demo`).
pub(crate) fn open(
    cfg: vramscope_collect::Config,
    demo: Option<Arc<dyn DemoHandle>>,
    opts: vramscope_ui::UiOptions,
    advise: bool,
) -> Result<()> {
    let mut cfg = cfg;
    cfg.readonly = opts.readonly;
    let live = Arc::new(Live::start(cfg).context("starting the collector")?);
    let share = Some(vramscope_collect::ADVISOR_CPU_SHARE);
    if advise {
        live.hub().enable_advisor(true, true, share);
    } else if demo.is_none() {
        // A job heading for its limit: its forecast by simulation.
        live.hub().advise_forecasts(true, share);
    }
    vramscope_ui::run(live.hub().clone(), live, demo, opts)
}
