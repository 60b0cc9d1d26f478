//! Command-line interface: one subcommand per job; each hands off to the library.
use std::path::PathBuf;
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
    #[command(subcommand)]
    pub command: Option<Command>,
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
        /// Simulated seconds per second.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
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
        /// A JSON-lines request file (see `src/sim/trace.rs`).
        #[arg(long, value_name = "FILE")]
        trace: PathBuf,
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
        /// Playback speed (recorded seconds per second); 0 = as fast as possible.
        #[arg(long, default_value_t = 0.0)]
        speed: f64,
        /// Print the state at the end as JSON instead of a table.
        #[arg(long)]
        json: bool,
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

pub fn run(cli: Cli) -> Result<()> {
    let dir = discover::segment_dir(cli.shm_dir.as_deref());
    let mut cfg = Config::new(dir.clone());
    cfg.nvml = !cli.no_nvml;
    match cli.command {
        None => anyhow::bail!("the dashboard is not built yet; try `vramscope demo --headless`"),
        Some(Command::Rings { clean, json }) => crate::rings::run(&dir, clean, json),
        Some(Command::Record { output, duration }) => crate::record::record(cfg, &output, duration),
        Some(Command::Replay { file, speed, json }) => crate::record::replay(&file, speed, json),
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
            let _ = (speed, gpu);
            anyhow::bail!("the dashboard is not built yet; add --headless")
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
            conf,
            capacity_gib,
            json,
        }) => {
            let text = std::fs::read_to_string(&trace)
                .with_context(|| format!("reading {}", trace.display()))?;
            let reqs =
                sim::parse_trace(&text).with_context(|| format!("in {}", trace.display()))?;
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
                for r in &reports {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                print!("{}", sim::render_table(&reports));
            }
            Ok(())
        }
    }
}
