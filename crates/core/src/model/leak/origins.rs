//! Where a flagged leak comes from: the modules (and captured stacks)
//! whose allocations outlive their step, step after step, siblings
//! numbered alike rolled up into one row.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

fn one() -> u64 {
    1
}

/// `model.layers.*` for `model.layers.3` (a numbered child), else None.
fn numbered_parent(module: &str) -> Option<String> {
    let (parent, last) = module.rsplit_once('.')?;
    (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())).then(|| format!("{parent}.*"))
}

/// Rolls growing siblings numbered alike (same parent, same stack) into
/// one row each: a leak through every layer of a stack of layers is one
/// finding, not twelve.
fn roll_up(rows: Vec<LeakOrigin>) -> Vec<LeakOrigin> {
    let mut by_parent: HashMap<(String, Vec<String>), Vec<LeakOrigin>> = HashMap::new();
    let mut out = Vec::new();
    for r in rows {
        match numbered_parent(&r.module) {
            Some(p) => by_parent.entry((p, r.stack.clone())).or_default().push(r),
            None => out.push(r),
        }
    }
    for ((parent, _), mut group) in by_parent {
        if group.len() == 1 {
            out.append(&mut group);
            continue;
        }
        let mut r = group[0].clone();
        r.module = parent;
        r.modules = group.len() as u64;
        r.bytes_per_step = group
            .iter()
            .fold(0u64, |a, g| a.saturating_add(g.bytes_per_step));
        r.live_bytes = group
            .iter()
            .fold(0u64, |a, g| a.saturating_add(g.live_bytes));
        r.steps_with_survivors = group
            .iter()
            .map(|g| g.steps_with_survivors)
            .max()
            .unwrap_or(0);
        r.first_step = group.iter().map(|g| g.first_step).min().unwrap_or(0);
        out.push(r);
    }
    out
}

/// A module (and code location, where a stack was captured) whose
/// allocations outlive their step, step after step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakOrigin {
    /// The module path ("" outside every module); `parent.*` for growing
    /// siblings numbered alike (`model.layers.*`: the layers of a
    /// `ModuleList`), rolled up into one row.
    #[serde(with = "crate::model::origin::module_json")]
    pub module: String,
    /// Modules rolled up into this row (1 for one module).
    #[serde(default = "one")]
    pub modules: u64,
    /// The stack captured when the module was entered, innermost first
    /// (empty: none captured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// The median over the window's steps of the bytes born in the step
    /// that are still alive.
    pub bytes_per_step: u64,
    /// Steps of the window that left blocks alive.
    pub steps_with_survivors: u64,
    /// The steps looked at: the last [`ORIGIN_WINDOW`] finished ones.
    pub window_steps: u64,
    /// Bytes alive now that were born in the window.
    pub live_bytes: u64,
    /// The earliest step a live block of the group was born in. Where
    /// blocks are dated by birth time (steps from the allocation period),
    /// only blocks born in the steps whose starts the survivor test keeps
    /// (about the last 50) are dated, and this is the earliest of those.
    pub first_step: u64,
}

/// Finished steps [`growing_origins`] looks at.
pub(crate) const ORIGIN_WINDOW: u64 = 16;

/// The groups (module, stack) of live allocated blocks, each given as
/// (module, stack, step born, bytes), whose blocks born in at least three
/// quarters of the last finished steps (at most [`ORIGIN_WINDOW`], at least
/// `min_steps`, before the current step `now`, after step 1) are still alive: most bytes
/// per step first (growing siblings `x.0`, `x.1`, … rolled up into `x.*`),
/// at most `top`; and how many more there were. A step's
/// temporaries die within it, parameters and optimizer state are born once:
/// neither is named.
pub(crate) fn growing_origins<'a>(
    blocks: impl Iterator<Item = (&'a str, &'a [String], u64, u64)>,
    now: u64,
    min_steps: usize,
    top: usize,
) -> (Vec<LeakOrigin>, u64) {
    // Step 1 left out: optimizer state and caches are born there once.
    let first = now.saturating_sub(ORIGIN_WINDOW).max(2);
    let window = now.saturating_sub(first);
    if window < (min_steps as u64).max(2) {
        return (Vec::new(), 0);
    }
    // (module, stack) -> (bytes by step of the window, earliest step).
    type Group = (Vec<u64>, u64);
    let mut groups: HashMap<(&str, &[String]), Group> = HashMap::new();
    for (module, stack, step, bytes) in blocks {
        let g = groups
            .entry((module, stack))
            .or_insert_with(|| (vec![0; window as usize], u64::MAX));
        g.1 = g.1.min(step);
        if (first..now).contains(&step) {
            let b = &mut g.0[(step - first) as usize];
            *b = b.saturating_add(bytes);
        }
    }
    let out: Vec<LeakOrigin> = groups
        .into_iter()
        .filter_map(|((module, stack), (by_step, first_step))| {
            let with = by_step.iter().filter(|b| **b > 0).count() as u64;
            if with * 4 < window * 3 {
                return None;
            }
            let mut sorted = by_step.clone();
            sorted.sort_unstable();
            Some(LeakOrigin {
                module: module.to_string(),
                modules: 1,
                stack: stack.to_vec(),
                bytes_per_step: sorted[sorted.len() / 2],
                steps_with_survivors: with,
                window_steps: window,
                live_bytes: by_step.iter().fold(0u64, |a, b| a.saturating_add(*b)),
                first_step,
            })
        })
        .collect();
    let mut out = roll_up(out);
    out.sort_by(|a, b| {
        b.bytes_per_step
            .cmp(&a.bytes_per_step)
            .then_with(|| crate::model::origin::natural_cmp(&a.module, &b.module))
            .then_with(|| a.stack.cmp(&b.stack))
    });
    let more = out.len().saturating_sub(top) as u64;
    out.truncate(top);
    (out, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only groups whose blocks outlive most of the last steps are named
    /// (parameters born once, a step's temporaries, a one-off cache are
    /// not); numbered siblings roll up; most bytes per step first.
    #[test]
    fn growing_origins_name_what_outlives_its_steps() {
        let none: &[String] = &[];
        let at = vec!["train.py:88 validate".to_string()];
        let mut blocks: Vec<(&str, &[String], u64, u64)> = Vec::new();
        for step in 0..20 {
            blocks.push(("model.param", none, 0, 1000)); // born before the steps
            blocks.push(("model.cache", none, 5, 10)); // once
            if step >= 2 {
                blocks.push(("model.layers.0", &at, step, 100));
                blocks.push(("model.layers.1", &at, step, 100));
            }
            if step % 2 == 0 {
                blocks.push(("head", none, step, 7)); // every other step: not most
            }
            if step % 4 != 0 {
                blocks.push(("tail", none, step, 3)); // three steps of four
            }
        }
        blocks.push(("temp", none, 20, 1 << 20)); // the current step's
        let (rows, more) = growing_origins(blocks.iter().copied(), 20, 8, 5);
        assert_eq!(more, 0);
        let names: Vec<(&str, u64)> = rows
            .iter()
            .map(|r| (r.module.as_str(), r.bytes_per_step))
            .collect();
        assert_eq!(names, [("model.layers.*", 200), ("tail", 3)]);
        assert_eq!(rows[0].modules, 2);
        assert_eq!(rows[0].stack, at);
        assert_eq!(rows[0].window_steps, 16);
        assert_eq!(rows[0].steps_with_survivors, 16);
        assert_eq!(rows[0].live_bytes, 16 * 200);
        assert_eq!(rows[1].steps_with_survivors, 12);
        // Too few steps: no verdict by module.
        let (rows, _) = growing_origins(blocks.iter().copied(), 6, 8, 5);
        assert!(rows.is_empty());
        // `top` cuts, counting the rest.
        let (rows, more) = growing_origins(blocks.iter().copied(), 20, 8, 1);
        assert_eq!((rows.len(), more), (1, 1));
    }
}
