//! The allocator model: pure state rebuilt from decoded events. No I/O, no
//! clocks, no threads — the caller feeds events, loss counts and NVML
//! samples, each with its timestamp, and reads views.
//!
//! Module map:
//!
//! - [`Model`] (`processes`): processes by [`ProcessKey`], the entry points;
//!   `config`: the key, the mode and the configuration with its bounds.
//! - [`process`]: one process — devices, counters, recent events, OOMs,
//!   NVML, events/s, figures and views.
//! - [`device`]: one device allocator — the segment and block types, the
//!   queries, totals, peaks and drift against stats samples. Its operations
//!   are submodules:
//!   - `device::apply`: the event rules (Alloc … SegmentUnmap) and the
//!     contradictions they detect;
//!   - `device::snapshot`: receiving a snapshot (SnapshotBegin … End), and
//!     buffering the events that arrive meanwhile;
//!   - `device::install`: replacing the state from a complete snapshot and
//!     replaying those events.
//! - [`rules`]: PyTorch's block rules used to infer block sizes (the one
//!   place that guesses).
//! - [`series`]: bounded downsampling time series for timelines.
//! - [`leak`]: step detection, floor trend, growing allocation sizes.
//! - [`origin`]: where a block came from (its context and birth step), its
//!   phase as shown, the order of module paths: the floor the block map,
//!   leaks, roles and attribution stand on (it imports no other part).
//! - [`attrib`]: attribution — the definitions a process sent (strings,
//!   frames, stacks, contexts), the step its tags resolve against, live
//!   bytes by module and phase.
//! - [`roles`]: role lists matched to blocks (parameters, gradients, ...).
//! - [`stepdiff`]: what a step allocated that is still alive, from a view.
//! - [`view`]: the serde-serialisable snapshot the views read.
//!
//! Every structure that grows with the input has a bound in
//! [`ModelConfig::bounds`] ([`Bounds`]); what a bound drops is counted per
//! process ([`Dropped`], in [`ProcessView::dropped`]). Figures derived from
//! the input saturate instead of wrapping, and one that cannot be true is
//! flagged ([`Implausible`]) rather than shown as a fact.
//!
//! Memory per process, structure by structure (the figures of the default
//! [`ModelConfig`]; `Process::memory_bytes` counts each, and the test
//! `process::tests::documented_memory_bounds_hold` checks them after a long
//! run):
//!
//! | structure | bound | bytes at most |
//! |---|---|---:|
//! | event log (`eventlog`): the history, OOM context and snapshot placement | [`RECENT_EVENTS`] = 32,768 events × 40 B, and ≤ [`Bounds::places`] places × 32 B | 1.25 MiB |
//! | time series, per device: allocated, reserved and active in one bucket (`Series<3>`) | 5 tiers × 4,096 buckets × 80 B | 1.5625 MiB |
//! | period finder window (`period`), only while no markers or optimizer steps give the steps | 32,768 × 16 B | 0.5 MiB |
//! | role lists (`roles`): the list in use and the one being received | 2 × [`Bounds::roles`] = 2 × 65,536 tensors × 24 B | 3 MiB (GPT-2 small with Adam: about 600 tensors, 28 KiB) |
//! | block map, segments, orphans, attribution, leak sizes | [`Bounds`] | a few KiB for a real job |
//!
//! ```text
//!  events ──▶ Model::apply(key, ev) ──▶ Process ──▶ DeviceState (blocks)
//!  loss   ──▶ Model::note_loss          │            └ Series<3>
//!  NVML   ──▶ Model::note_nvml          ├ LeakDetector, EventRate, OOMs
//!                                       ▼
//!                      Model::view(now) → ModelView (serde)
//! ```
pub mod attrib;
mod config;
pub mod device;
pub(crate) mod eventlog;
pub mod forecast;
pub mod leak;
pub(crate) mod origin;
pub mod outside;
pub(crate) mod period;
pub(crate) mod process;
mod processes;
pub mod roles;
pub(crate) mod rules;
pub mod rundiff;
pub(crate) mod series;
pub mod stepdiff;
pub mod view;

#[cfg(test)]
mod tests;

pub use config::{Bounds, Mode, ModelConfig, ProcessKey, Watch, RECENT_EVENTS};
#[cfg(test)]
pub(crate) use device::{DeviceState, Problem};
#[cfg(test)]
pub(crate) use leak::StepSource;
pub use process::Process;
pub use processes::Model;
#[cfg(test)]
pub(crate) use rules::BlockRules;
pub use view::{
    Dropped, Implausible, ModelView, ProcessView, TimelineRequest, ViewOptions, WatchView,
};
