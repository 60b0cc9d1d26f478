//! Where a block came from, as every part of the model names it: its
//! [`Origin`] (the context of the allocation that made it and the step it
//! was born in), the [`PhaseKey`] shown for it, and the order module paths
//! are listed in. The floor of `model`: it imports nothing of the model, so
//! the block map, the leak analysis, role lists and attribution all stand
//! on it.

use serde::{Deserialize, Serialize};

use vramscope_wire::event::{CtxTag, Phase};

/// Where a block came from: the context of the allocation that made it and
/// the step it was born in (resolved from the step tag when it was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Origin {
    /// The CONTEXT id (0: none given).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub context: u32,
    /// The step the block was born in (None: not given or not resolvable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Origin {
    /// The origin of an allocation tagged `tag` while the reader's current
    /// step is `now`.
    #[inline]
    pub(crate) fn of(tag: CtxTag, now: Option<u64>) -> Origin {
        if tag.is_none() {
            return Origin::default();
        }
        Origin {
            context: tag.context,
            step: resolve_step(tag.step_tag, now).and_then(|s| u32::try_from(s).ok()),
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        *self == Origin::default()
    }
}

/// The step whose tag is `tag` nearest to the current step `now`: `now`
/// itself, the step after it (its boundary not read yet: rings are merged
/// by time), or one of the 253 before it. FORMAT.md: the latest step
/// boundary whose tag matches; steps last far longer than clock skew.
pub(crate) fn resolve_step(tag: u8, now: Option<u64>) -> Option<u64> {
    let now = now?;
    if tag == 0 {
        return None;
    }
    let want = u64::from(tag - 1);
    let ahead = (want + 255 - now % 255) % 255;
    match ahead {
        0 => Some(now),
        1 => now.checked_add(1),
        _ => now.checked_sub(255 - ahead),
    }
}

/// What a block's phase is, as shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseKey {
    Forward,
    Backward,
    Optimizer,
    Other,
    /// No context, an undefined one, or a context without a phase.
    Unknown,
}

impl PhaseKey {
    pub const ALL: [PhaseKey; 5] = [
        PhaseKey::Forward,
        PhaseKey::Backward,
        PhaseKey::Optimizer,
        PhaseKey::Other,
        PhaseKey::Unknown,
    ];

    pub(crate) fn of(p: Phase) -> PhaseKey {
        match p {
            Phase::NotGiven => PhaseKey::Unknown,
            Phase::Forward => PhaseKey::Forward,
            Phase::Backward => PhaseKey::Backward,
            Phase::Optimizer => PhaseKey::Optimizer,
            Phase::Other(_) => PhaseKey::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PhaseKey::Forward => "forward",
            PhaseKey::Backward => "backward",
            PhaseKey::Optimizer => "optimizer",
            PhaseKey::Other => "other",
            PhaseKey::Unknown => "unknown",
        }
    }
}

/// Text order with runs of digits compared as numbers, so that
/// `model.layers.2` comes before `model.layers.10`.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> impl Iterator<Item = &str> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digit = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digit)
                .unwrap_or(rest.len());
            let (chunk, tail) = rest.split_at(end);
            rest = tail;
            Some(chunk)
        })
    }
    let (mut x, mut y) = (chunks(a), chunks(b));
    loop {
        match (x.next(), y.next()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(p), Some(q)) => {
                let numeric = p.as_bytes()[0].is_ascii_digit() && q.as_bytes()[0].is_ascii_digit();
                let o = if numeric {
                    let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                    p.len().cmp(&q.len()).then_with(|| p.cmp(q))
                } else {
                    p.cmp(q)
                };
                if o.is_ne() {
                    return o;
                }
            }
        }
    }
}

/// A module path in JSON: `null` for allocations outside every module
/// (the model keeps them as the empty path), never `""`, which a reader
/// would take for the root module. Reads both back.
pub(crate) mod module_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(m: &str, s: S) -> Result<S::Ok, S::Error> {
        if m.is_empty() {
            s.serialize_none()
        } else {
            s.serialize_str(m)
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_tags_resolve_to_the_nearest_step() {
        let tag = CtxTag::step_tag_of;
        assert_eq!(resolve_step(tag(10), Some(10)), Some(10));
        assert_eq!(resolve_step(tag(11), Some(10)), Some(11));
        assert_eq!(resolve_step(tag(9), Some(10)), Some(9));
        // 253 steps back still resolves; a tag of "now + 2" is 253 back.
        assert_eq!(resolve_step(tag(1000 - 253), Some(1000)), Some(747));
        assert_eq!(resolve_step(tag(1002), Some(1000)), Some(747));
        assert_eq!(resolve_step(tag(5), Some(3)), None); // before step 0
        assert_eq!(resolve_step(0, Some(3)), None);
        assert_eq!(resolve_step(tag(3), None), None);
        for now in [0u64, 1, 254, 255, 256, 1 << 40] {
            for back in 0..=253u64.min(now) {
                assert_eq!(resolve_step(tag(now - back), Some(now)), Some(now - back));
            }
        }
    }
}
