//! Command-line interface: one subcommand per job; each hands off to the library.
use std::path::PathBuf;
use std::sync::Arc; // STOPGAP (ui branch)
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use vramscope::collect::{self, Config};
use vramscope::model::ViewOptions;
use vramscope::ring::discover;
use vramscope::sim;

#[derive(Debug, Parser)]
#[command(
    name = "vramscope",
    version,
    about = "GPU memory inside PyTorch processes, live",
    long_about = "GPU memory inside PyTorch processes, live.\n\n\
                  Without a subcommand, opens the dashboard on every process of this user \
                  (instrumented with `vramscope run`) and every GPU process NVML reports."
)]
pub struct Cli {
    /// Directory of the shared-memory segments [env: VRAMSCOPE_SHM_DIR; default: /dev/shm]
    #[arg(long, global = true, value_name = "DIR")]
    pub shm_dir: Option<PathBuf>,
    /// Do not read NVML.
    #[arg(long, global = true)]
    pub no_nvml: bool,
    #[command(flatten)]
    pub ui: UiFlags,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// How the dashboard looks and what it may do.
#[derive(Debug, clap::Args)]
pub struct UiFlags {
    /// No actions: empty-cache, peak reset and snapshot requests are disabled.
    #[arg(long, global = true)]
    pub readonly: bool,
    /// ASCII only: no braille, box-drawing or block glyphs.
    #[arg(long, global = true)]
    pub ascii: bool,
    /// No colours (also when NO_COLOR is set).
    #[arg(long, global = true)]
    pub no_color: bool,
    /// Do not capture the mouse.
    #[arg(long, global = true)]
    pub no_mouse: bool,
    /// Open this process's view at start.
    #[arg(long, global = true, value_name = "PID")]
    pub pid: Option<u32>,
    /// Write the frame shown after --screenshot-after as SVG to this file, then quit.
    #[arg(long, global = true, value_name = "FILE.svg")]
    pub screenshot: Option<PathBuf>,
    /// Milliseconds before --screenshot is taken.
    #[arg(long, global = true, default_value_t = 3000, value_name = "MS")]
    pub screenshot_after: u64,
    /// NVML poll period in milliseconds.
    #[arg(long, global = true, default_value_t = 1000, value_name = "MS")]
    pub interval: u64,
    /// Draw new data at most every this many milliseconds (keys are answered at once).
    #[arg(long, global = true, default_value_t = 250, value_name = "MS")]
    pub refresh: u64,
}

impl UiFlags {
    fn options(&self) -> vramscope::ui::UiOptions {
        vramscope::ui::UiOptions {
            readonly: self.readonly,
            ascii: self.ascii,
            // ui branch: NO_COLOR is applied by the dashboard itself.
            monochrome: self.no_color,
            mouse: !self.no_mouse,
            initial_process: self.pid,
            data_interval: Duration::from_millis(self.refresh),
            screenshot: self
                .screenshot
                .clone()
                .map(|path| vramscope::ui::ScreenshotAfter {
                    path,
                    after: Duration::from_millis(self.screenshot_after),
                }),
            ..vramscope::ui::UiOptions::default()
        }
    }
}

/// Starts the collector and opens the dashboard on it.
// STOPGAP (ui branch): the demo handle and the driver are passed to `ui::run`.
fn dashboard(
    cfg: Config,
    opts: vramscope::ui::UiOptions,
    demo: Option<Arc<dyn vramscope::ui::DemoHandle>>,
) -> Result<()> {
    let hub = Arc::new(collect::Hub::default());
    collect::spawn(hub.clone(), cfg).context("starting the collector")?;
    let driver = Arc::new(StopgapDriver { hub: hub.clone() });
    vramscope::ui::run(hub, driver, demo, opts)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a simulated training job (no GPU needed) and watch it.
    Demo {
        /// The scenario (see --list).
        #[arg(default_value = "healthy")]
        scenario: String,
        /// List the scenarios, one per line, name first.
        #[arg(long)]
        list: bool,
        /// Allocator settings, as in PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True).
        #[arg(long, value_name = "CONF")]
        conf: Option<String>,
        /// Simulated seconds per second (default 1; 0.2 for `oom`).
        #[arg(long)]
        speed: Option<f64>,
        /// No terminal: run as fast as possible and print the final state.
        #[arg(long)]
        headless: bool,
        /// With --headless: simulated seconds to run (default: the whole scenario).
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// With --headless: print JSON.
        #[arg(long)]
        json: bool,
        /// Back every simulated segment with real GPU memory (CUDA device 0), so
        /// NVML and nvidia-smi see it too.
        #[arg(long)]
        gpu: bool,
    },
    /// Print the state of every GPU and process once.
    Snapshot {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Include each process's block map (segments and blocks) in the JSON.
        #[arg(long)]
        blocks: bool,
    },
    /// Replay allocation requests under any allocator configuration.
    Sim {
        /// A JSON-lines request file (see `src/sim/trace.rs`), or a recording
        /// made by `vramscope record` of a real process.
        #[arg(long, value_name = "FILE")]
        trace: PathBuf,
        /// With a recording: the process to replay (default: the one with the
        /// most events).
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// With a recording: the CUDA device to replay.
        #[arg(long, default_value_t = 0)]
        device: u16,
        /// Allocator settings, as in PYTORCH_CUDA_ALLOC_CONF.
        #[arg(long, value_name = "CONF")]
        conf: Option<String>,
        /// Device memory in GiB.
        #[arg(long, default_value_t = 80.0)]
        capacity_gib: f64,
        /// One JSON object per request.
        #[arg(long)]
        json: bool,
    },
    /// Run a command (e.g. `python train.py`) with the PyTorch agent injected;
    /// the script needs no change.
    #[command(trailing_var_arg = true)]
    Run {
        /// The command and its arguments.
        #[arg(required = true, allow_hyphen_values = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// The embedded PyTorch agent.
    Agent {
        #[command(subcommand)]
        what: AgentCommand,
    },
    /// Check and explain every requirement (NVML, segment directory, compiler,
    /// torch and CUDA headers), with what to do about each missing one.
    Doctor {
        /// One JSON object per check.
        #[arg(long)]
        json: bool,
    },
    /// Record NVML readings and every process's events to a file, until Ctrl-C.
    Record {
        /// The recording file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
    },
    /// Replay a recording (see `src/collect/recording.rs` for the format).
    Replay {
        file: PathBuf,
        /// Playback speed (recorded seconds per second); 0 = as fast as
        /// possible (without --ui).
        #[arg(long, default_value_t = 0.0)]
        speed: f64,
        /// Print the state at the end as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Watch the recording in the dashboard, at --speed (default 1).
        #[arg(long)]
        ui: bool,
    },
    /// Ask a process to release its cached memory (torch.cuda.empty_cache()).
    EmptyCache {
        /// The process id (as this machine sees it).
        pid: u32,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
    /// List this user's segments (instrumented processes) and their health.
    Rings {
        /// Remove segments whose process is gone.
        #[arg(long)]
        clean: bool,
        /// One JSON object per segment instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Print the directory of the extracted agent package (for PYTHONPATH,
    /// or `pip install` from it), extracting it first if needed.
    Path,
}

pub fn run(cli: Cli) -> Result<()> {
    let dir = discover::segment_dir(cli.shm_dir.as_deref());
    let mut cfg = Config::new(dir.clone());
    cfg.nvml = !cli.no_nvml;
    cfg.nvml_interval = Duration::from_millis(cli.ui.interval.max(100));
    match cli.command {
        None => dashboard(cfg, cli.ui.options(), None), // STOPGAP (ui branch)
        Some(Command::Rings { clean, json }) => crate::rings::run(&dir, clean, json),
        Some(Command::Run { command }) => {
            Err(vramscope::agent::exec(&command, cli.shm_dir.as_deref()))
        }
        Some(Command::Agent {
            what: AgentCommand::Path,
        }) => {
            println!("{}", vramscope::agent::extract()?.display());
            Ok(())
        }
        Some(Command::Doctor { json }) => {
            crate::report::doctor(&vramscope::agent::doctor(cli.shm_dir.as_deref()), json)
        }
        Some(Command::Record { output, duration }) => crate::record::record(cfg, &output, duration),
        Some(Command::Replay {
            file,
            speed,
            json,
            ui,
        }) => {
            if ui {
                let mut opts = cli.ui.options();
                // A recording cannot be sent commands.
                opts.readonly = true;
                crate::record::replay_ui(&file, if speed > 0.0 { speed } else { 1.0 }, opts)
            } else {
                crate::record::replay(&file, speed, json)
            }
        }
        Some(Command::EmptyCache { pid, timeout }) => {
            crate::record::empty_cache(&dir, pid, Duration::from_secs_f64(timeout))
        }
        Some(Command::Demo {
            scenario,
            list,
            conf,
            speed,
            headless,
            duration,
            json,
            gpu,
        }) => {
            if list {
                for (name, about) in vramscope::demo::list() {
                    println!("{name:<14} {about}");
                }
                return Ok(());
            }
            let sc = vramscope::demo::scenario(&scenario, conf.as_deref())?;
            if headless {
                let report = vramscope::demo::run_headless(sc, conf.as_deref(), duration, gpu)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    print!("{}", crate::report::headless(&report));
                }
                return Ok(());
            }
            let backing = if gpu {
                let g = vramscope::sim::gpu::GpuBacking::new(0)
                    .map_err(|e| anyhow::anyhow!("--gpu: {e}"))?;
                Some(g)
            } else {
                None
            };
            let speed = speed.unwrap_or_else(|| vramscope::demo::default_speed(&scenario));
            let demo = vramscope::demo::start(sc, &dir, speed, backing)?;
            let mut opts = cli.ui.options();
            // The simulated job is what a workshop watches: open its view
            // (Esc goes back to the overview).
            opts.initial_process = opts.initial_process.or(Some(std::process::id()));
            let r = dashboard(cfg, opts, Some(demo.clone())); // STOPGAP (ui branch)
            demo.stop();
            r
        }
        Some(Command::Snapshot { json, blocks }) => {
            let opts = ViewOptions {
                block_map: blocks,
                recent_events: 16,
                timeline: None,
            };
            let snap = collect::snapshot_once(cfg, Duration::from_secs(1), &opts);
            if json {
                println!("{}", serde_json::to_string_pretty(&snap)?);
            } else {
                print!("{}", crate::report::snapshot(&snap));
            }
            Ok(())
        }
        Some(Command::Sim {
            trace,
            pid,
            device,
            conf,
            capacity_gib,
            json,
        }) => {
            let (reqs, recorded) = crate::record::sim_requests(&trace, pid, device)?;
            let alloc = match &conf {
                Some(c) => sim::AllocConf::parse(c).with_context(|| format!("--conf {c:?}"))?,
                None => sim::AllocConf::default(),
            };
            let cfg = sim::SimConfig {
                alloc,
                capacity: (capacity_gib * (1u64 << 30) as f64) as u64,
                ..sim::SimConfig::default()
            };
            let reports = sim::replay(&reqs, &cfg);
            if json {
                for (i, r) in reports.iter().enumerate() {
                    let mut v = serde_json::to_value(r)?;
                    if let Some(Some(s)) = recorded.as_ref().map(|rec| rec[i]) {
                        v["recorded"] = serde_json::to_value(s)?;
                    }
                    println!("{v}");
                }
            } else {
                print!("{}", sim::render_table(&reports));
            }
            if let Some(rec) = &recorded {
                crate::record::compare_summary(&reports, rec, conf.as_deref());
            }
            Ok(())
        }
    }
}

// STOPGAP (ui branch): a minimal `ui::Driver` until the collector implements
// it on its tokio runtime. A std thread per command; the signals through
// tokio::signal on a small current-thread runtime of their own.
pub struct StopgapDriver {
    pub hub: Arc<collect::Hub>,
}

// STOPGAP (ui branch)
impl vramscope::ui::Driver for StopgapDriver {
    fn request(
        &self,
        key: vramscope::model::ProcessKey,
        command: vramscope::ring::Command,
        done: Box<dyn FnOnce(Result<vramscope::ring::Outcome, String>) + Send>,
    ) {
        let hub = self.hub.clone();
        let slot = Arc::new(std::sync::Mutex::new(Some(done)));
        let answer = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("vramscope-command".into())
            .spawn(move || {
                let r = collect::command(&hub, key, command, Duration::from_secs(5))
                    .map_err(|e| e.to_string());
                if let Some(done) = answer.lock().ok().and_then(|mut d| d.take()) {
                    done(r);
                }
            });
        if let Err(e) = spawned {
            if let Some(done) = slot.lock().ok().and_then(|mut d| d.take()) {
                done(Err(format!("could not start a thread: {e}")));
            }
        }
    }

    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>) {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        // Registered here, before returning, so no signal is missed.
        let registered = {
            let _in_rt = rt.enter();
            (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            )
        };
        let (Ok(mut int), Ok(mut term), Ok(mut hup)) = registered else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("vramscope-signals".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        tokio::select! {
                            _ = int.recv() => {}
                            _ = term.recv() => {}
                            _ = hup.recv() => {}
                        }
                        f();
                    }
                })
            });
    }
}
