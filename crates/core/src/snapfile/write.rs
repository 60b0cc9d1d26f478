//! Writing a [`SnapshotFile`] as the pickle PyTorch's tools read
//! (`torch.cuda.memory._memory_viz`, the browser viewer): the dict
//! `torch.cuda.memory._snapshot()` returns, in pickle protocol 4 as
//! `pickle.dump` writes it, every string, frame and stack written once and
//! referenced from the memo after.
//!
//! [`from_model`] builds the file from a process of the model (the state of
//! a recording at its end, and its events as the trace), with the frames
//! of the context each allocation was tagged with ([`Attributor`]).

use std::collections::HashMap;
use std::io::{self, Write};

use crate::model::attrib::{Definitions, Origin};
use crate::model::roles::Role;
use crate::model::Process;
use vramscope_wire::event::{BlockState, CtxTag, Event, EventKind, MarkSource, PoolId};

use super::file::{Action, Block, EntryMeta, Frame, Segment, SnapshotFile, TraceEntry};

/// Pickle opcodes this writer uses.
mod op {
    pub(crate) const PROTO: u8 = 0x80;
    pub(crate) const STOP: u8 = b'.';
    pub(crate) const MARK: u8 = b'(';
    pub(crate) const EMPTY_DICT: u8 = b'}';
    pub(crate) const EMPTY_LIST: u8 = b']';
    pub(crate) const SETITEMS: u8 = b'u';
    pub(crate) const APPENDS: u8 = b'e';
    pub(crate) const TUPLE2: u8 = 0x86;
    pub(crate) const NEWTRUE: u8 = 0x88;
    pub(crate) const NEWFALSE: u8 = 0x89;
    pub(crate) const BININT: u8 = b'J';
    pub(crate) const BININT1: u8 = b'K';
    pub(crate) const BININT2: u8 = b'M';
    pub(crate) const LONG1: u8 = 0x8a;
    pub(crate) const SHORT_BINUNICODE: u8 = 0x8c;
    pub(crate) const BINUNICODE: u8 = b'X';
    pub(crate) const MEMOIZE: u8 = 0x94;
    pub(crate) const BINGET: u8 = b'h';
    pub(crate) const LONG_BINGET: u8 = b'j';
}

struct Pickler<W> {
    out: W,
    memo: u32,
    strings: HashMap<String, u32>,
    frames: HashMap<u32, u32>,
    stacks: HashMap<u32, u32>,
}

impl<W: Write> Pickler<W> {
    fn b(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    fn memoize(&mut self) -> io::Result<u32> {
        self.b(&[op::MEMOIZE])?;
        self.memo += 1;
        Ok(self.memo - 1)
    }

    fn get(&mut self, i: u32) -> io::Result<()> {
        match u8::try_from(i) {
            Ok(i) => self.b(&[op::BINGET, i]),
            Err(_) => {
                self.b(&[op::LONG_BINGET])?;
                self.b(&i.to_le_bytes())
            }
        }
    }

    fn str(&mut self, s: &str) -> io::Result<()> {
        if let Some(&i) = self.strings.get(s) {
            return self.get(i);
        }
        match u8::try_from(s.len()) {
            Ok(n) => self.b(&[op::SHORT_BINUNICODE, n])?,
            Err(_) => {
                let n = u32::try_from(s.len()).map_err(io::Error::other)?;
                self.b(&[op::BINUNICODE])?;
                self.b(&n.to_le_bytes())?;
            }
        }
        self.b(s.as_bytes())?;
        let i = self.memoize()?;
        self.strings.insert(s.to_string(), i);
        Ok(())
    }

    fn int(&mut self, v: i64) -> io::Result<()> {
        if (0..=0xff).contains(&v) {
            self.b(&[op::BININT1, v as u8])
        } else if (0..=0xffff).contains(&v) {
            self.b(&[op::BININT2])?;
            self.b(&(v as u16).to_le_bytes())
        } else if let Ok(v) = i32::try_from(v) {
            self.b(&[op::BININT])?;
            self.b(&v.to_le_bytes())
        } else {
            // The shortest two's complement, as Python's encode_long.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.b(&[op::LONG1, n as u8])?;
            self.b(&bytes[..n])
        }
    }

    fn uint(&mut self, v: u64) -> io::Result<()> {
        self.int(i64::try_from(v).unwrap_or(i64::MAX))
    }

    /// A pool id, as torch writes it: a pair.
    fn pool(&mut self, pool: PoolId) -> io::Result<()> {
        self.uint(pool.0)?;
        self.uint(pool.1)?;
        self.b(&[op::TUPLE2])?;
        self.memoize().map(|_| ())
    }

    fn bool(&mut self, v: bool) -> io::Result<()> {
        self.b(&[if v { op::NEWTRUE } else { op::NEWFALSE }])
    }

    /// A dict: `EMPTY_DICT MEMOIZE MARK`, the caller's pairs, `SETITEMS`.
    fn dict(&mut self, f: impl FnOnce(&mut Self) -> io::Result<()>) -> io::Result<()> {
        self.b(&[op::EMPTY_DICT])?;
        self.memoize()?;
        self.b(&[op::MARK])?;
        f(self)?;
        self.b(&[op::SETITEMS])
    }

    /// A list of `items`, appended 1,000 at a time as Python does.
    fn list<T>(
        &mut self,
        items: &[T],
        mut f: impl FnMut(&mut Self, &T) -> io::Result<()>,
    ) -> io::Result<u32> {
        self.b(&[op::EMPTY_LIST])?;
        let me = self.memoize()?;
        for chunk in items.chunks(1000) {
            self.b(&[op::MARK])?;
            for x in chunk {
                f(self, x)?;
            }
            self.b(&[op::APPENDS])?;
        }
        Ok(me)
    }

    fn frames(&mut self, file: &SnapshotFile, stack: Option<u32>) -> io::Result<()> {
        self.str("frames")?;
        let Some(s) = stack else {
            return self.empty_frames();
        };
        if let Some(&i) = self.stacks.get(&s) {
            return self.get(i);
        }
        let frames = file.stacks.get(s).unwrap_or_default();
        let me = self.list(frames, |p, &f| {
            if let Some(&i) = p.frames.get(&f) {
                return p.get(i);
            }
            let Some(fr) = file.frames.get(f as usize) else {
                return p.dict(|_| Ok(()));
            };
            p.b(&[op::EMPTY_DICT])?;
            let me = p.memoize()?;
            p.b(&[op::MARK])?;
            p.str("name")?;
            p.str(&fr.name)?;
            p.str("filename")?;
            p.str(&fr.filename)?;
            p.str("line")?;
            p.int(fr.line)?;
            for (k, v) in &fr.extra {
                p.str(k)?;
                p.str(v)?;
            }
            p.b(&[op::SETITEMS])?;
            p.frames.insert(f, me);
            Ok(())
        })?;
        self.stacks.insert(s, me);
        Ok(())
    }

    fn empty_frames(&mut self) -> io::Result<()> {
        // PyTorch shares one empty list among everything without frames.
        if let Some(&i) = self.stacks.get(&u32::MAX) {
            return self.get(i);
        }
        let me = self.list::<u32>(&[], |_, _| Ok(()))?;
        self.stacks.insert(u32::MAX, me);
        Ok(())
    }

    fn block(&mut self, file: &SnapshotFile, b: &Block) -> io::Result<()> {
        self.dict(|p| {
            p.str("address")?;
            p.uint(b.address)?;
            p.str("size")?;
            p.uint(b.size)?;
            p.str("requested_size")?;
            p.uint(b.requested_size)?;
            p.str("state")?;
            p.str(match b.state {
                BlockState::Allocated => "active_allocated",
                BlockState::PendingFree => "active_pending_free",
                BlockState::Inactive => "inactive",
            })?;
            p.frames(file, b.stack)
        })
    }

    fn segment(&mut self, file: &SnapshotFile, s: &Segment) -> io::Result<()> {
        self.dict(|p| {
            p.str("device")?;
            p.int(s.device as i64)?;
            p.str("address")?;
            p.uint(s.address)?;
            p.str("total_size")?;
            p.uint(s.total_size)?;
            p.str("allocated_size")?;
            p.uint(s.allocated_size)?;
            p.str("active_size")?;
            p.uint(s.active_size)?;
            p.str("requested_size")?;
            p.uint(s.requested_size)?;
            p.str("stream")?;
            p.int(s.stream as i64)?;
            p.str("segment_type")?;
            p.str(if s.large { "large" } else { "small" })?;
            p.str("segment_pool_id")?;
            p.pool(s.pool)?;
            p.str("is_expandable")?;
            p.bool(s.expandable)?;
            p.frames(file, s.stack)?;
            p.str("blocks")?;
            p.list(&s.blocks, |p, b| p.block(file, b))?;
            Ok(())
        })
    }

    fn entry(&mut self, file: &SnapshotFile, e: &TraceEntry) -> io::Result<()> {
        self.dict(|p| {
            p.str("action")?;
            p.str(e.action.name())?;
            p.str(if e.action == Action::Oom {
                "device_free"
            } else {
                "addr"
            })?;
            // As read: the bits of PyTorch's int64.
            p.int(e.addr as i64)?;
            p.str("size")?;
            p.uint(e.size)?;
            p.str("stream")?;
            p.int(e.stream as i64)?;
            if let Some(t) = e.time_us {
                p.str("time_us")?;
                p.int(t)?;
            }
            // As torch ≥ 2.10 writes them: on every entry, "N/A" and ""
            // when nothing was set.
            let meta = e.meta.as_deref().cloned().unwrap_or_default();
            p.str("compile_context")?;
            p.str(meta.compile_context.as_deref().unwrap_or("N/A"))?;
            p.str("user_metadata")?;
            p.str(meta.user_metadata.as_deref().unwrap_or(""))?;
            if let Some(m) = &meta.internal_metadata {
                p.str("internal_metadata")?;
                p.str(m)?;
            }
            if let Some(pool) = meta.pool {
                p.str("pool_id")?;
                p.pool(pool)?;
            }
            p.frames(file, e.stack)
        })
    }
}

/// Writes `file` as a snapshot pickle.
pub fn write(file: &SnapshotFile, out: impl Write) -> io::Result<()> {
    let mut p = Pickler {
        out: io::BufWriter::new(out),
        memo: 0,
        strings: HashMap::new(),
        frames: HashMap::new(),
        stacks: HashMap::new(),
    };
    p.b(&[op::PROTO, 4])?;
    p.dict(|p| {
        p.str("segments")?;
        p.list(&file.segments, |p, s| p.segment(file, s))?;
        p.str("device_traces")?;
        p.list(&file.traces, |p, t| {
            p.list(t, |p, e| p.entry(file, e)).map(|_| ())
        })?;
        p.str("allocator_settings")?;
        p.dict(|p| {
            for (k, v) in &file.allocator_settings {
                p.str(k)?;
                p.str(v)?;
            }
            Ok(())
        })?;
        p.str("external_annotations")?;
        p.list(&file.annotations, |p, a| {
            p.dict(|p| {
                for (k, v) in &a.fields {
                    p.str(k)?;
                    p.str(v)?;
                }
                if let Some(d) = a.device {
                    p.str("device")?;
                    p.int(d)?;
                }
                if let Some(t) = a.time_us {
                    p.str("time_us")?;
                    p.int(t)?;
                }
                Ok(())
            })
        })
        .map(|_| ())
    })?;
    p.b(&[op::STOP])?;
    p.out.flush()
}

/// The key that marks a frame or an annotation vramscope wrote, and its
/// values: a context's frame, a live block's role frame, a marker.
pub(crate) const OURS: &str = "vramscope";
pub(crate) const CONTEXT: &str = "context";
pub(crate) const ROLE: &str = "role";
pub(crate) const MARK: &str = "mark";
/// A context frame's key for its step.
pub(crate) const STEP: &str = "step";
/// A role frame's name: this, then the role's (`role:parameter`).
pub(crate) const ROLE_PREFIX: &str = "role:";
/// A context frame's `filename` when the context names no module.
pub(crate) const NO_MODULE: &str = "(outside every module)";

/// The `frames` of what a context tagged, as PyTorch's viewer shows them:
/// the stack the producer captured in that context (innermost first, as
/// torch writes frames), then one frame naming the context itself:
/// `filename` its module path (`transformer.h.3.attn`, or
/// [`NO_MODULE`]), `name` its phase (`forward`, `backward`, `optimizer`,
/// `other`, `unknown`), `line` the step; its key `vramscope` is `context`
/// and its key `step` the step, when known, so that vramscope reads it
/// back (`snapfile::ours`; PyTorch's tools ignore keys they do not know,
/// as they ignore the FX keys). Last,
/// because the module's call holds the code that allocated: `_memory_viz`
/// shows a frame as `filename:line:name` and builds its flame graphs
/// outermost frame first, so memory is grouped by module first, then by
/// code. Frames and stacks are interned (one per distinct context and
/// step), and the writer writes each once.
pub(crate) struct Attributor<'a> {
    defs: &'a Definitions,
    stacks: HashMap<Origin, Option<u32>>,
    /// Blocks' stacks: their context's, then a frame naming their role.
    block_stacks: HashMap<(Origin, Role, Option<String>), Option<u32>>,
    frames: HashMap<Frame, u32>,
}

impl<'a> Attributor<'a> {
    pub(crate) fn new(defs: &'a Definitions) -> Self {
        Attributor {
            defs,
            stacks: HashMap::new(),
            block_stacks: HashMap::new(),
            frames: HashMap::new(),
        }
    }

    /// The stack of a live block: [`Attributor::stack`]'s frames, then one
    /// naming its role (`model::roles`): `filename` the module holding it
    /// (its role list's, else its context's), `name` `role:parameter`,
    /// `role:gradient`, ... So PyTorch's viewer groups by role, too.
    pub(crate) fn block_stack(
        &mut self,
        file: &mut SnapshotFile,
        origin: Origin,
        role: Role,
        held_by: Option<String>,
    ) -> Option<u32> {
        let key = (origin, role, held_by);
        if let Some(&s) = self.block_stacks.get(&key) {
            return s;
        }
        let mut ids: Vec<u32> = match self.stack(file, origin) {
            Some(s) => file.stacks.get(s).map(<[u32]>::to_vec).unwrap_or_default(),
            None => Vec::new(),
        };
        let module = match &key.2 {
            Some(m) => m.clone(),
            None => self.defs.context_view(origin.context).module,
        };
        let f = Frame {
            filename: module,
            line: 0,
            name: format!("{ROLE_PREFIX}{}", role.name()),
            extra: vec![(OURS.into(), ROLE.into())],
        };
        let next = file.frames.len() as u32;
        ids.push(*self.frames.entry(f.clone()).or_insert_with(|| {
            file.frames.push(f);
            next
        }));
        let s = Some(file.stacks.push(&ids));
        self.block_stacks.insert(key, s);
        s
    }

    /// The stack (in `file`) of what was tagged `origin`; `None` when it
    /// has no context, or a context with neither module nor stack.
    pub(crate) fn stack(&mut self, file: &mut SnapshotFile, origin: Origin) -> Option<u32> {
        if origin.context == 0 {
            return None;
        }
        if let Some(&s) = self.stacks.get(&origin) {
            return s;
        }
        let view = self.defs.context_view(origin.context);
        let mut frames: Vec<Frame> = (self.defs.context_frames(origin.context))
            .into_iter()
            .map(|f| Frame {
                filename: f.file,
                line: f.line as i64,
                name: f.function,
                extra: Vec::new(),
            })
            .collect();
        let step = origin.step.map(u64::from).or(view.step);
        let mut extra = vec![(OURS.into(), CONTEXT.into())];
        if let Some(s) = step {
            extra.push((STEP.into(), s.to_string()));
        }
        frames.push(Frame {
            filename: if view.module.is_empty() {
                NO_MODULE.into()
            } else {
                view.module
            },
            line: step.map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX)),
            name: view.phase.name().into(),
            extra,
        });
        let stack = (!frames.is_empty()).then(|| {
            let ids: Vec<u32> = frames
                .into_iter()
                .map(|f| {
                    let next = file.frames.len() as u32;
                    *self.frames.entry(f.clone()).or_insert_with(|| {
                        file.frames.push(f);
                        next
                    })
                })
                .collect();
            file.stacks.push(&ids)
        });
        self.stacks.insert(origin, stack);
        stack
    }
}

/// A snapshot of one process of the model: its state now, and `events`
/// (its allocator events, oldest first, each with the process's step when
/// it was read, which its step tag resolves against) as the trace, with
/// the frames of the contexts blocks and events were tagged with. Event
/// times are the recorder's monotonic nanoseconds: `epoch_us` is added to
/// them (in µs) to give the wall-clock times PyTorch writes.
pub fn from_model(
    process: &Process,
    events: &[(Event, Option<u64>)],
    marks: &[(usize, Event)],
    epoch_us: i64,
) -> SnapshotFile {
    let mut file = SnapshotFile {
        format: "written by vramscope export".into(),
        ..SnapshotFile::default()
    };
    let mut attr = Attributor::new(process.definitions());
    let matches = process.role_matches();
    for d in process.devices() {
        for s in d.segments() {
            let mut seg = Segment {
                device: d.device(),
                address: s.addr,
                total_size: s.size,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: s.stream,
                large: s.pool_kind == vramscope_wire::event::SegmentPool::Large,
                pool: s.pool,
                expandable: s.expandable,
                stack: None,
                blocks: Vec::new(),
            };
            for (addr, b) in d.blocks_of(s) {
                let stack = if b.state == BlockState::Allocated {
                    let v = process.block_view(&matches, d.device(), addr, b);
                    let role = v.role.unwrap_or(Role::Other);
                    let held_by = v.held_by.as_deref().map(str::to_string);
                    attr.block_stack(&mut file, b.origin, role, held_by)
                } else {
                    attr.stack(&mut file, b.origin)
                };
                match b.state {
                    BlockState::Allocated => {
                        seg.allocated_size += b.size;
                        seg.active_size += b.size;
                        seg.requested_size += b.requested;
                    }
                    BlockState::PendingFree => seg.active_size += b.size,
                    BlockState::Inactive => {}
                }
                seg.blocks.push(Block {
                    address: addr,
                    size: b.size,
                    requested_size: b.requested,
                    state: b.state,
                    stack,
                });
            }
            file.segments.push(seg);
        }
    }
    let mut marks = marks.iter().peekable();
    for (i, (e, step)) in events.iter().enumerate() {
        while let Some((_, m)) = marks.next_if(|(at, _)| *at <= i) {
            let device = e.kind.place().map_or(0, |p| p.device);
            annotate(&mut file, m, device, epoch_us);
        }
        let Some((device, mut entry, tag)) = trace_entry(e, epoch_us) else {
            continue;
        };
        entry.stack = attr.stack(&mut file, Origin::of(tag, *step));
        let d = device as usize;
        if d >= 64 {
            continue;
        }
        if file.traces.len() <= d {
            file.traces.resize_with(d + 1, Vec::new);
        }
        file.traces[d].push(entry);
    }
    let last = (events.last())
        .and_then(|(e, _)| e.kind.place())
        .map_or(0, |p| p.device);
    for (_, m) in marks {
        annotate(&mut file, m, last, epoch_us);
    }
    if file.traces.is_empty() {
        file.traces.push(Vec::new());
    }
    file
}

/// A marker (a step boundary, a memory limit) as an annotation, placed
/// before the next trace entry of `device`: `name` says what it is to
/// PyTorch's viewer (`step 12`), `vramscope` `mark`, `value`, `source`
/// (`user`, `optimizer:1`, `inferred`, `unknown`, `limit:0:whole`,
/// `limit:0:fraction`, `other:4`) and `trace_index` (the entries of that
/// device's trace before it) say what vramscope reads back.
fn annotate(file: &mut SnapshotFile, m: &Event, device: u16, epoch_us: i64) {
    let EventKind::Marker { value, source } = m.kind else {
        return;
    };
    let (name, source) = match source {
        MarkSource::Run => return,
        MarkSource::Unknown => (format!("step {value}"), "unknown".to_string()),
        MarkSource::User => (format!("step {value}"), "user".into()),
        MarkSource::OptimizerStep { optimizer } => {
            (format!("step {value}"), format!("optimizer:{optimizer}"))
        }
        MarkSource::Inferred => (format!("step {value}"), "inferred".into()),
        MarkSource::MemoryLimit {
            device,
            whole_device,
        } => (
            "memory limit".into(),
            format!(
                "limit:{device}:{}",
                if whole_device { "whole" } else { "fraction" }
            ),
        ),
        MarkSource::Other(c) => ("marker".into(), format!("other:{c}")),
    };
    let trace_index = file.traces.get(device as usize).map_or(0, Vec::len);
    file.annotations.push(super::Annotation {
        device: Some(i64::from(device)),
        time_us: Some(epoch_us.saturating_add((m.time_ns / 1000) as i64)),
        fields: vec![
            ("name".into(), name),
            ("stage".into(), "START".into()),
            (OURS.into(), MARK.into()),
            ("value".into(), value.to_string()),
            ("source".into(), source),
            ("trace_index".into(), trace_index.to_string()),
        ],
    });
}

/// The trace entry of an allocator event, with its device and context tag.
fn trace_entry(e: &Event, epoch_us: i64) -> Option<(u16, TraceEntry, CtxTag)> {
    let time_us = Some(epoch_us.saturating_add((e.time_ns / 1000) as i64));
    let (action, place, addr, size) = match e.kind {
        EventKind::Alloc { place, addr, size } => (Action::Alloc, place, addr, size),
        EventKind::FreeRequested { place, addr, size } => {
            (Action::FreeRequested, place, addr, size)
        }
        EventKind::FreeCompleted { place, addr, size } => {
            (Action::FreeCompleted, place, addr, size)
        }
        EventKind::SegmentAlloc { place, addr, size } => (Action::SegmentAlloc, place, addr, size),
        EventKind::SegmentFree { place, addr, size } => (Action::SegmentFree, place, addr, size),
        EventKind::SegmentMap { place, addr, size } => (Action::SegmentMap, place, addr, size),
        EventKind::SegmentUnmap { place, addr, size } => (Action::SegmentUnmap, place, addr, size),
        EventKind::Oom {
            place,
            device_free,
            request,
        } => (Action::Oom, place, device_free, request),
        _ => return None,
    };
    Some((
        place.device,
        TraceEntry {
            action,
            addr,
            size,
            stream: place.stream,
            time_us,
            stack: None,
            meta: (place.pool != PoolId(0, 0)).then(|| {
                Box::new(EntryMeta {
                    pool: Some(place.pool),
                    ..EntryMeta::default()
                })
            }),
        },
        place.ctx,
    ))
}
