//! What a scenario script is made of: allocator operations at simulated
//! times, and the contexts (module, phase, stack) the simulated job enters.

use serde::{Deserialize, Serialize};

use vramscope_wire::event::{Held, Phase};

/// One operation of a scenario script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Op {
    /// A tensor is created (`tensor` is the script's name for it).
    Alloc { tensor: u32, size: u64, stream: u64 },
    /// The tensor dies.
    Free { tensor: u32 },
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A training step begins (emits a `Marker` event with the step number).
    Step(u64),
    /// A full state snapshot is emitted.
    Snapshot,
    /// The job enters context `n` of [`Scenario::contexts`] (1-based; 0:
    /// outside every module), as an agent's module hooks would: the
    /// definitions are written on first use, and the allocations that
    /// follow carry it.
    ///
    /// [`Scenario::contexts`]: super::Scenario::contexts
    Context(u32),
    /// A role list (FORMAT 1.2), as the agent writes at a step boundary:
    /// the tensors PyTorch holds, each (tensor, its bytes, its role, the
    /// module path's 1-based index in [`Scenario::modules`]).
    ///
    /// [`Scenario::modules`]: super::Scenario::modules
    Roles(Vec<(u32, u64, Held, u32)>),
}

/// An operation at a simulated time, with the caption to show from then on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TimedOp {
    pub(crate) time_ns: u64,
    pub(crate) op: Op,
    pub(crate) caption: Option<String>,
}

/// A simulated Python frame: file, line, function.
pub(crate) type SimFrame = (&'static str, u32, &'static str);

/// A context of the simulated job: a module (`modules` index + 1, 0 none),
/// a phase, and the Python stack (innermost first) an agent capturing
/// stacks would see when the job enters it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SimContext {
    pub(crate) module: u32,
    pub(crate) phase: Phase,
    pub(crate) stack: Vec<SimFrame>,
}
