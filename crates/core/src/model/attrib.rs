//! Attribution: who holds the memory (FORMAT.md, "Contexts, strings, frames
//! and stacks").
//!
//! A producer tags each allocator event with the context its thread was in
//! (module path, phase, stack) and the step tag; it defines contexts,
//! strings, frames and stacks in the agent ring. This module keeps those
//! definitions (every table bounded), the step the tags resolve against,
//! and computes the views: live bytes by module and by phase, the contexts
//! live blocks refer to, and the step diff (what was born in step k and is
//! still alive now).
//!
//! Each block remembers its [`Origin`] (context id, step born) from the
//! ALLOC event or the SNAP_BLOCK record that made it; everything else is
//! resolved when a view is taken, so the per-event cost is a copy.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::config::Bounds;
pub use super::origin::natural_cmp;
pub use super::origin::{Origin, PhaseKey};
use super::roles::{shared_path, Role, RoleLists};
use vramscope_text::printable;
use vramscope_wire::event::{CtxTag, DropWhat, EventKind, MarkSource, Phase};

/// The longest string a producer sends (FORMAT.md: at most 4096 bytes).
pub(crate) const MAX_STRING: u32 = 4096;
/// Frames shown of one stack (a longer or looping chain is cut).
pub(crate) const MAX_STACK_FRAMES: usize = 64;

/// A string being received in 32-byte chunks, or complete.
#[derive(Debug, Clone)]
enum Str {
    Partial {
        len: u32,
        bytes: Box<[u8]>,
        /// Chunk `i` arrived (at most 4096 / 32 = 128 chunks).
        have: u128,
    },
    Done(Box<str>),
}

#[derive(Debug, Clone, Copy)]
struct ContextDef {
    module: u32,
    phase: Phase,
    stack: u32,
    step: Option<u64>,
}

/// One frame of a stack, its names resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FrameView {
    pub(crate) file: String,
    pub(crate) function: String,
    pub(crate) line: u32,
}

/// The definitions a process sent, bounded per kind by
/// [`Bounds::definitions`] and, for string bytes, [`Bounds::string_bytes`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Definitions {
    strings: HashMap<u32, Str>,
    string_bytes: usize,
    frames: HashMap<u32, (u32, u32, u32)>,
    stacks: HashMap<u32, (u32, u32)>,
    contexts: HashMap<u32, ContextDef>,
    /// Definitions not kept: beyond a bound, or malformed.
    dropped: u64,
}

impl Definitions {
    fn drop_one(&mut self) {
        self.dropped = self.dropped.saturating_add(1);
    }

    /// Definitions not kept (a bound, or a malformed record).
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
    /// Keeps the definition `kind` carries (a string chunk, frame, stack or
    /// context); `false` for every other kind of event.
    pub(crate) fn apply(&mut self, b: &Bounds, kind: &EventKind) -> bool {
        match *kind {
            EventKind::StringChunk {
                id,
                len,
                offset,
                ref bytes,
            } => self.string_chunk(b, id, len, offset, bytes),
            EventKind::Frame {
                id,
                file,
                function,
                line,
            } => self.frame(b, id, file, function, line),
            EventKind::Stack { id, frame, parent } => self.stack(b, id, frame, parent),
            EventKind::Context {
                id,
                module,
                phase,
                stack,
                step,
            } => self.context(b, id, module, phase, stack, step),
            _ => return false,
        }
        true
    }

    /// A chunk of string `id` (`len` bytes in all) at `offset`.
    pub(crate) fn string_chunk(
        &mut self,
        b: &Bounds,
        id: u32,
        len: u32,
        offset: u32,
        chunk: &[u8; 32],
    ) {
        let valid = id != 0
            && len <= MAX_STRING
            && offset % 32 == 0
            && (offset < len || (offset == 0 && len == 0));
        if !valid {
            return self.drop_one();
        }
        if !self.strings.contains_key(&id) {
            if self.strings.len() >= b.definitions
                || self.string_bytes.saturating_add(len as usize) > b.string_bytes
            {
                return self.drop_one();
            }
            self.string_bytes += len as usize;
            // Chunks beyond the string's end count as had.
            let have = (!0u128).checked_shl(len.div_ceil(32)).unwrap_or(0);
            self.strings.insert(
                id,
                Str::Partial {
                    len,
                    bytes: vec![0; len as usize].into_boxed_slice(),
                    have,
                },
            );
        }
        let Some(s) = self.strings.get_mut(&id) else {
            return;
        };
        let Str::Partial {
            len: want,
            bytes,
            have,
        } = s
        else {
            return; // a repeat of a known string
        };
        if *want != len {
            return self.drop_one(); // ids are never reused: a bad record
        }
        let start = offset as usize;
        let end = (start + 32).min(len as usize);
        bytes[start..end].copy_from_slice(&chunk[..end - start]);
        if len > 0 {
            *have |= 1u128 << (offset / 32);
        }
        if *have == !0u128 {
            let text = printable(&String::from_utf8_lossy(bytes));
            *s = Str::Done(text.into_boxed_str());
        }
    }

    fn insert<V>(map: &mut HashMap<u32, V>, b: &Bounds, id: u32, v: V) -> bool {
        if id == 0 || (!map.contains_key(&id) && map.len() >= b.definitions) {
            return false;
        }
        map.entry(id).or_insert(v); // a definition never changes
        true
    }

    pub(crate) fn frame(&mut self, b: &Bounds, id: u32, file: u32, function: u32, line: u32) {
        if !Self::insert(&mut self.frames, b, id, (file, function, line)) {
            self.drop_one();
        }
    }

    pub(crate) fn stack(&mut self, b: &Bounds, id: u32, frame: u32, parent: u32) {
        if !Self::insert(&mut self.stacks, b, id, (frame, parent)) {
            self.drop_one();
        }
    }

    pub(crate) fn context(
        &mut self,
        b: &Bounds,
        id: u32,
        module: u32,
        phase: Phase,
        stack: u32,
        step: Option<u64>,
    ) {
        let def = ContextDef {
            module,
            phase,
            stack,
            step,
        };
        if id > CtxTag::MAX_CONTEXT || !Self::insert(&mut self.contexts, b, id, def) {
            self.drop_one();
        }
    }

    /// String `id` as shown: its text, or `string #id` while unknown.
    pub(crate) fn string(&self, id: u32) -> String {
        match self.strings.get(&id) {
            Some(Str::Done(s)) => s.to_string(),
            _ => format!("string #{id}"),
        }
    }

    /// [`Self::string`] without a copy when the text is known.
    pub(crate) fn string_cow(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.strings.get(&id) {
            Some(Str::Done(s)) => std::borrow::Cow::Borrowed(s),
            _ => std::borrow::Cow::Owned(format!("string #{id}")),
        }
    }

    /// The phase and step (when keyed by step) of context `id`, cheaply.
    pub(crate) fn phase_step(&self, id: u32) -> (PhaseKey, Option<u64>) {
        self.contexts
            .get(&id)
            .map_or((PhaseKey::Unknown, None), |c| {
                (PhaseKey::of(c.phase), c.step)
            })
    }

    /// Context `id` resolved for a view.
    pub(crate) fn context_view(&self, id: u32) -> ContextView {
        let Some(c) = self.contexts.get(&id) else {
            return ContextView {
                id,
                module: if id == 0 {
                    String::new()
                } else {
                    format!("context #{id}")
                },
                phase: PhaseKey::Unknown,
                step: None,
                stack: Vec::new(),
            };
        };
        ContextView {
            id,
            module: if c.module == 0 {
                String::new()
            } else {
                self.string(c.module)
            },
            phase: PhaseKey::of(c.phase),
            step: c.step,
            stack: self.stack_lines(c.stack),
        }
    }

    /// Stack `id`, innermost frame first, as `file:line function` lines
    /// (cut at [`MAX_STACK_FRAMES`]; an unknown id ends the chain with
    /// `stack #id`).
    pub(crate) fn stack_lines(&self, mut id: u32) -> Vec<String> {
        let mut out = Vec::new();
        while id != 0 && out.len() < MAX_STACK_FRAMES {
            let Some(&(frame, parent)) = self.stacks.get(&id) else {
                out.push(format!("stack #{id}"));
                break;
            };
            out.push(match self.frames.get(&frame) {
                Some(&(file, function, line)) => {
                    format!("{}:{line} {}", self.string(file), self.string(function))
                }
                None => format!("frame #{frame}"),
            });
            id = parent;
        }
        out
    }

    /// The frames of context `id`'s stack, innermost first, names resolved
    /// (cut at [`MAX_STACK_FRAMES`]; ends at an id not defined): what
    /// `export` writes as a snapshot's `frames`.
    pub(crate) fn context_frames(&self, id: u32) -> Vec<FrameView> {
        let mut out = Vec::new();
        let mut id = self.contexts.get(&id).map_or(0, |c| c.stack);
        while id != 0 && out.len() < MAX_STACK_FRAMES {
            let Some(&(frame, parent)) = self.stacks.get(&id) else {
                break;
            };
            let Some(&(file, function, line)) = self.frames.get(&frame) else {
                break;
            };
            out.push(FrameView {
                file: self.string(file),
                function: self.string(function),
                line,
            });
            id = parent;
        }
        out
    }

    /// Heap bytes held (estimate).
    pub(crate) fn memory_bytes(&self) -> usize {
        const ENTRY: usize = 48; // hash map slot and control overhead
        self.strings.len() * (ENTRY + std::mem::size_of::<Str>())
            + self.string_bytes
            + (self.frames.len() + self.stacks.len()) * (ENTRY + 16)
            + self.contexts.len() * (ENTRY + std::mem::size_of::<ContextDef>())
    }
}

/// The step the step tags resolve against: the latest step boundary of the
/// one source a reader counts (FORMAT.md, MARKER: the user's markers, else
/// the first optimizer's, else inferred ones).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StepClock {
    /// (rank of the source counted, its optimizer number) and its step.
    source: Option<(u8, u32)>,
    step: Option<u64>,
}

impl StepClock {
    /// A step boundary; returns whether the current step changed.
    pub(crate) fn on_marker(&mut self, source: MarkSource, value: u64) -> bool {
        let key = match source {
            MarkSource::Unknown | MarkSource::User => (3, 0),
            // Lower optimizer numbers rank higher.
            MarkSource::OptimizerStep { optimizer } => (2, u32::MAX - optimizer.max(1)),
            MarkSource::Inferred => (1, 0),
            MarkSource::Run => {
                let before = self.step;
                self.step = Some(0);
                return before != self.step;
            }
            MarkSource::Other(_) | MarkSource::MemoryLimit { .. } => return false,
        };
        if self.source.is_some_and(|s| key < s) {
            return false;
        }
        self.source = Some(key);
        let before = self.step;
        self.step = Some(value);
        before != self.step
    }

    /// The current step (None before the first boundary).
    pub(crate) fn step(&self) -> Option<u64> {
        self.step
    }
}

/// Live bytes of one module path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleBytes {
    /// The module's dotted path; empty for allocations outside every
    /// module (or untagged ones; `null` in JSON); `context #N` /
    /// `string #N` while the definition has not arrived.
    #[serde(with = "crate::model::origin::module_json")]
    pub module: String,
    /// Allocated bytes of live blocks made in this module.
    pub bytes: u64,
    pub blocks: u64,
}

/// Live bytes of one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseBytes {
    pub phase: PhaseKey,
    pub bytes: u64,
    pub blocks: u64,
}

/// Live bytes of one module in one role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleBytes {
    #[serde(with = "crate::model::origin::module_json")]
    pub module: String,
    pub role: Role,
    pub bytes: u64,
    pub blocks: u64,
}

/// Live bytes of one role, over all modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleTotal {
    pub role: Role,
    pub bytes: u64,
    pub blocks: u64,
}

/// A context a live block refers to, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextView {
    pub id: u32,
    #[serde(with = "crate::model::origin::module_json")]
    pub module: String,
    pub phase: PhaseKey,
    /// The step, when the producer keys this context by step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// The stack captured when the context was entered, innermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// Who holds a process's live (allocated) memory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Attribution {
    /// The current step the step tags resolve against.
    pub step: Option<u64>,
    /// Live bytes by module path, most bytes first. The rows add up to the
    /// block map's allocated bytes. A block a role list names counts under
    /// the module holding the tensor, others under their context's.
    pub by_module: Vec<ModuleBytes>,
    /// Live bytes by phase, in [`PhaseKey::ALL`] order (phases with no
    /// live block left out).
    pub by_phase: Vec<PhaseBytes>,
    /// Live bytes by module and role (`model::roles`), most bytes first.
    /// A block a role list names counts under the module holding the
    /// tensor (FSDP2's shards, made outside the module's code, too).
    pub by_role: Vec<RoleBytes>,
    /// Live bytes by role, in [`Role::ALL`] order (roles with no live
    /// block left out).
    pub roles: Vec<RoleTotal>,
    /// How the producer's role lists stand (none: roles by lifetime only).
    pub role_lists: RoleLists,
    /// The contexts the live blocks refer to (a block's `origin.context`),
    /// by id.
    pub contexts: Vec<ContextView>,
    /// The producer's own drop counts for attribution (DROPPED records:
    /// context ids, stacks, strings, definitions, block tags), latest count
    /// by what.
    pub producer_dropped: BTreeMap<String, u64>,
}

impl Attribution {
    /// Whether any live block carries a context.
    pub fn tagged(&self) -> bool {
        self.contexts.iter().any(|c| c.id != 0)
    }

    /// The context of a block (`origin.context`), resolved.
    pub fn context(&self, id: u32) -> Option<&ContextView> {
        self.contexts
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.contexts[i])
    }

    /// The module path of context `id` ("" outside every module, or not
    /// known).
    pub fn module_of(&self, id: u32) -> &str {
        self.context(id).map_or("", |c| c.module.as_str())
    }

    /// The phase of context `id`.
    pub fn phase_of(&self, id: u32) -> PhaseKey {
        self.context(id).map_or(PhaseKey::Unknown, |c| c.phase)
    }

    #[cfg(test)]
    /// The code location of context `id`: the innermost frame of its
    /// captured stack (None: no stack captured).
    pub(crate) fn location_of(&self, id: u32) -> Option<&str> {
        self.context(id)
            .and_then(|c| c.stack.first())
            .map(String::as_str)
    }
}

/// The name of a producer drop kind in [`Attribution::producer_dropped`].
pub(crate) fn drop_name(w: DropWhat) -> Option<&'static str> {
    Some(match w {
        DropWhat::Records => return None, // not attribution's
        DropWhat::ContextIds => "context_ids",
        DropWhat::Stacks => "stacks",
        DropWhat::Strings => "strings_cut",
        DropWhat::Definitions => "definitions_not_resent",
        DropWhat::BlockTags => "block_tags",
        DropWhat::Roles => "roles",
        DropWhat::Outside => return None, // the outside accounting's
        DropWhat::Other(_) => "other",
    })
}

/// The key live bytes are summed under: the block's context, its role,
/// and the module paths of the role list entries that named it (string
/// ids, sorted; empty: the context's module).
pub(crate) type GroupKey = (u32, Role, Vec<u32>);

/// The attribution view from live bytes by group.
pub(crate) fn attribution(
    defs: &Definitions,
    step: Option<u64>,
    groups: &HashMap<GroupKey, (u64, u64)>,
    producer_dropped: &BTreeMap<String, u64>,
    role_lists: RoleLists,
) -> Attribution {
    let ids: BTreeSet<u32> = groups.keys().map(|k| k.0).collect();
    let contexts: Vec<ContextView> = ids.iter().map(|&id| defs.context_view(id)).collect();
    let ctx = |id: u32| {
        let i = contexts.binary_search_by_key(&id, |c| c.id).ok();
        i.map(|i| &contexts[i])
    };
    let mut modules: HashMap<String, (u64, u64)> = HashMap::new();
    let mut phases: BTreeMap<PhaseKey, (u64, u64)> = BTreeMap::new();
    let mut roles: HashMap<(String, Role), (u64, u64)> = HashMap::new();
    let mut totals: BTreeMap<Role, (u64, u64)> = BTreeMap::new();
    for ((id, role, held), &(bytes, blocks)) in groups {
        let c = ctx(*id);
        let module = if held.is_empty() {
            c.map_or(String::new(), |c| c.module.clone())
        } else {
            let paths: Vec<String> = held.iter().map(|&m| defs.string(m)).collect();
            shared_path(paths.iter().map(String::as_str))
        };
        let phase = c.map_or(PhaseKey::Unknown, |c| c.phase);
        for e in [
            phases.entry(phase).or_default(),
            totals.entry(*role).or_default(),
            roles.entry((module.clone(), *role)).or_default(),
            modules.entry(module).or_default(),
        ] {
            e.0 = e.0.saturating_add(bytes);
            e.1 += blocks;
        }
    }
    let mut by_module: Vec<ModuleBytes> = modules
        .into_iter()
        .map(|(module, (bytes, blocks))| ModuleBytes {
            module,
            bytes,
            blocks,
        })
        .collect();
    by_module.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| natural_cmp(&a.module, &b.module))
    });
    let mut by_role: Vec<RoleBytes> = roles
        .into_iter()
        .map(|((module, role), (bytes, blocks))| RoleBytes {
            module,
            role,
            bytes,
            blocks,
        })
        .collect();
    by_role.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| natural_cmp(&a.module, &b.module))
            .then_with(|| a.role.cmp(&b.role))
    });
    Attribution {
        step,
        by_module,
        by_phase: phases
            .into_iter()
            .map(|(phase, (bytes, blocks))| PhaseBytes {
                phase,
                bytes,
                blocks,
            })
            .collect(),
        by_role,
        roles: totals
            .into_iter()
            .map(|(role, (bytes, blocks))| RoleTotal {
                role,
                bytes,
                blocks,
            })
            .collect(),
        role_lists,
        contexts,
        producer_dropped: producer_dropped.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_assemble_from_chunks_in_any_order() {
        let b = Bounds::default();
        let mut d = Definitions::default();
        let text = "transformer.h.3.attn.c_proj.dropout.extra"; // 41 bytes: 2 chunks
        let chunk = |off: usize| {
            let mut c = [0u8; 32];
            let end = (off + 32).min(text.len());
            c[..end - off].copy_from_slice(&text.as_bytes()[off..end]);
            c
        };
        d.string_chunk(&b, 7, text.len() as u32, 32, &chunk(32));
        assert_eq!(d.string(7), "string #7");
        d.string_chunk(&b, 7, text.len() as u32, 0, &chunk(0));
        assert_eq!(d.string(7), text);
        // A repeat is idempotent; a conflicting length is counted.
        d.string_chunk(&b, 7, text.len() as u32, 0, &chunk(0));
        assert_eq!(d.dropped(), 0);
        // Malformed: unaligned offset, beyond the length, too long.
        d.string_chunk(&b, 8, 10, 3, &[0; 32]);
        d.string_chunk(&b, 8, 10, 32, &[0; 32]);
        d.string_chunk(&b, 8, MAX_STRING + 1, 0, &[0; 32]);
        assert_eq!(d.dropped(), 3);
        // An empty string and a control character made printable.
        d.string_chunk(&b, 9, 0, 0, &[0; 32]);
        assert_eq!(d.string(9), "");
        let mut esc = [0u8; 32];
        esc[..3].copy_from_slice(b"a\x1bb");
        d.string_chunk(&b, 10, 3, 0, &esc);
        assert_eq!(d.string(10), "a\u{fffd}b");
    }

    #[test]
    fn tables_are_bounded_and_overflow_is_counted() {
        let b = Bounds {
            definitions: 2,
            string_bytes: 40,
            ..Bounds::default()
        };
        let mut d = Definitions::default();
        for id in 1..=4 {
            d.context(&b, id, 0, Phase::Forward, 0, None);
            d.frame(&b, id, 1, 2, 3);
            d.stack(&b, id, 1, 0);
        }
        assert_eq!(d.dropped(), 6);
        // Redefining a kept id is not an overflow.
        d.context(&b, 1, 0, Phase::Backward, 0, None);
        assert_eq!(d.dropped(), 6);
        assert_eq!(d.context_view(1).phase, PhaseKey::Forward);
        // String bytes: 33 fit, 8 more do not.
        d.string_chunk(&b, 1, 33, 0, &[b'a'; 32]);
        d.string_chunk(&b, 2, 8, 0, &[b'b'; 32]);
        assert_eq!(d.dropped(), 7);
        // Context ids are 24 bits.
        d.context(
            &Bounds::default(),
            CtxTag::MAX_CONTEXT + 1,
            0,
            Phase::Forward,
            0,
            None,
        );
        assert_eq!(d.dropped(), 8);
    }

    #[test]
    fn contexts_resolve_modules_and_stacks() {
        let b = Bounds::default();
        let mut d = Definitions::default();
        let mut s = |id, t: &str| {
            let mut c = [0u8; 32];
            c[..t.len()].copy_from_slice(t.as_bytes());
            d.string_chunk(&b, id, t.len() as u32, 0, &c);
        };
        s(1, "model.layers.0");
        s(2, "train.py");
        s(3, "main");
        d.frame(&b, 1, 2, 3, 42);
        d.stack(&b, 1, 1, 0);
        d.stack(&b, 2, 1, 1);
        d.stack(&b, 3, 1, 3); // loops on itself: cut at the bound
        d.context(&b, 5, 1, Phase::Backward, 2, None);
        d.context(&b, 6, 9, Phase::Other(7), 3, Some(4));
        let v = d.context_view(5);
        assert_eq!(v.module, "model.layers.0");
        assert_eq!(v.phase, PhaseKey::Backward);
        assert_eq!(v.stack, vec!["train.py:42 main"; 2]);
        let v = d.context_view(6);
        assert_eq!(
            (v.module.as_str(), v.phase, v.step),
            ("string #9", PhaseKey::Other, Some(4))
        );
        assert_eq!(v.stack.len(), MAX_STACK_FRAMES);
        assert_eq!(d.context_view(77).module, "context #77");
        assert_eq!(d.context_view(0).module, "");
    }

    #[test]
    fn the_step_clock_counts_one_source() {
        let mut c = StepClock::default();
        assert_eq!(c.step(), None);
        assert!(c.on_marker(MarkSource::OptimizerStep { optimizer: 2 }, 5));
        assert!(c.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, 7));
        // The second optimizer no longer counts, nor inferred boundaries.
        assert!(!c.on_marker(MarkSource::OptimizerStep { optimizer: 2 }, 6));
        assert!(!c.on_marker(MarkSource::Inferred, 100));
        assert_eq!(c.step(), Some(7));
        // The user's markers win.
        c.on_marker(MarkSource::User, 3);
        c.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, 8);
        assert_eq!(c.step(), Some(3));
        c.on_marker(MarkSource::Run, 0);
        assert_eq!(c.step(), Some(0));
        c.on_marker(MarkSource::Other(9), 50);
        assert_eq!(c.step(), Some(0));
    }
}
