//! What `vramscope export` writes into a snapshot file beyond PyTorch's
//! own keys, read back, so that `open` and `diff` show an export as
//! `replay` shows its recording: the same steps, leak verdict and
//! attribution (`write` says how each is written).
//!
//! - Each context frame (key `vramscope` = `context`: module path, phase,
//!   step) with the frames captured before it becomes a CONTEXT of the
//!   model, its module path, frames and stack defined as a producer
//!   defines them; each trace entry and block whose stack ends in one is
//!   tagged with it and its step, as the producer tagged the allocation.
//! - Each marker annotation (key `vramscope` = `mark`) becomes the MARKER
//!   it was, placed before the trace entry it came before.
//! - A live block's role frame (key `vramscope` = `role`) naming a role a
//!   role list gives (parameter, buffer, gradient, optimizer state) makes
//!   an entry of the role lists `inputs` sends; the other roles come, as
//!   they came, from the blocks' lifetimes.
//!
//! A file with none of these (PyTorch's own, an older export) gives
//! nothing: it is shown as before. What is read is bounded as the model
//! bounds what a producer defines (`Bounds`): contexts, frames, stacks and
//! strings beyond those are left untagged; marks and roles are bounded by
//! the file's own size.

use std::collections::HashMap;

use crate::model::Bounds;
use vramscope_wire::event::{CtxTag, EventKind, Held, MarkSource, Phase};

use super::file::{Frame, SnapshotFile};
use super::write::{CONTEXT, MARK, NO_MODULE, OURS, ROLE, ROLE_PREFIX, STEP};

/// The most bytes of one string a producer may define (FORMAT.md).
const MAX_STRING: usize = 4096;

/// A marker read back: where it goes and what it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// Before the trace entry `before` of `device` (at or past the end of
    /// that trace: after its last entry).
    pub device: u16,
    pub before: usize,
    pub value: u64,
    pub source: MarkSource,
}

/// A role list entry read back from a live block's role frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) device: u16,
    pub(crate) addr: u64,
    /// The bytes the tensor asked for (the block's request).
    pub(crate) bytes: u64,
    pub(crate) held: Held,
    /// The module path string holding it (0: none).
    pub(crate) module: u32,
}

/// What an export adds to a snapshot file.
#[derive(Debug, Default)]
pub(crate) struct Ours {
    /// The definitions (strings, frames, stacks, contexts), in the order
    /// a producer would send them.
    pub(crate) defs: Vec<EventKind>,
    /// The context tag of what each stack of the file was written for.
    tags: HashMap<u32, CtxTag>,
    /// The role each stack of the file names, and the module holding it.
    roles: HashMap<u32, (Held, u32)>,
    /// The markers, in the file's order.
    pub(crate) marks: Vec<Mark>,
    /// The live blocks of the file's state that a role list named.
    pub(crate) named: Vec<Named>,
}

/// The definitions being made, within the model's bounds.
struct Defs<'a> {
    bounds: Bounds,
    out: &'a mut Vec<EventKind>,
    strings: HashMap<String, u32>,
    string_bytes: usize,
    frames: HashMap<(u32, u32, u32), u32>,
    stacks: HashMap<(u32, u32), u32>,
    contexts: HashMap<(u32, u8, u32), u32>,
}

impl Defs<'_> {
    /// The id of string `s` (0 for the empty string, and past the bounds).
    fn string(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0;
        }
        let mut end = s.len().min(MAX_STRING);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let s = &s[..end];
        if let Some(&id) = self.strings.get(s) {
            return id;
        }
        if self.strings.len() >= self.bounds.definitions
            || self.string_bytes + s.len() > self.bounds.string_bytes
        {
            return 0;
        }
        let id = self.strings.len() as u32 + 1;
        self.string_bytes += s.len();
        self.strings.insert(s.to_string(), id);
        for (i, chunk) in s.as_bytes().chunks(32).enumerate() {
            let mut bytes = [0u8; 32];
            bytes[..chunk.len()].copy_from_slice(chunk);
            self.out.push(EventKind::StringChunk {
                id,
                len: s.len() as u32,
                offset: i as u32 * 32,
                bytes,
            });
        }
        id
    }

    /// The id of a frame (0 past the bounds).
    fn frame(&mut self, f: &Frame) -> u32 {
        let file = self.string(&f.filename);
        let function = self.string(&f.name);
        let line = u32::try_from(f.line.max(0)).unwrap_or(u32::MAX);
        let key = (file, function, line);
        if let Some(&id) = self.frames.get(&key) {
            return id;
        }
        if self.frames.len() >= self.bounds.definitions {
            return 0;
        }
        let id = self.frames.len() as u32 + 1;
        self.frames.insert(key, id);
        self.out.push(EventKind::Frame {
            id,
            file,
            function,
            line,
        });
        id
    }

    /// The id of the stack of `frames` (innermost first; 0: none).
    fn stack(&mut self, frames: &[&Frame]) -> u32 {
        let mut parent = 0;
        for f in frames.iter().rev() {
            let frame = self.frame(f);
            if frame == 0 {
                return 0;
            }
            let key = (frame, parent);
            parent = match self.stacks.get(&key) {
                Some(&id) => id,
                None if self.stacks.len() >= self.bounds.definitions => return 0,
                None => {
                    let id = self.stacks.len() as u32 + 1;
                    self.stacks.insert(key, id);
                    self.out.push(EventKind::Stack { id, frame, parent });
                    id
                }
            };
        }
        parent
    }

    /// The id of the context of `module`, `phase` and `stack` (0 past the
    /// bounds).
    fn context(&mut self, module: u32, phase: Phase, stack: u32) -> u32 {
        let code = match phase {
            Phase::NotGiven => 0,
            Phase::Forward => 1,
            Phase::Backward => 2,
            Phase::Optimizer => 3,
            Phase::Other(c) => c.max(4),
        };
        let key = (module, code, stack);
        if let Some(&id) = self.contexts.get(&key) {
            return id;
        }
        if self.contexts.len() >= self.bounds.definitions.min(CtxTag::MAX_CONTEXT as usize) {
            return 0;
        }
        let id = self.contexts.len() as u32 + 1;
        self.contexts.insert(key, id);
        self.out.push(EventKind::Context {
            id,
            module,
            phase,
            stack,
            step: None,
        });
        id
    }
}

/// The value of key `k` among a frame's or an annotation's other keys.
fn key<'a>(extra: &'a [(String, String)], k: &str) -> Option<&'a str> {
    extra.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

fn phase_of(name: &str) -> Phase {
    match name {
        "forward" => Phase::Forward,
        "backward" => Phase::Backward,
        "optimizer" => Phase::Optimizer,
        "other" => Phase::Other(4),
        _ => Phase::NotGiven,
    }
}

fn held_of(name: &str) -> Option<Held> {
    Some(match name.strip_prefix(ROLE_PREFIX)? {
        "parameter" => Held::Parameter,
        "buffer" => Held::Buffer,
        "gradient" => Held::Gradient,
        "optimizer_state" => Held::OptimizerState,
        _ => return None,
    })
}

fn source_of(text: &str) -> Option<MarkSource> {
    let mut parts = text.split(':');
    Some(match (parts.next()?, parts.next(), parts.next()) {
        ("user", None, None) => MarkSource::User,
        ("unknown", None, None) => MarkSource::Unknown,
        ("inferred", None, None) => MarkSource::Inferred,
        ("optimizer", Some(n), None) => MarkSource::OptimizerStep {
            optimizer: n.parse().ok()?,
        },
        ("limit", Some(d), Some(w)) => MarkSource::MemoryLimit {
            device: d.parse().ok()?,
            whole_device: match w {
                "whole" => true,
                "fraction" => false,
                _ => return None,
            },
        },
        ("other", Some(c), None) => MarkSource::Other(c.parse().ok()?),
        _ => return None,
    })
}

impl Ours {
    /// What `file` holds of an export's own; `None` when nothing.
    pub(crate) fn read(file: &SnapshotFile) -> Option<Ours> {
        let marks: Vec<Mark> = (file.annotations.iter())
            .filter(|a| key(&a.fields, OURS) == Some(MARK))
            .filter_map(|a| {
                Some(Mark {
                    device: u16::try_from(a.device?).ok()?,
                    before: key(&a.fields, "trace_index")?.parse().ok()?,
                    value: key(&a.fields, "value")?.parse().ok()?,
                    source: source_of(key(&a.fields, "source")?)?,
                })
            })
            .collect();
        let ours_frames = file.frames.iter().any(|f| key(&f.extra, OURS).is_some());
        if marks.is_empty() && !ours_frames {
            return None;
        }
        let mut out = Ours {
            marks,
            ..Ours::default()
        };
        let mut defs = Defs {
            bounds: Bounds::default(),
            out: &mut out.defs,
            strings: HashMap::new(),
            string_bytes: 0,
            frames: HashMap::new(),
            stacks: HashMap::new(),
            contexts: HashMap::new(),
        };
        // Every stack the file's blocks and trace entries name, once.
        let used = (file.segments.iter())
            .flat_map(|s| s.blocks.iter().map(|b| b.stack))
            .chain(file.traces.iter().flatten().map(|e| e.stack))
            .flatten();
        let mut done = std::collections::HashSet::new();
        for id in used {
            if !done.insert(id) {
                continue;
            }
            let frames: Vec<&Frame> = (file.stacks.get(id).unwrap_or_default().iter())
                .filter_map(|&f| file.frames.get(f as usize))
                .collect();
            let mut captured: Vec<&Frame> = Vec::new();
            let mut context: Option<&Frame> = None;
            let mut role: Option<&Frame> = None;
            for f in frames {
                match key(&f.extra, OURS) {
                    Some(CONTEXT) => context = Some(f),
                    Some(ROLE) => role = Some(f),
                    _ if context.is_none() => captured.push(f),
                    _ => {}
                }
            }
            if let Some(c) = context {
                let module = if c.filename == NO_MODULE {
                    0
                } else {
                    defs.string(&c.filename)
                };
                let stack = defs.stack(&captured);
                let ctx = defs.context(module, phase_of(&c.name), stack);
                let step: Option<u64> = key(&c.extra, STEP).and_then(|s| s.parse().ok());
                if ctx != 0 {
                    out.tags.insert(
                        id,
                        CtxTag {
                            context: ctx,
                            step_tag: step.map_or(0, CtxTag::step_tag_of),
                        },
                    );
                }
            }
            if let Some((r, held)) = role.and_then(|r| Some((r, held_of(&r.name)?))) {
                let module = defs.string(&r.filename);
                out.roles.insert(id, (held, module));
            }
        }
        for s in &file.segments {
            for b in &s.blocks {
                if b.state != vramscope_wire::event::BlockState::Allocated {
                    continue;
                }
                if let Some(&(held, module)) = b.stack.and_then(|id| out.roles.get(&id)) {
                    out.named.push(Named {
                        device: s.device,
                        addr: b.address,
                        bytes: if b.requested_size > 0 {
                            b.requested_size
                        } else {
                            b.size
                        },
                        held,
                        module,
                    });
                }
            }
        }
        Some(out)
    }

    /// The context tag of what the stack `stack` was written for.
    pub(crate) fn tag(&self, stack: Option<u32>) -> CtxTag {
        stack
            .and_then(|s| self.tags.get(&s))
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapfile::inputs::{inputs, Plan};
    use crate::snapfile::{Annotation, Block, Segment};
    use vramscope_wire::event::BlockState;

    /// A hostile export: `blocks` live blocks each named a parameter by its
    /// role frame, and `marks` step markers, none changing what is live.
    fn many(blocks: u64, marks: usize) -> SnapshotFile {
        let mut file = SnapshotFile {
            traces: vec![Vec::new()],
            ..SnapshotFile::default()
        };
        file.frames.push(Frame {
            filename: "model.w".into(),
            line: 0,
            name: format!("{ROLE_PREFIX}parameter"),
            extra: vec![(OURS.into(), ROLE.into())],
        });
        let stack = file.stacks.push(&[0]);
        file.segments.push(Segment {
            device: 0,
            address: 1 << 30,
            total_size: blocks * 512,
            allocated_size: blocks * 512,
            active_size: blocks * 512,
            requested_size: blocks * 512,
            stream: 0,
            large: true,
            pool: Default::default(),
            expandable: false,
            stack: None,
            blocks: (0..blocks)
                .map(|i| Block {
                    address: (1 << 30) + i * 512,
                    size: 512,
                    requested_size: 512,
                    state: BlockState::Allocated,
                    stack: Some(stack),
                })
                .collect(),
        });
        file.annotations = (0..marks)
            .map(|i| Annotation {
                device: Some(0),
                time_us: Some(i as i64),
                fields: vec![
                    (OURS.into(), MARK.into()),
                    ("value".into(), i.to_string()),
                    ("source".into(), "user".into()),
                    ("trace_index".into(), "0".into()),
                ],
            })
            .collect();
        file
    }

    fn role_records(file: &SnapshotFile) -> (usize, usize, usize) {
        let (mut lists, mut records, mut marks) = (0, 0, 0);
        for (_, input) in inputs(file, "x", Plan::default()) {
            if let crate::input::Input::Events(b) = input {
                for e in &b.events {
                    match e.kind {
                        EventKind::Roles { .. } => lists += 1,
                        EventKind::Role { .. } => records += 1,
                        EventKind::Marker { .. } => marks += 1,
                        _ => {}
                    }
                }
            }
        }
        (lists, records, marks)
    }

    /// Every marker and every named block is read, and the role lists
    /// sent stay within a bound whatever the product of the two: the last
    /// list, with every named block, after the file's state.
    #[test]
    fn item8_many_markers_and_named_blocks_cost_bounded_role_lists() {
        let file = many(1000, 10);
        assert_eq!(role_records(&file), (1, 1000, 10));
        let start = std::time::Instant::now();
        let file = many(50_000, 20_000);
        let (lists, records, marks) = role_records(&file);
        assert_eq!((lists, records, marks), (1, 50_000, 20_000));
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }
}
