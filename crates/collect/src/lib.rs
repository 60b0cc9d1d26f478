//! vramscope's collector, and what stands on it.
//!
//! The collector proper (this file, [`hub`], [`state`], [`rings`],
//! [`nvml`], [`procfs`], [`replay`], [`signals`], [`advisor`],
//! [`profile`]) feeds the model from live sources; on it stand:
//!
//! - [`agent`]: the embedded PyTorch agent: extract, run a command with it,
//!   doctor checks.
//! - [`attach`]: `vramscope attach PID`: the agent put into a running
//!   Python process.
//! - [`trace`]: stepping through a snapshot file's trace, each step the
//!   state the model rebuilds in the hub.
//! - [`demo`]: the simulator writing into a real segment, for `vramscope demo`.
//! - [`serve`]: the collector's picture as Prometheus metrics.
//! - [`fleet`]: many machines through Prometheus (`vramscope fleet`).
//! - [`given`]: a file named on the command line (a recording or a
//!   snapshot file), told apart and read once whatever it is.
//! - [`recorded`]: the process of a recording a command takes (its
//!   census), its events and its requests, for `sim`, `advise` and `diff`.
//!
//! Under both `serve` and `fleet`, [`metrics`]: the metric families and
//! label names of the exporter, one table that both use.
//!
//! Layers, floor 0 first (`tests/layers.rs` holds each crate's files to
//! its list; the collector's own files are the crate root's floor):
//!
//! 0. metrics
//! 1. fleet, config, state, advisor, floor, nvml, procfs, signals, recorded
//! 2. hub
//! 3. rings, replay, profile, fixtures
//! 4. agent, trace, collector
//! 5. attach, demo, serve, given
//!
//! The collector: sources → hub. One type, [`Collector`], owns every source
//! (the segments of instrumented processes, NVML, the host-pid map from
//! `/proc`) and the [`Hub`] they feed; every way of running vramscope drives
//! it the same way: the dashboard, `snapshot`, `record`, the demo and
//! `replay --ui`.
//!
//! ```text
//!  rings::RingSet ──events──▶┐
//!  nvml::NvmlSource ─Machine─▶ Collector::{step, poll_nvml} ──Input──▶ Hub ──snapshot()──▶ views
//!  procfs ─────identities───▶┘        │                               │
//!                                     └─ ring::client::command ◀──────┘ take_resyncs()
//!                                        (the segment RingSet reads)
//! ```
//!
//! - [`Collector::step`] scans the segment directory when due, drains every
//!   segment and applies what it read; [`Collector::poll_nvml`] reads NVML
//!   once. Both are plain functions: headless drivers (the demo's lockstep
//!   run, `snapshot`) call them directly.
//! - [`Collector::run_until`] is the live loop, on tokio: a ring tick and an
//!   NVML tick (`MissedTickBehavior::Skip`); NVML runs off the runtime
//!   (`spawn_blocking`). After each step it reads what the model wants
//!   ([`Hub::take_resyncs`]) and asks those processes for a state snapshot.
//! - Commands: the one way to a process is [`vramscope_wire::ring::client`] (a
//!   segment opened once, a command posted on its control block, the answer
//!   waited for). The collector sends its own requests (resync snapshots,
//!   `snapshot`'s fresh states) through it, on the runtime's blocking
//!   threads, to the segment it reads the process from. The dashboard sends
//!   its users' commands through it to the segment its snapshot shows, and
//!   the subcommands to the segment they find by pid: neither goes through
//!   the collector. What an answered command changes in the model comes
//!   into the hub as an [`Input`] like any other (a peak reset:
//!   [`Hub::reset_peaks`]), so a recording of the hub holds it.
//! - [`Live`]: the collector on a runtime of its own, for a dashboard whose
//!   thread is not async. The dashboard reads the hub (`snapshot`,
//!   `on_change`), asks [`Live::refusal`] whether its processes may be sent
//!   commands (not under `--readonly`, nor a replay's) and hears signals
//!   through [`Live::on_signal`]; signals come back as calls from a
//!   thread of their own, which the dashboard turns into events on its
//!   own channel.
//!
//! Files: [`hub`] (the shared state), [`state`] (the published picture),
//! [`rings`] (segment discovery and draining), [`nvml`], [`procfs`],
//! [`replay`] (a recording played back at any speed), [`signals`].

pub mod agent;
pub mod attach;
pub mod demo;
pub mod fleet;
pub mod given;
pub mod serve;
pub mod trace;

pub(crate) mod advisor;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
#[cfg(feature = "live-floor")]
mod floor;
pub(crate) mod hub;
pub(crate) mod metrics;
pub(crate) mod nvml;
pub mod procfs;
pub(crate) mod profile;
pub mod recorded;
pub mod replay;
pub(crate) mod rings;
pub mod signals;
pub(crate) mod state;

mod collector;
mod config;

pub use advisor::CPU_SHARE as ADVISOR_CPU_SHARE;
pub use collector::{runtime, Collector, Live};
pub use config::Config;
pub use hub::Hub;
pub use state::{CleanedSegment, ProcessEntry, Snapshot};
pub use vramscope_core::input::{Identity, Input, Machine};
