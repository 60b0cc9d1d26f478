//! The step diff: what a step allocated that is still alive, grouped by
//! module, phase, role, requested size and code location, from a process
//! view taken with its block map (the dashboard's `d` overlay, `replay
//! --diff`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::attrib::ContextView;
use super::origin::{natural_cmp, PhaseKey};
use super::roles::Role;
use super::view::ProcessView;
use vramscope_wire::event::BlockState;

/// One row of a step diff: live blocks of one module, phase and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffRow {
    #[serde(with = "crate::model::origin::module_json")]
    pub module: String,
    pub phase: PhaseKey,
    /// What the blocks are to PyTorch (`model::roles`).
    #[serde(default = "Role::other")]
    pub role: Role,
    /// The requested size of each block of the row.
    pub size: u64,
    pub blocks: u64,
    /// Allocated bytes (block sizes) in all.
    pub bytes: u64,
    /// The code location: the stack captured when the module was entered,
    /// innermost first (empty: none captured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// What was born in step `born` and is still alive at step `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDiff {
    pub(crate) born: u64,
    /// The step the view was taken in.
    pub at: Option<u64>,
    pub bytes: u64,
    pub blocks: u64,
    /// Most bytes first.
    pub rows: Vec<DiffRow>,
}

/// The step diff of a process view taken with its block map: the allocated
/// blocks born in step `born`, grouped by module, phase, requested size and
/// code location (the stack, where one was captured).
/// A context keyed by step gives the step of its blocks.
pub fn step_diff(view: &ProcessView, born: u64) -> StepDiff {
    let attrib = &view.attribution;
    let unknown = ContextView {
        id: 0,
        module: String::new(),
        phase: PhaseKey::Unknown,
        step: None,
        stack: Vec::new(),
    };
    type Key<'a> = (&'a str, PhaseKey, Role, u64, &'a [String]);
    let mut groups: BTreeMap<Key, (u64, u64)> = BTreeMap::new();
    let blocks = view
        .devices
        .iter()
        .flat_map(|d| (d.segments.iter().flat_map(|s| s.blocks.iter())).chain(d.orphans.iter()));
    for v in blocks {
        let b = &v.block;
        if b.state != BlockState::Allocated {
            continue;
        }
        let c = attrib.context(b.origin.context).unwrap_or(&unknown);
        let step = c.step.or(b.origin.step.map(u64::from));
        if step != Some(born) {
            continue;
        }
        // A block a role list names is its holder's (a gradient made
        // in backward, optimizer state made in the step).
        let module = v.held_by.as_deref().unwrap_or(c.module.as_str());
        let role = v.role.unwrap_or(Role::Other);
        let e = groups
            .entry((module, c.phase, role, b.requested, c.stack.as_slice()))
            .or_default();
        e.0 = e.0.saturating_add(b.size);
        e.1 += 1;
    }
    let mut rows: Vec<DiffRow> = groups
        .into_iter()
        .map(
            |((module, phase, role, size, stack), (bytes, blocks))| DiffRow {
                module: module.to_string(),
                phase,
                role,
                size,
                blocks,
                bytes,
                stack: stack.to_vec(),
            },
        )
        .collect();
    rows.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| natural_cmp(&a.module, &b.module))
    });
    StepDiff {
        born,
        at: attrib.step,
        bytes: rows.iter().fold(0, |a, r| a.saturating_add(r.bytes)),
        blocks: rows.iter().map(|r| r.blocks).sum(),
        rows,
    }
}
