//! A simulator of PyTorch's CUDA caching allocator (workshops, demos, and
//! what-if replays of allocation traces).
//!
//! - [`rules`]: the allocator's size rules as pure functions (shared with the model).
//! - [`conf`]: `PYTORCH_CUDA_ALLOC_CONF` parsing.
//! - [`allocator`]: [`SimAllocator`], one device's caching allocator, emitting trace events.
//! - [`trace`]: the JSON-lines request format and [`replay`].
//! - [`scenario`]: named workshop scenarios and their [`ScenarioRunner`].
pub mod allocator;
pub mod conf;
pub mod rules;
pub mod scenario;
pub mod trace;

pub use allocator::{
    BlockInfo, EventSink, FnSink, NullSink, OomError, SegmentInfo, SimAllocator, SimConfig,
    SimError,
};
pub use conf::{AllocConf, ConfError};
pub use scenario::{Scenario, ScenarioRunner, StepStats};
pub use trace::{
    parse_trace, render_table, replay, replay_with_sink, Request, StepReport, TraceError,
};

#[cfg(test)]
mod alloc_tests;
