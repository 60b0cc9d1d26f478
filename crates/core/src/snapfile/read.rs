//! The reader: a snapshot file's pickle walked into a [`SnapshotFile`],
//! the big lists' elements taken while parsing, every value checked for
//! its shape and charged against the bound as it is made.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

use super::file::{
    head, Action, Annotation, Block, EntryMeta, Frame, HostMemory, Segment, SnapError,
    SnapshotFile, TraceEntry, BLOCK_COST, ENTRY_COST, FRAME_COST, MAX_BLOCKS, MAX_FRAME_EXTRA,
    MAX_SEGMENTS, MAX_TRACE, SEGMENT_COST, STACK_COST,
};
use crate::pickle::{self, Doc, Id, Value};
use vramscope_wire::event::{BlockState, PoolId};

/// Reads the snapshot file at `path`.
///
/// The file is parsed once with the big lists' elements (segments, trace
/// entries) taken out of the parse as soon as each is complete
/// ([`pickle::parse_taking`]): what stays in memory is the snapshot, not a
/// copy of the pickle's object graph. Should anything in that reading not
/// fit (a damaged or hand-made file), the file is read again as plain
/// values, which decide what is read or what is wrong.
pub fn read(path: &Path) -> Result<SnapshotFile, SnapError> {
    let io = io_error(path);
    let len = std::fs::metadata(path).map_err(io)?.len();
    read_from(path, len, || std::fs::File::open(path))
}

/// [`read`] of a file held in memory (read once from a pipe): errors name
/// `path` and the byte offset, as a file's do.
pub fn read_bytes(path: &Path, bytes: &[u8]) -> Result<SnapshotFile, SnapError> {
    read_from(path, bytes.len() as u64, || Ok(bytes))
}

/// An I/O error reading `path`, as [`SnapError::Io`].
fn io_error(path: &Path) -> impl Fn(std::io::Error) -> SnapError + Copy + '_ {
    move |source| SnapError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// [`read`] of the `len` bytes `open` gives (each time it is called, from
/// their start), named `path`.
fn read_from<R: std::io::Read>(
    path: &Path,
    len: u64,
    open: impl Fn() -> std::io::Result<R>,
) -> Result<SnapshotFile, SnapError> {
    let io = io_error(path);
    let taking = {
        let file = open().map_err(io)?;
        let mut st = State::streaming(len);
        match pickle::parse_taking(file, len, &mut st) {
            Ok(doc) => st.walk(&doc).ok(),
            Err(_) => None,
        }
    };
    // What that reading made is gone before the plain one begins.
    match taking {
        Some(read) => Ok(read),
        None => read_plain(path, len, open),
    }
}

/// [`read`] without taking anything while parsing: the whole pickle as
/// plain values first.
fn read_plain<R: std::io::Read>(
    path: &Path,
    len: u64,
    open: impl Fn() -> std::io::Result<R>,
) -> Result<SnapshotFile, SnapError> {
    let io = io_error(path);
    let doc = pickle::parse(open().map_err(io)?, len).map_err(|source| SnapError::Pickle {
        path: path.to_path_buf(),
        source,
    })?;
    if let Ok(read) = State::plain(len).walk(&doc) {
        return Ok(read);
    }
    drop(doc);
    // The shape is wrong: read again, keeping offsets, to say where.
    let doc = pickle::parse_with_offsets(open().map_err(io)?, len).map_err(|source| {
        SnapError::Pickle {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let (at, why, node) = match State::plain(len).walk(&doc) {
        Ok(read) => return Ok(read),
        Err(e) => e,
    };
    Err(SnapError::Shape {
        path: path.to_path_buf(),
        offset: doc.offset(node).unwrap_or(0),
        at,
        why,
    })
}

/// Reads a snapshot held in memory (tests, the fuzz target); errors carry
/// no path. The same two ways as [`read`].
pub fn read_slice(bytes: &[u8]) -> Result<SnapshotFile, String> {
    read_slice_taking(bytes).or_else(|_| read_slice_plain(bytes))
}

/// [`read_slice`] taking values while parsing, and nothing else (no
/// second reading when that does not fit): what the tests and the fuzz
/// target hold against [`read_slice_plain`].
pub fn read_slice_taking(bytes: &[u8]) -> Result<SnapshotFile, String> {
    let mut st = State::streaming(bytes.len() as u64);
    let doc =
        pickle::parse_taking(bytes, bytes.len() as u64, &mut st).map_err(|e| e.to_string())?;
    st.walk(&doc)
        .map_err(|(at, why, _)| format!("at {at}: {why}"))
}

/// [`read_slice`] as plain values only (nothing taken while parsing): what
/// the fuzz target and the tests compare the usual reading with.
pub fn read_slice_plain(bytes: &[u8]) -> Result<SnapshotFile, String> {
    let doc = pickle::parse_slice(bytes).map_err(|e| e.to_string())?;
    State::plain(bytes.len() as u64)
        .walk(&doc)
        .map_err(|(at, why, _)| format!("at {at}: {why}"))
}

/// Where in the file's structure, what is wrong there, and the value.
type ShapeError = (String, String, Id);

/// A hasher for value ids (small integers from this process, not from the
/// file's bytes): a multiply, much cheaper than SipHash for the millions of
/// frame references of a large file.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type IdMap = HashMap<Id, u32, BuildHasherDefault<IdHasher>>;

/// What a value taken while parsing became: the token that stands for it
/// in the parse (kind in the low 3 bits, index above, below 2^31).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Segment(u32),
    Entry(u32),
    /// A trace entry whose action this build does not know (skipped).
    Unknown,
    Stack(u32),
    Frame(u32),
}

impl Token {
    fn encode(self) -> Option<u32> {
        let (kind, i) = match self {
            Token::Segment(i) => (0, i),
            Token::Entry(i) => (1, i),
            Token::Unknown => (2, 0),
            Token::Stack(i) => (3, i),
            Token::Frame(i) => (4, i),
        };
        (i < 1 << 28).then_some(i << 3 | kind)
    }

    fn decode(t: u32) -> Option<Token> {
        let i = t >> 3;
        Some(match t & 7 {
            0 => Token::Segment(i),
            1 => Token::Entry(i),
            2 => Token::Unknown,
            3 => Token::Stack(i),
            4 => Token::Frame(i),
            _ => return None,
        })
    }
}

/// What reading has made so far: the snapshot being built, and the frames
/// and stacks interned by the pickle value that holds them. The taker
/// during the parse and the walk after it share it.
#[derive(Default)]
struct State {
    out: SnapshotFile,
    frames: IdMap,
    stacks: IdMap,
    /// Keys of `frames`/`stacks`/`reads` (when taking while parsing): the
    /// values of a batch cut from the parse are forgotten, by id.
    recent: Option<BTreeSet<Id>>,
    /// While parsing: each container read by the taker, with how many
    /// elements it had then. Containers only grow, so one that has more at
    /// the end was changed after it was read (a list still being filled
    /// named by an entry, a dict changed through the memo): the plain
    /// reading decides.
    reads: IdMap,
    parsing: bool,
    /// Blocks read, counted per reference.
    blocks: usize,
    /// Segments and trace entries taken while parsing, by token.
    segments: Vec<Segment>,
    entries: Vec<TraceEntry>,
    scratch: Vec<u32>,
    /// The file's size, and the bound on memory it gives
    /// ([`pickle::bound`]).
    len: u64,
    bound: usize,
    /// What the parse holds besides this state, as last told.
    parse_bytes: usize,
    /// Bytes charged for what reading made, each value once per reference
    /// (see the module's notes).
    charged: usize,
}

impl State {
    /// A state for taking values while parsing a file of `len` bytes.
    fn streaming(len: u64) -> State {
        State {
            recent: Some(BTreeSet::new()),
            parsing: true,
            ..State::plain(len)
        }
    }

    /// A state for walking the plain values of a file of `len` bytes.
    fn plain(len: u64) -> State {
        State {
            len,
            bound: pickle::bound(len),
            ..State::default()
        }
    }

    /// Charges `bytes` about to be taken by what reading makes; refused
    /// (why, in words) when they would not fit the bound with what the
    /// parse and this state hold.
    fn charge(&mut self, bytes: usize) -> Result<(), String> {
        use pickle::size_text;
        let need = (self.parse_bytes + pickle::Take::memory_bytes(self)).saturating_add(bytes);
        if need > self.bound {
            return Err(format!(
                "reading it would take more than {} of memory, a value the memo shares counted once per reference: over the bound of {} for a file of {} (4 × its size + 64 MiB)",
                size_text(need as u64),
                size_text(self.bound as u64),
                size_text(self.len)
            ));
        }
        self.charged += bytes;
        Ok(())
    }

    /// The snapshot the parsed values (and those taken) hold.
    fn walk(mut self, doc: &Doc) -> Result<SnapshotFile, ShapeError> {
        self.parsing = false;
        self.parse_bytes = doc.memory_bytes();
        if let Some((&id, _)) = (self.reads.iter()).find(|(&id, &n)| doc.elements(id) != n as usize)
        {
            return Err(shape(
                id,
                "a value read while parsing",
                "changed after it was read",
            ));
        }
        Reader { doc, st: &mut self }.root()?;
        if self.recent.is_some() {
            // Taking while parsing interns in the file's order, which a
            // damaged file may make differ from the walk's; and what was
            // taken under a key the walk does not read left stacks that
            // nothing names.
            self.out.renumber();
        }
        Ok(self.out)
    }

    fn remember(&mut self, id: Id) {
        if let Some(r) = &mut self.recent {
            r.insert(id);
        }
    }

    /// Container `id` read while parsing (see `reads`).
    fn read(&mut self, doc: &Doc, id: Id) {
        if self.parsing && id & pickle::TAKEN == 0 && !self.reads.contains_key(&id) {
            self.reads.insert(id, doc.elements(id) as u32);
            self.remember(id);
        }
    }
}

impl pickle::Take for State {
    fn take(&mut self, doc: &Doc, item: Id, parse_bytes: usize) -> Option<u32> {
        self.parse_bytes = parse_bytes;
        let has = |k| doc.get(item, k).is_some();
        let token = if has("action") {
            if self.entries.len() >= MAX_TRACE {
                return None;
            }
            match (Reader { doc, st: self }).trace_entry(item, "").ok()? {
                Some(e) => {
                    self.entries.push(e);
                    Token::Entry(self.entries.len() as u32 - 1)
                }
                None => Token::Unknown,
            }
        } else if has("total_size") {
            if self.segments.len() >= MAX_SEGMENTS {
                return None;
            }
            let seg = (Reader { doc, st: self }).segment(item, "").ok()?;
            self.segments.push(seg);
            Token::Segment(self.segments.len() as u32 - 1)
        } else {
            return None;
        };
        token.encode()
    }

    fn token_of(&self, id: Id) -> Option<u32> {
        match (self.stacks.get(&id), self.frames.get(&id)) {
            (Some(&s), _) => Token::Stack(s).encode(),
            (_, Some(&f)) => Token::Frame(f).encode(),
            _ => None,
        }
    }

    fn forget(&mut self, from: Id) {
        let Some(recent) = &mut self.recent else {
            return;
        };
        for id in recent.split_off(&from) {
            self.frames.remove(&id);
            self.stacks.remove(&id);
            self.reads.remove(&id);
        }
    }

    /// What was charged, and the maps of what was read (without a walk:
    /// asked after every few opcodes).
    fn memory_bytes(&self) -> usize {
        self.charged
            + (self.frames.capacity() + self.stacks.capacity() + self.reads.capacity()) * 16
            + self.recent.as_ref().map_or(0, |r| r.len() * 32)
    }
}

/// Reads values of the parse into the state.
struct Reader<'a, 's> {
    doc: &'a Doc,
    st: &'s mut State,
}

fn shape(node: Id, at: impl Into<String>, why: impl Into<String>) -> ShapeError {
    (at.into(), why.into(), node)
}

/// The values a list's tokens name, when the list is exactly all of
/// them, in order (as `pickle.dump` writes a list read while parsing):
/// `Some` of the count of `Unknown` tokens; the caller then moves them.
fn all_taken(doc: &Doc, list: &[Id], total: usize, kind: fn(u32) -> Token) -> Option<u64> {
    let mut next = 0u32;
    let mut unknown = 0;
    for &id in list {
        match doc.value(id) {
            Value::Taken(t) => match Token::decode(t)? {
                Token::Unknown => unknown += 1,
                tok if tok == kind(next) => next += 1,
                _ => return None,
            },
            _ => return None,
        }
    }
    (next as usize == total).then_some(unknown)
}

impl<'a> Reader<'a, '_> {
    fn root(&mut self) -> Result<(), ShapeError> {
        let d = self.doc;
        let root = d.root();
        let segments = match d.value(root) {
            Value::List(_) => {
                self.st.out.format = "a list of segments (torch.cuda.memory_snapshot())".into();
                root
            }
            Value::Dict(_) => d.get(root, "segments").ok_or_else(|| {
                let keys: Vec<_> = d
                    .as_dict(root)
                    .unwrap_or_default()
                    .iter()
                    .take(8)
                    .map(|(k, _)| d.as_str(*k).map_or("?".into(), for_message))
                    .collect();
                shape(
                    root,
                    "the top",
                    format!(
                        "not a PyTorch memory snapshot: a dict without 'segments' (its keys: {})",
                        keys.join(", ")
                    ),
                )
            })?,
            _ => {
                return Err(shape(
                    root,
                    "the top",
                    format!(
                        "not a PyTorch memory snapshot: the pickle holds a {}, not a dict",
                        d.type_name(root)
                    ),
                ))
            }
        };
        let list = self.seq(segments, "segments")?;
        if list.len() > MAX_SEGMENTS {
            return Err(shape(
                segments,
                "segments",
                format!("{} segments, more than {MAX_SEGMENTS}", list.len()),
            ));
        }
        let total = self.st.segments.len();
        if all_taken(d, list, total, Token::Segment) == Some(0) {
            self.st.out.segments = std::mem::take(&mut self.st.segments);
        } else {
            for (i, &s) in list.iter().enumerate() {
                let at = || format!("segments[{i}]");
                let seg = match d.value(s) {
                    Value::Taken(t) => match Token::decode(t) {
                        Some(Token::Segment(k)) if (k as usize) < total => {
                            // A copy, for a segment the list names again.
                            let blocks = self.st.segments[k as usize].blocks.len();
                            self.charge(s, &at(), SEGMENT_COST)?;
                            self.blocks_read(blocks, s, &at())?;
                            self.st.segments[k as usize].clone()
                        }
                        _ => return Err(taken_where(s, at(), "a segment")),
                    },
                    _ => self.segment(s, &at())?,
                };
                self.st.out.segments.push(seg);
            }
        }
        if matches!(d.value(root), Value::Dict(_)) {
            self.rest(root)?;
        }
        Ok(())
    }

    /// Everything besides the segments.
    fn rest(&mut self, root: Id) -> Result<(), ShapeError> {
        let d = self.doc;
        let mut traced = 0usize;
        if let Some(traces) = d.get(root, "device_traces") {
            let devices = self.seq(traces, "device_traces")?;
            if devices.len() > 1024 {
                return Err(shape(
                    traces,
                    "device_traces",
                    format!("{} devices, more than 1024", devices.len()),
                ));
            }
            for (dev, &t) in devices.iter().enumerate() {
                let at = format!("device_traces[{dev}]");
                let entries = self.seq(t, &at)?;
                traced = traced.saturating_add(entries.len());
                if traced > MAX_TRACE {
                    return Err(shape(t, at, format!("more than {MAX_TRACE} trace entries")));
                }
                let total = self.st.entries.len();
                if let Some(unknown) = all_taken(d, entries, total, Token::Entry) {
                    self.st.out.unknown_actions += unknown;
                    let out = std::mem::take(&mut self.st.entries);
                    self.st.out.traces.push(out);
                    continue;
                }
                let mut out = Vec::with_capacity(entries.len());
                for (i, &e) in entries.iter().enumerate() {
                    let entry = match d.value(e) {
                        Value::Taken(t) => match Token::decode(t) {
                            Some(Token::Entry(k)) if (k as usize) < total => {
                                self.charge(e, &format!("{at}[{i}]"), ENTRY_COST)?;
                                Some(self.st.entries[k as usize].clone())
                            }
                            Some(Token::Unknown) => None,
                            _ => return Err(taken_where(e, format!("{at}[{i}]"), "a trace entry")),
                        },
                        _ => self.trace_entry(e, &format!("{at}[{i}]"))?,
                    };
                    match entry {
                        Some(e) => out.push(e),
                        None => self.st.out.unknown_actions += 1,
                    }
                }
                self.st.out.traces.push(out);
            }
        }
        if let Some(s) = d.get(root, "allocator_settings") {
            let at = "allocator_settings";
            for (k, v) in self.dict(s, at)? {
                self.charge(*k, at, std::mem::size_of::<(String, String)>())?;
                let mut key = String::new();
                self.push_text(*k, at, &mut key, d.as_str(*k).unwrap_or("?"))?;
                let mut text = String::new();
                self.text(*v, at, 0, &mut text)?;
                self.st.out.allocator_settings.push((key, text));
            }
        }
        if let Some(a) = d.get(root, "external_annotations") {
            self.annotations(a)?;
        }
        self.host(root)?;
        let has = |k| d.get(root, k).is_some();
        let timed = self
            .st
            .out
            .traces
            .iter()
            .flatten()
            .any(|e| e.time_us.is_some());
        let any_meta = |f: fn(&EntryMeta) -> bool| {
            (self.st.out.traces.iter().flatten()).any(|e| e.meta.as_deref().is_some_and(f))
        };
        self.st.out.format = match () {
            _ if has("host_segments") || has("host_traces") => "torch ≥ 2.14 (host_segments)",
            _ if any_meta(|m| m.internal_metadata.is_some()) => "torch ≥ 2.15 (internal_metadata)",
            _ if any_meta(|m| m.pool.is_some()) => "torch ≥ 2.12 (trace pool_id)",
            _ if has("external_annotations") => "torch ≥ 2.6 (external_annotations)",
            _ if has("allocator_settings") => "torch ≥ 2.4 (allocator_settings)",
            _ if timed => "torch ≥ 2.2 (trace times)",
            _ if has("device_traces") => "torch ≥ 2.1",
            _ => "segments only",
        }
        .into();
        Ok(())
    }

    /// `external_annotations`: a list of dicts (anything else in it is
    /// skipped, as a key this build does not know would be).
    fn annotations(&mut self, list: Id) -> Result<(), ShapeError> {
        let d = self.doc;
        let at = "external_annotations";
        let entries = self.seq(list, at)?;
        if entries.len() > MAX_TRACE {
            return Err(shape(
                list,
                at,
                format!("more than {MAX_TRACE} annotations"),
            ));
        }
        for (i, &a) in entries.iter().enumerate() {
            let at = &format!("{at}[{i}]");
            if let Value::Taken(_) = d.value(a) {
                // Read already as something else (a hand-made file): the
                // plain reading decides.
                return Err(taken_where(a, at.clone(), "an annotation"));
            }
            let Some(kv) = d.as_dict(a) else { continue };
            self.st.read(d, a);
            self.charge(a, at, std::mem::size_of::<Annotation>())?;
            let mut out = Annotation {
                device: self.int_opt(a, "device", at).ok().flatten(),
                time_us: self.int_opt(a, "time_us", at).ok().flatten(),
                fields: Vec::new(),
            };
            for (k, v) in kv.iter().take(16) {
                let key = d.as_str(*k).unwrap_or("?");
                if key == "device" || key == "time_us" {
                    continue;
                }
                self.charge(*k, at, std::mem::size_of::<(String, String)>())?;
                let mut name = String::new();
                self.push_text(*k, at, &mut name, key)?;
                let mut text = String::new();
                self.text(*v, at, 1, &mut text)?;
                out.fields.push((name, text));
            }
            self.st.out.annotations.push(out);
        }
        Ok(())
    }

    /// `host_segments` and `host_traces` (pinned host memory), counted
    /// and summed; values of other shapes in them are skipped.
    fn host(&mut self, root: Id) -> Result<(), ShapeError> {
        let d = self.doc;
        let (segs, traces) = (d.get(root, "host_segments"), d.get(root, "host_traces"));
        if segs.is_none() && traces.is_none() {
            return Ok(());
        }
        let mut host = HostMemory::default();
        for &s in segs.and_then(|s| d.as_seq(s)).unwrap_or_default() {
            let (total, allocated) = match d.value(s) {
                Value::Taken(t) => {
                    let seg = match Token::decode(t) {
                        Some(Token::Segment(k)) => self.st.segments.get(k as usize),
                        _ => None,
                    };
                    // Read already as something else (a hand-made file):
                    // the plain reading decides.
                    let seg = seg
                        .ok_or_else(|| taken_where(s, "host_segments".into(), "a host segment"))?;
                    (seg.total_size, seg.allocated_size)
                }
                Value::Dict(_) => {
                    let int = |k| d.get(s, k).and_then(|v| d.as_int(v)).unwrap_or(0).max(0);
                    let total = d.get(s, "total_size").or(d.get(s, "size"));
                    let total = total.and_then(|v| d.as_int(v)).unwrap_or(0).max(0);
                    (total as u64, int("allocated_size") as u64)
                }
                _ => continue,
            };
            host.segments += 1;
            host.reserved = host.reserved.saturating_add(total);
            host.allocated = host.allocated.saturating_add(allocated);
        }
        // A list of entries, or (as `device_traces`) a list of such lists.
        for &t in traces.and_then(|t| d.as_seq(t)).unwrap_or_default() {
            host.trace_entries += match d.as_seq(t) {
                Some(inner) => inner.len() as u64,
                None => 1,
            };
        }
        self.st.out.host = Some(host);
        Ok(())
    }

    /// String `key` of dict `id`, made printable and charged; `None` when
    /// absent, not a string, empty or one of `none` (torch's "nothing
    /// set").
    fn opt_text(
        &mut self,
        id: Id,
        key: &str,
        at: &str,
        none: &[&str],
    ) -> Result<Option<String>, ShapeError> {
        let Some(s) = self
            .str_of(id, key)
            .filter(|s| !s.is_empty() && !none.contains(s))
        else {
            return Ok(None);
        };
        let mut out = String::new();
        self.push_text(id, at, &mut out, s)?;
        Ok(Some(out))
    }

    /// A trace entry's fields of later releases ([`EntryMeta`]), boxed
    /// and charged when it has any.
    fn entry_meta(&mut self, id: Id, at: &str) -> Result<Option<Box<EntryMeta>>, ShapeError> {
        let d = self.doc;
        let pool = match d.get(id, "pool_id") {
            Some(p) => {
                let v = d.as_seq(p).unwrap_or_default();
                let get = |i: usize| v.get(i).and_then(|x| d.as_int(*x)).unwrap_or(0) as u64;
                Some(PoolId(get(0), get(1)))
            }
            None => None,
        };
        // The default pool, as torch names it on every entry: absent.
        let pool = pool.filter(|p| *p != PoolId(0, 0));
        let meta = EntryMeta {
            user_metadata: self.opt_text(id, "user_metadata", at, &[])?,
            compile_context: self.opt_text(id, "compile_context", at, &["N/A"])?,
            internal_metadata: self.opt_text(id, "internal_metadata", at, &[])?,
            pool,
        };
        if meta == EntryMeta::default() {
            return Ok(None);
        }
        self.charge(id, at, std::mem::size_of::<EntryMeta>())?;
        Ok(Some(Box::new(meta)))
    }

    fn seq(&mut self, id: Id, at: &str) -> Result<&'a [Id], ShapeError> {
        self.st.read(self.doc, id);
        self.doc.as_seq(id).ok_or_else(|| {
            shape(
                id,
                at,
                format!("a {} where a list was expected", self.doc.type_name(id)),
            )
        })
    }

    fn dict(&mut self, id: Id, at: &str) -> Result<&'a [(Id, Id)], ShapeError> {
        self.st.read(self.doc, id);
        self.doc.as_dict(id).ok_or_else(|| {
            shape(
                id,
                at,
                format!("a {} where a dict was expected", self.doc.type_name(id)),
            )
        })
    }

    /// Integer `key` of dict `id`; `None` when absent.
    fn int_opt(&self, id: Id, key: &str, at: &str) -> Result<Option<i64>, ShapeError> {
        match self.doc.get(id, key) {
            None => Ok(None),
            Some(v) => match self.doc.value(v) {
                Value::None => Ok(None),
                _ => self.doc.as_int(v).map(Some).ok_or_else(|| {
                    shape(
                        v,
                        at,
                        format!("'{key}' is a {}, not an int", self.doc.type_name(v)),
                    )
                }),
            },
        }
    }

    fn int(&self, id: Id, key: &str, at: &str) -> Result<i64, ShapeError> {
        self.int_opt(id, key, at)?
            .ok_or_else(|| shape(id, at, format!("no '{key}'")))
    }

    /// A size or address: an int that is not negative.
    fn uint(&self, id: Id, key: &str, at: &str) -> Result<u64, ShapeError> {
        let v = self.int(id, key, at)?;
        u64::try_from(v).map_err(|_| shape(id, at, format!("'{key}' is negative ({v})")))
    }

    fn str_of(&self, id: Id, key: &str) -> Option<&'a str> {
        self.doc.get(id, key).and_then(|v| self.doc.as_str(v))
    }

    /// Charges `bytes` for value `id` (at `at`): see [`State::charge`].
    fn charge(&mut self, id: Id, at: &str, bytes: usize) -> Result<(), ShapeError> {
        self.st.charge(bytes).map_err(|why| shape(id, at, why))
    }

    /// Blocks of a segment read (once per reference to it): counted
    /// against [`MAX_BLOCKS`] and charged.
    fn blocks_read(&mut self, n: usize, id: Id, at: &str) -> Result<(), ShapeError> {
        self.st.blocks = self.st.blocks.saturating_add(n);
        if self.st.blocks > MAX_BLOCKS {
            return Err(shape(id, at, format!("more than {MAX_BLOCKS} blocks")));
        }
        self.charge(id, at, n.saturating_mul(BLOCK_COST))
    }

    /// Appends string `s` (of value `id`, at `at`) to `out`, made
    /// printable, charged for what it adds (the most it could add, 3 bytes
    /// a byte where a control character becomes U+FFFD, before; then less
    /// what it did not).
    fn push_text(&mut self, id: Id, at: &str, out: &mut String, s: &str) -> Result<(), ShapeError> {
        let most = s.len().saturating_mul(3);
        self.charge(id, at, most)?;
        let before = out.len();
        vramscope_text::push_printable(out, s);
        self.st.charged -= most - (out.len() - before);
        Ok(())
    }

    /// A value as one line of text (settings), nested at most a few deep
    /// and 16 items wide, appended to `out` (each piece charged as it is
    /// added: a value the memo shares is charged each time it is shown).
    fn text(&mut self, id: Id, at: &str, depth: usize, out: &mut String) -> Result<(), ShapeError> {
        let scalar = match self.doc.value(id) {
            Value::None => "None".to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Bytes(b) => format!("<{} bytes>", b.len()),
            Value::Str(s) => return self.push_text(id, at, out, s),
            // A dict, shown as "…" this deep.
            _ if depth >= 2 => "…".to_string(),
            Value::Taken(_) => return Err(taken_where(id, at.into(), "text")),
            Value::List(v) | Value::Tuple(v) => {
                self.push_text(id, at, out, "[")?;
                for (i, x) in v.iter().take(16).enumerate() {
                    if i > 0 {
                        self.push_text(id, at, out, ", ")?;
                    }
                    self.text(*x, at, depth + 1, out)?;
                }
                return self.push_text(id, at, out, "]");
            }
            Value::Dict(v) => {
                self.push_text(id, at, out, "{")?;
                for (i, (k, x)) in v.iter().take(16).enumerate() {
                    if i > 0 {
                        self.push_text(id, at, out, ", ")?;
                    }
                    self.text(*k, at, depth + 1, out)?;
                    self.push_text(id, at, out, ": ")?;
                    self.text(*x, at, depth + 1, out)?;
                }
                return self.push_text(id, at, out, "}");
            }
        };
        self.push_text(id, at, out, &scalar)
    }

    /// The stack of a value's `frames` (or, in 2.0's blocks, its last
    /// `history` entry's), interned; `None` when it has none.
    fn stack(&mut self, id: Id, at: &str) -> Result<Option<u32>, ShapeError> {
        let d = self.doc;
        let frames = match d.get(id, "frames") {
            Some(f) => f,
            None => {
                let Some(h) = d.get(id, "history") else {
                    return Ok(None);
                };
                self.st.read(d, h);
                let Some(&last) = d.as_seq(h).and_then(<[Id]>::last) else {
                    return Ok(None);
                };
                self.st.read(d, last);
                match d.get(last, "frames") {
                    Some(f) => f,
                    None => return Ok(None),
                }
            }
        };
        if let Value::Taken(t) = d.value(frames) {
            return match Token::decode(t) {
                Some(Token::Stack(s)) if (s as usize) < self.st.out.stacks.len() => Ok(Some(s)),
                _ => Err(taken_where(frames, format!("{at}['frames']"), "a list")),
            };
        }
        if let Some(&s) = self.st.stacks.get(&frames) {
            return Ok(Some(s));
        }
        self.st.read(d, frames);
        let list = d.as_seq(frames).ok_or_else(|| {
            shape(
                frames,
                format!("{at}['frames']"),
                format!("a {} where a list was expected", d.type_name(frames)),
            )
        })?;
        if list.is_empty() {
            return Ok(None);
        }
        let cost = STACK_COST.saturating_add(list.len().saturating_mul(4));
        self.charge(frames, &format!("{at}['frames']"), cost)?;
        let mut scratch = std::mem::take(&mut self.st.scratch);
        scratch.clear();
        for (i, &f) in list.iter().enumerate() {
            scratch.push(self.frame(f, at, i)?);
        }
        let n = self.st.out.stacks.push(&scratch);
        self.st.scratch = scratch;
        self.st.stacks.insert(frames, n);
        self.st.remember(frames);
        Ok(Some(n))
    }

    /// Frame `i` of the stack of `at`, interned.
    fn frame(&mut self, id: Id, at: &str, i: usize) -> Result<u32, ShapeError> {
        if let Value::Taken(t) = self.doc.value(id) {
            return match Token::decode(t) {
                Some(Token::Frame(f)) if (f as usize) < self.st.out.frames.len() => Ok(f),
                _ => Err(taken_where(id, format!("{at}['frames'][{i}]"), "a frame")),
            };
        }
        if let Some(&f) = self.st.frames.get(&id) {
            return Ok(f);
        }
        // Named only for a frame not seen before (a handful per file).
        let at = &format!("{at}['frames'][{i}]");
        self.dict(id, at)?;
        self.charge(id, at, FRAME_COST)?;
        let mut frame = Frame {
            line: self.int_opt(id, "line", at)?.unwrap_or(0),
            ..Frame::empty()
        };
        // Each frame its own copy: charged per frame that names a string.
        if let Some(s) = self.str_of(id, "filename") {
            self.push_text(id, at, &mut frame.filename, s)?;
        }
        if let Some(s) = self.str_of(id, "name") {
            self.push_text(id, at, &mut frame.name, s)?;
        }
        let known = ["filename", "line", "name"];
        let d = self.doc;
        let others = (d.as_dict(id).unwrap_or_default().iter())
            .filter(|(k, _)| !d.as_str(*k).is_some_and(|k| known.contains(&k)))
            .take(MAX_FRAME_EXTRA);
        for (k, v) in others {
            self.charge(*k, at, std::mem::size_of::<(String, String)>())?;
            let mut key = String::new();
            self.push_text(*k, at, &mut key, d.as_str(*k).unwrap_or("?"))?;
            let mut text = String::new();
            self.text(*v, at, 1, &mut text)?;
            frame.extra.push((key, text));
        }
        let n = self.st.out.frames.len() as u32;
        self.st.out.frames.push(frame);
        self.st.frames.insert(id, n);
        self.st.remember(id);
        Ok(n)
    }

    fn segment(&mut self, id: Id, at: &str) -> Result<Segment, ShapeError> {
        let d = self.doc;
        self.dict(id, at)?;
        self.charge(id, at, SEGMENT_COST)?;
        let address = self.uint(id, "address", at)?;
        let total_size = self.uint(id, "total_size", at)?;
        let device = self.int_opt(id, "device", at)?.unwrap_or(0);
        let device = u16::try_from(device)
            .ok()
            .filter(|&x| x < 1024)
            .ok_or_else(|| shape(id, at, format!("'device' {device} is not a device index")))?;
        let pool = match d.get(id, "segment_pool_id") {
            None => PoolId(0, 0),
            Some(p) => {
                let v = self.seq(p, &format!("{at}['segment_pool_id']"))?;
                let get = |i: usize| v.get(i).and_then(|x| d.as_int(*x)).unwrap_or(0) as u64;
                PoolId(get(0), get(1))
            }
        };
        let large = match self.str_of(id, "segment_type") {
            Some("small") => false,
            Some(_) => true,
            None => total_size > 2 << 20,
        };
        let stack = self.stack(id, at)?;
        let mut seg = Segment {
            device,
            address,
            total_size,
            allocated_size: self.int_opt(id, "allocated_size", at)?.unwrap_or(0).max(0) as u64,
            active_size: self.int_opt(id, "active_size", at)?.unwrap_or(0).max(0) as u64,
            requested_size: self.int_opt(id, "requested_size", at)?.unwrap_or(0).max(0) as u64,
            stream: self.int_opt(id, "stream", at)?.unwrap_or(0) as u64,
            large,
            pool,
            expandable: d
                .get(id, "is_expandable")
                .and_then(|v| d.as_bool(v))
                .unwrap_or(false),
            stack,
            blocks: Vec::new(),
        };
        let Some(blocks) = d.get(id, "blocks") else {
            return Ok(seg);
        };
        let list = self.seq(blocks, &format!("{at}['blocks']"))?;
        self.blocks_read(list.len(), blocks, at)?;
        seg.blocks.reserve_exact(list.len());
        let mut next = address;
        for (i, &b) in list.iter().enumerate() {
            let at = format!("{at}['blocks'][{i}]");
            self.dict(b, &at)?;
            let size = self.uint(b, "size", &at)?;
            let state = match self.str_of(b, "state") {
                Some("active_allocated") => BlockState::Allocated,
                Some("active_pending_free") => BlockState::PendingFree,
                Some("inactive") => BlockState::Inactive,
                Some(s) => {
                    return Err(shape(
                        b,
                        at,
                        format!("unknown block state '{}'", for_message(s)),
                    ))
                }
                None => return Err(shape(b, at, "no 'state'")),
            };
            // 2.0's blocks have no address: they tile the segment in order.
            let address = match self.int_opt(b, "address", &at)? {
                Some(a) => u64::try_from(a).map_err(|_| shape(b, &at, "'address' is negative"))?,
                None => next,
            };
            next = address.saturating_add(size);
            let requested = self
                .int_opt(b, "requested_size", &at)?
                .unwrap_or(size as i64);
            seg.blocks.push(Block {
                address,
                size,
                requested_size: requested.max(0) as u64,
                state,
                stack: self.stack(b, &at)?,
            });
        }
        Ok(seg)
    }

    fn trace_entry(&mut self, id: Id, at: &str) -> Result<Option<TraceEntry>, ShapeError> {
        self.dict(id, at)?;
        let Some(action) = self.str_of(id, "action") else {
            return Err(shape(id, at, "no 'action'"));
        };
        let Some(action) = Action::from_name(action) else {
            return Ok(None);
        };
        self.charge(id, at, ENTRY_COST)?;
        let addr = if action == Action::Oom {
            self.int_opt(id, "device_free", at)?
                .or(self.int_opt(id, "addr", at)?)
                .unwrap_or(0)
        } else {
            self.int_opt(id, "addr", at)?.unwrap_or(0)
        };
        Ok(Some(TraceEntry {
            action,
            addr: addr as u64,
            size: self.int_opt(id, "size", at)?.unwrap_or(0).max(0) as u64,
            stream: self.int_opt(id, "stream", at)?.unwrap_or(0) as u64,
            time_us: self.int_opt(id, "time_us", at)?,
            stack: self.stack(id, at)?,
            meta: self.entry_meta(id, at)?,
        }))
    }
}

/// A value taken while parsing where it does not belong (a hand-made
/// file: [`read`] then reads it again as plain values).
fn taken_where(id: Id, at: String, what: &str) -> ShapeError {
    shape(
        id,
        at,
        format!("a value read already, where {what} was expected"),
    )
}

/// A string of the file, for a message: printable, and its first 64 bytes
/// only (then `…`).
fn for_message(s: &str) -> String {
    let mut out = vramscope_text::printable(head(s, 64));
    if s.len() > 64 {
        out.push('…');
    }
    out
}

impl SnapshotFile {
    /// Numbers the stacks in the order the snapshot first names them
    /// (each segment, then its blocks; then the trace entries) and the
    /// frames in the order those stacks first name them, as the plain
    /// reading interns them; drops any that nothing names. In place: the
    /// frame indices are rewritten where they lie.
    fn renumber(&mut self) {
        const NEW: u32 = u32::MAX;
        let mut new_of = vec![NEW; self.stacks.len()];
        let mut order: Vec<u32> = Vec::new();
        let mut visit = |s: &mut Option<u32>| {
            if let Some(n) = s.and_then(|old| new_of.get_mut(old as usize)) {
                if *n == NEW {
                    *n = order.len() as u32;
                    order.push(s.unwrap_or(0));
                }
                *s = Some(*n);
            }
        };
        for seg in &mut self.segments {
            visit(&mut seg.stack);
            seg.blocks.iter_mut().for_each(|b| visit(&mut b.stack));
        }
        self.traces
            .iter_mut()
            .flatten()
            .for_each(|e| visit(&mut e.stack));
        let same = order.len() == self.stacks.runs.len()
            && order.iter().enumerate().all(|(i, &o)| i as u32 == o);
        if !same {
            let runs = &self.stacks.runs;
            self.stacks.runs = order.iter().map(|&o| runs[o as usize]).collect();
        }
        let mut new_of = vec![NEW; self.frames.len()];
        let mut order: Vec<u32> = Vec::new();
        for &(start, len) in &self.stacks.runs {
            for f in &mut self.stacks.frames[start as usize..(start + len) as usize] {
                let Some(n) = new_of.get_mut(*f as usize) else {
                    continue;
                };
                if *n == NEW {
                    *n = order.len() as u32;
                    order.push(*f);
                }
                *f = *n;
            }
        }
        let same = order.len() == self.frames.len()
            && order.iter().enumerate().all(|(i, &o)| i as u32 == o);
        if !same {
            let mut old = std::mem::take(&mut self.frames);
            self.frames = (order.iter())
                .map(|&o| std::mem::replace(&mut old[o as usize], Frame::empty()))
                .collect();
        }
    }
}
