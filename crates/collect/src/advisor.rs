//! The live advisor's worker: one thread that replays the advised
//! processes' allocator events under every candidate setting
//! ([`vramscope_core::sim::live`]), within a share of one core.
//!
//! ```text
//!  Hub::apply_events ──Msg::Events (copies, bounded)──▶ worker ──LiveAdvice──▶ Results ──▶ Snapshot
//! ```
//!
//! - **Cost.** The worker measures its own CPU time and keeps it within
//!   [`CPU_SHARE`] of one core: a bucket fills at that share of wall time,
//!   up to [`CREDIT`] (so a short job is advised at once, and a watcher
//!   idle for days has saved no more than that), and each batch's CPU time
//!   is taken out of it. When it is empty the worker sleeps until it is
//!   not; events wait in the queue.
//! - **Memory.** At most [`MAX_QUEUED`] events wait. When a batch would
//!   pass that, the hub stops following that process and the advisor says
//!   so: its advice covers the job up to there (a sample of the stream,
//!   from its start), and the process is replayed no further.
//! - **The job's setting** is read here (the one I/O): its
//!   `PYTORCH_CUDA_ALLOC_CONF` (or `PYTORCH_ALLOC_CONF`) from
//!   `/proc/<pid>/environ` (made printable, as the parser reads it:
//!   [`setting_shown`]), its memory limit from the agent's marker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vramscope_core::model::ProcessKey;
use vramscope_core::sim::live::{Live, LiveAdvice, Setting};
use vramscope_wire::event::Event;

/// The share of one core the worker may use, over its life.
pub const CPU_SHARE: f64 = 0.05;
/// The most CPU time the worker may spend ahead of its share.
pub(crate) const CREDIT: Duration = Duration::from_secs(1);
/// The most events waiting for the worker (about 8 MiB).
pub(crate) const MAX_QUEUED: usize = 1 << 17;
/// How often a process's advice is published while it changes.
const PUBLISH: Duration = Duration::from_millis(250);
/// Device memory assumed when NVML does not say (an 80 GB card).
const DEFAULT_CAPACITY: u64 = 80 << 30;

/// Where watching a process began, for its advisor.
#[derive(Debug, Clone)]
pub(crate) enum Start {
    /// From its first allocation.
    FromStart,
    /// From now: the tensors it holds on `device` (address, size, stream).
    Held {
        device: u16,
        held: Vec<(u64, u64, u64)>,
        /// The device's segments as its block map shows them (empty when
        /// they cannot be installed).
        segments: Vec<vramscope_core::model::device::HeldSegment>,
    },
}

/// What the worker is told.
pub(crate) enum Msg {
    Start {
        key: ProcessKey,
        /// Its pid on this host (None for a replay's: its environment is
        /// not here).
        host_pid: Option<u32>,
        start: Start,
        capacity: Option<u64>,
        torch: Option<(u32, u32)>,
    },
    Events {
        key: ProcessKey,
        events: Vec<Event>,
    },
    Stop {
        key: ProcessKey,
        why: String,
    },
    Forget {
        key: ProcessKey,
    },
    /// Answered once everything sent before it is replayed and published.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// The hub's change listener: called when something a reader shows changed
/// (the hub's listener; the advisor's worker calls it when it publishes).
pub(crate) type Listener = Box<dyn Fn() + Send + Sync>;

/// The hub's change listener, shared.
pub(crate) type SharedListener = Arc<Mutex<Option<Listener>>>;

/// The advice per process, written by the worker, read into snapshots.
pub(crate) type Results = Arc<Mutex<HashMap<ProcessKey, LiveAdvice>>>;

/// The hub's end: sends to the worker, bounded.
pub(crate) struct Tap {
    tx: Sender<Msg>,
    queued: Arc<AtomicUsize>,
    pub(crate) results: Results,
}

impl Tap {
    /// Starts the worker thread; `share`: the share of one core it may use
    /// (None: no bound, for a recording played as fast as it is read).
    pub(crate) fn spawn(share: Option<f64>, listener: SharedListener) -> Tap {
        let (tx, rx) = channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let results: Results = Arc::default();
        let worker = Worker {
            rx,
            queued: queued.clone(),
            results: results.clone(),
            lives: HashMap::new(),
            share,
            listener,
        };
        // The worker ends when the hub (and its Tap) is dropped.
        std::thread::Builder::new()
            .name("vramscope-advisor".into())
            .spawn(move || worker.run())
            .expect("spawning the advisor thread");
        Tap {
            tx,
            queued,
            results,
        }
    }

    pub(crate) fn send(&self, m: Msg) {
        // The worker only ends when this Tap is dropped.
        let _ = self.tx.send(m);
    }

    /// Events waiting for the worker.
    pub(crate) fn backlog(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Sends a batch of `key`'s events; false when the queue is full (the
    /// batch is not sent).
    pub(crate) fn send_events(&self, key: ProcessKey, events: Vec<Event>) -> bool {
        let n = events.len();
        if self.queued.load(Ordering::Relaxed) + n > MAX_QUEUED {
            return false;
        }
        self.queued.fetch_add(n, Ordering::Relaxed);
        self.send(Msg::Events { key, events });
        true
    }
}

/// Whether the advisor wants an event: the allocator's own, markers and
/// statistics samples.
pub(crate) fn wanted(e: &Event) -> bool {
    use vramscope_wire::event::Class;
    let class = e.kind.class();
    class.is_allocator() || matches!(class, Class::Marker | Class::Stats)
}

struct Worker {
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
    results: Results,
    lives: HashMap<ProcessKey, (Live, Instant)>,
    share: Option<f64>,
    /// The hub's change listener: told after each publication, so a view
    /// redraws with the advice.
    listener: SharedListener,
}

impl Worker {
    fn run(mut self) {
        // The bucket, in CPU seconds: full at start.
        let mut tokens = CREDIT.as_secs_f64();
        let (mut last, mut cpu_last) = (Instant::now(), thread_cpu());
        while let Ok(m) = self.rx.recv() {
            if self.take(m) {
                notify(&self.listener);
            }
            let Some(share) = self.share else {
                continue;
            };
            let (now, cpu) = (Instant::now(), thread_cpu());
            tokens += (now - last).as_secs_f64() * share;
            tokens = tokens.min(CREDIT.as_secs_f64());
            tokens -= cpu.saturating_sub(cpu_last).as_secs_f64();
            (last, cpu_last) = (now, cpu);
            // Overspent: sleep until the bucket is back at zero.
            if tokens < 0.0 {
                std::thread::sleep(Duration::from_secs_f64(-tokens / share));
            }
        }
    }

    /// Takes one message; whether it published advice.
    fn take(&mut self, m: Msg) -> bool {
        let mut published = false;
        match m {
            Msg::Start {
                key,
                host_pid,
                start,
                capacity,
                torch,
            } => {
                let (conf, note) = match host_pid {
                    Some(pid) => alloc_conf(pid),
                    None => (
                        String::new(),
                        Some("the job's environment is not this host's to read (a demo's simulated job, or a recording): its setting is taken as the defaults".into()),
                    ),
                };
                let setting = Setting {
                    conf,
                    capacity: capacity.unwrap_or(DEFAULT_CAPACITY),
                    torch,
                };
                let live = match start {
                    Start::FromStart => Live::from_start(setting.clone()),
                    Start::Held {
                        device,
                        held,
                        segments,
                    } => {
                        Live::held(setting.clone(), device, held).map(|l| l.with_segments(segments))
                    }
                };
                let mut live = match live {
                    Ok(l) => l,
                    // The job's own text does not parse: advise from the
                    // defaults and say so.
                    Err(e) => {
                        let mut l = Live::from_start(Setting {
                            conf: String::new(),
                            ..setting
                        })
                        .expect("the defaults parse");
                        l.stop(format!("{e}: not a setting the advisor knows"));
                        l
                    }
                };
                if let Some(n) = note {
                    live.note(n);
                }
                published |= publish(&self.results, key, &live);
                self.lives.insert(key, (live, Instant::now()));
            }
            Msg::Events { key, events } => {
                self.queued.fetch_sub(events.len(), Ordering::Relaxed);
                let idle = self.queued.load(Ordering::Relaxed) == 0;
                let Some((live, last)) = self.lives.get_mut(&key) else {
                    return false;
                };
                for e in &events {
                    live.feed(e);
                }
                // Nothing else waits: publish now (a quiet job's advice is
                // current); else at most every PUBLISH.
                if idle || last.elapsed() >= PUBLISH {
                    *last = Instant::now();
                    published |= publish(&self.results, key, live);
                }
            }
            Msg::Stop { key, why } => {
                if let Some((live, _)) = self.lives.get_mut(&key) {
                    live.stop(why);
                    published |= publish(&self.results, key, live);
                }
            }
            Msg::Flush(done) => {
                for (key, (live, _)) in &self.lives {
                    published |= publish(&self.results, *key, live);
                }
                let _ = done.send(());
            }
            Msg::Forget { key } => {
                self.lives.remove(&key);
                self.results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
            }
        }
        published
    }
}

/// Publishes `key`'s advice (true: done).
fn publish(results: &Results, key: ProcessKey, live: &Live) -> bool {
    let advice = live.advice();
    results
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, advice);
    true
}

fn notify(listener: &SharedListener) {
    if let Some(f) = listener.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        f();
    }
}

/// The job's `PYTORCH_CUDA_ALLOC_CONF` from its environment ("" when not
/// set), and a note when the environment could not be read.
fn alloc_conf(pid: u32) -> (String, Option<String>) {
    let env = procfs::process::Process::new(pid as i32).and_then(|p| p.environ());
    match env {
        Ok(env) => {
            let get = |k: &str| env.get(std::ffi::OsStr::new(k));
            let v = get("PYTORCH_CUDA_ALLOC_CONF").or_else(|| get("PYTORCH_ALLOC_CONF"));
            // A bound on what a hostile environment can make us parse.
            let text: String = v
                .map(|v| v.to_string_lossy().chars().take(4096).collect())
                .unwrap_or_default();
            (setting_shown(&text), None)
        }
        Err(e) => (
            String::new(),
            Some(format!(
                "the job's environment could not be read ({e}): its setting is taken as the defaults"
            )),
        ),
    }
}

/// The job's setting as the advisor takes it, parses it and shows it
/// (issue 44, item 5): as the parser reads it (the whitespace it skips,
/// line breaks included, gone), and printable (a control character left
/// makes it a setting the parser refuses, and is shown as U+FFFD). Every
/// candidate is made from this text, so none carries the job's raw bytes.
fn setting_shown(raw: &str) -> String {
    vramscope_text::printable(&vramscope_core::sim::AllocConf::as_read(raw))
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44, item 5: what a job's environment holds between its
    /// options reaches nothing raw; the setting parses as before.
    #[test]
    fn item5_the_jobs_setting_is_taken_printable() {
        let raw =
            "max_split_size_mb:\r128,\n\x0bexpandable_segments:\x0cTrue\u{85}\u{2028}\u{2029}\t";
        let shown = setting_shown(raw);
        assert_eq!(shown, "max_split_size_mb:128,expandable_segments:True");
        assert_eq!(
            vramscope_core::sim::AllocConf::parse(&shown),
            vramscope_core::sim::AllocConf::parse(raw)
        );
        // A control the parser does not skip: refused, and shown replaced.
        let shown = setting_shown("max_split_size_mb:128\x1b[2J");
        assert_eq!(shown, "max_split_size_mb:128\u{fffd}[2J");
        assert!(vramscope_core::sim::AllocConf::parse(&shown).is_err());
    }
}
