//! Named workshop scenarios: deterministic scripts of timed allocator
//! operations with captions, and a runner that applies them to a
//! [`SimAllocator`] and yields the events a real process would produce.
//!
//! Sizes are realistic but modest: an 8 GiB device and a 12-layer model of
//! 48 MiB weight matrices trained with Adam (about 2.3 GiB of weights,
//! gradients and optimizer state) plus batch-dependent activations.
//!
//! ```ignore (crate-private)
//! use vramscope::sim::scenario::{Scenario, ScenarioRunner};
//! let mut run = ScenarioRunner::new(Scenario::by_name("leak").unwrap());
//! let mut events = Vec::new();
//! while !run.is_finished() {
//!     let t = run.now() + 100_000_000; // 100 ms of simulated time
//!     run.advance_to(t, &mut events);
//!     println!("{}", run.caption());
//! }
//! ```
//!
//! The scenarios are in `catalog` ([`Scenario`]); `ops` holds what a script is
//! made of, `scripts` the script of each scenario, and `runner` the
//! [`ScenarioRunner`] that plays one.
//!
//! [`SimAllocator`]: super::allocator::SimAllocator

mod catalog;
mod ops;
mod runner;
mod scripts;

pub use catalog::Scenario;
pub use runner::{ScenarioRunner, StepStats, SIM_CONTEXT, SIM_CUBLAS};
