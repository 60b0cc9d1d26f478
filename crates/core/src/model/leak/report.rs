//! The leak detector's verdict as the views carry it: the report, where
//! its steps came from, the sizes that grow, the survivor test and the
//! verdicts of earlier runs.

use serde::{Deserialize, Serialize};

use super::origins::LeakOrigin;

/// Where step boundaries come from (in order of precedence, highest last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// No step seen yet.
    None,
    /// The period of the allocation pattern (no markers, no optimizer).
    AllocationPeriod,
    /// PyTorch's optimizer step hook (the first optimizer's steps).
    OptimizerSteps,
    /// `vramscope.mark()` markers written by the process.
    Markers,
}

impl StepSource {
    /// How it reads in a sentence ("12 steps from …").
    pub fn describe(self) -> &'static str {
        match self {
            StepSource::None => "no source",
            StepSource::AllocationPeriod => "the allocation pattern",
            StepSource::OptimizerSteps => "optimizer steps",
            StepSource::Markers => "vramscope.mark()",
        }
    }
}

/// The verdict of an earlier run of the job (see [`MarkSource::Run`]).
///
/// [`MarkSource::Run`]: vramscope_wire::event::MarkSource::Run
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunVerdict {
    /// 1 for the first run.
    pub run: u64,
    pub steps: u64,
    /// The step at which the run was first flagged.
    pub flagged_at_step: Option<u64>,
}

/// One allocation size whose live count keeps growing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakSize {
    /// The caller's request in bytes.
    pub requested: u64,
    /// The block it occupies (512 B rounding).
    pub block_size: u64,
    /// Tensors of this size alive now.
    pub live: u64,
    /// Robust growth of the live count per step.
    pub live_growth_per_step: f64,
    /// Growth of the live count over the analysed boundaries.
    pub live_growth: i64,
    /// Age of the oldest live tensor of this size, when known.
    pub oldest_age_ns: Option<u64>,
    /// The step (of this run) at which this size was first allocated.
    #[serde(default)]
    pub first_step: u64,
}

/// The verdict for one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakReport {
    /// The floor test or the survivor test says leak.
    pub flagged: bool,
    /// The survivor test (a steady stream of blocks outliving their step).
    #[serde(default)]
    pub survivors: SurvivorTest,
    pub source: StepSource,
    /// Steps seen in this run (with this step source).
    pub steps_observed: u64,
    /// Steps seen since watching began, every run's: never falls (the
    /// exporter's `vramscope_process_steps_total`).
    #[serde(default)]
    pub steps_total: u64,
    /// Floors analysed.
    pub window_steps: usize,
    /// Theil–Sen slope of the floor, bytes per step.
    pub floor_slope_bytes_per_step: f64,
    /// Slope × analysed steps.
    pub floor_growth_bytes: f64,
    /// Kendall's τ of floor vs step (1 = rises every step).
    pub trend: f64,
    pub last_floor: Option<u64>,
    /// Sizes whose live counts grow most.
    pub top_sizes: Vec<LeakSize>,
    /// How sure the step boundaries are (0..1): 1 for markers and optimizer
    /// steps, the period's confidence for the allocation pattern.
    #[serde(default)]
    pub step_confidence: f64,
    /// With [`StepSource::AllocationPeriod`]: allocations per step.
    #[serde(default)]
    pub period_allocations: Option<u64>,
    /// The step of this run at which it was first flagged, and how long
    /// after the run's first step.
    #[serde(default)]
    pub flagged_at_step: Option<u64>,
    #[serde(default)]
    pub flagged_after_ns: Option<u64>,
    /// This run's number (1 for the first) and the verdicts of earlier ones.
    #[serde(default)]
    pub run: u64,
    #[serde(default)]
    pub earlier_runs: Vec<RunVerdict>,
    /// With a flagged leak and tagged allocations: the modules (and code
    /// locations, where stacks were captured) whose surviving allocations
    /// grow, most bytes per step first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<LeakOrigin>,
    /// Growing groups beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_origins: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The survivor test: of the steps looked at, how many left allocated
/// blocks that are still alive. A steady stream of survivors (blocks born
/// in at least three quarters of [`SURVIVOR_WINDOW`] steps, each older than
/// [`SURVIVOR_SKIP`] steps) is a leak, however much the floors swing;
/// temporaries die within their step, parameters, optimizer state and
/// caches are born once (in the run's first [`WARM_UP`] steps, which are
/// not looked at).
///
/// [`SURVIVOR_WINDOW`]: super::SURVIVOR_WINDOW
/// [`SURVIVOR_SKIP`]: super::SURVIVOR_SKIP
/// [`WARM_UP`]: super::WARM_UP
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SurvivorTest {
    /// Steps looked at (at most [`SURVIVOR_WINDOW`]; fewer early in a run).
    ///
    /// [`SURVIVOR_WINDOW`]: super::SURVIVOR_WINDOW
    pub window_steps: u64,
    /// Of them, the steps that left a live block.
    pub steps_with_survivors: u64,
    /// Bytes alive that were born in those steps.
    pub bytes: u64,
    /// A full window, three quarters of it with survivors.
    pub flagged: bool,
}
