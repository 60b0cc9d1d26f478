//! A restricted reader of Python pickles: exactly what PyTorch memory
//! snapshot files use (`torch.cuda.memory._dump_snapshot`, OOM-observer
//! dumps), and nothing else.
//!
//! The files are plain data written by Python's `pickle` (protocols 2 to
//! 5): dicts, lists, tuples, strings, integers, floats, booleans and
//! `None`, with the pickler's memo sharing repeated objects. This reader
//! knows those opcodes only. It has no globals, no `REDUCE`, no `BUILD`,
//! no object construction of any kind: a file that asks for one is refused
//! with one line naming the opcode (and the global, if it names one), so
//! nothing in a file can make vramscope run code.
//!
//! Values go into one arena ([`Doc`]) and are named by index ([`Id`]); a memo
//! reference (`BINGET`) pushes the index again, so a frame that a snapshot
//! references a million times is one node (interning comes for free, and no
//! copy of the object graph is ever made).
//!
//! Bounds, so that no file can make memory grow faster than its own size:
//!
//! - everything the parse holds (the arena, its stack, its memo, and what a
//!   [`Take`] made of the values it took) stays within [`bound`] of the
//!   input's length, 4 × it + 64 MiB: checked every 64 opcodes (no opcode
//!   adds more than a few bytes) and before each opcode that adds many (a
//!   string, the elements of an `APPENDS`), so a file past it is refused
//!   before it is allocated;
//! - a string or bytes object longer than what is left of the input is
//!   refused before anything is allocated;
//! - the memo only grows by one at a time (a `BINPUT` past its end is
//!   refused), and nesting (marks and containers being filled) is bounded by
//!   [`MAX_DEPTH`].
//!
//! Time is linear in the input: a memo reference is one push, whatever it
//! names; finding the topmost mark walks only the values above it, which
//! the opcode then consumes; and what a batch of values taken needs to
//! know of the marks under it (whether anything older was changed) is kept
//! on the topmost mark and handed down as marks are popped, never walked
//! for (`Mark::hit`).
//!
//! Errors ([`PickleError`]) carry the byte offset of the opcode at fault.
//!
//! # Taking values while parsing ([`parse_taking`])
//!
//! A reader that knows what it wants can take a dict out of the parse as
//! soon as it is complete (appended to a list): a [`Take`] turns it into a
//! compact value of its own and answers a token, which replaces the dict
//! everywhere (in the list, in the memo: a later memo reference is the
//! token, [`Value::Taken`]). When a batch of a list's elements (one
//! `MARK … APPENDS`, up to 1,000 with Python's pickler) has been taken and
//! nothing else can still reach what they were built from, the arena is
//! cut back to where the batch began: a trace of a million entries never
//! holds more than one batch of generic values. "Nothing else can reach":
//! no container older than the batch was changed while it was read, no
//! older memo entry was overwritten, and every memo entry stored since
//! is a taken dict, a value the taker converted too ([`Take::token_of`]:
//! a stack, a frame) or a value with no elements (a string, a number),
//! which is moved down; otherwise the values stay.

use std::io::Read;

#[cfg(test)]
mod tests;

/// The index of a value in its [`Doc`], or, with [`TAKEN`] set, the token
/// a [`Take`] answered for a value it took.
pub(crate) type Id = u32;

/// The bit that marks an [`Id`] as a taker's token (the token is the rest).
pub(crate) const TAKEN: Id = 1 << 31;

/// Takes complete dicts out of a parse ([`parse_taking`]).
pub(crate) trait Take {
    /// Dict `item`, just appended to a list: a token (< 2^31) for it, to
    /// stand for it from now on, or `None` to leave it in the parse.
    /// `parse_bytes`: what the parse holds besides the taker (its share of
    /// the [`bound`]).
    fn take(&mut self, doc: &Doc, item: Id, parse_bytes: usize) -> Option<u32>;
    /// The token of a value inside a dict taken, which the taker converted
    /// and may meet again through the memo (a stack, a frame).
    fn token_of(&self, id: Id) -> Option<u32>;
    /// The values from `from` on are gone (the arena was cut back): their
    /// ids will name other values.
    fn forget(&mut self, from: Id);
    /// Heap bytes held (counted in the parse's bound).
    fn memory_bytes(&self) -> usize;
}

/// The most memory reading an input of `len` bytes may take: 4 × `len` +
/// 64 MiB (the parse, and whatever is made of its values).
pub fn bound(len: u64) -> usize {
    usize::try_from(len)
        .unwrap_or(usize::MAX)
        .saturating_mul(4)
        .saturating_add(64 << 20)
}

/// A size in words (`12.3 MiB`), for messages about the bound.
pub(crate) fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}

/// How deeply marks may nest. Snapshot files nest six deep.
pub(crate) const MAX_DEPTH: usize = 1024;

/// Where a container's elements are: a run of a shared pool (a container
/// filled in one go, which is nearly all of them), or a vector of its own
/// (one filled in several batches with other containers in between, such as
/// a list of more than 1,000 entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Pool { start: u32, len: u32 },
    Own(u32),
}

/// One value, 16 bytes. Strings are runs of the string pool.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Node {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str { start: u32, len: u32 },
    Bytes { start: u32, len: u32 },
    List(Run),
    Tuple(Run),
    Dict(Run),
}

/// A value as the caller sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    List(&'a [Id]),
    Tuple(&'a [Id]),
    Dict(&'a [(Id, Id)]),
    /// A value a [`Take`] took: its token.
    Taken(u32),
}

/// A parsed pickle: its values and the root.
#[derive(Debug, Clone, Default)]
pub struct Doc {
    nodes: Vec<Node>,
    /// Every string's bytes (checked UTF-8) and every bytes object's.
    text: Vec<u8>,
    elems: Vec<Id>,
    own_elems: Vec<Vec<Id>>,
    pairs: Vec<(Id, Id)>,
    own_pairs: Vec<Vec<(Id, Id)>>,
    /// Heap bytes of `own_elems` and `own_pairs`, kept as they change.
    own_bytes: usize,
    root: Id,
    /// The offset of each value's opcode, when asked for
    /// ([`parse_with_offsets`]: to say where a value that does not fit is).
    offsets: Vec<u64>,
}

/// What is wrong with a pickle, and where (byte offset of the opcode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at offset {offset}: {why}")]
pub struct PickleError {
    pub(crate) offset: u64,
    pub(crate) why: String,
}

impl Doc {
    /// The value the pickle ends with.
    pub(crate) fn root(&self) -> Id {
        self.root
    }

    #[cfg(test)]
    /// How many values the file held (memo references not counted).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Where value `id` starts in the file (only after [`parse_with_offsets`]).
    pub(crate) fn offset(&self, id: Id) -> Option<u64> {
        self.offsets.get(id as usize).copied()
    }

    /// Heap bytes held (without a walk: asked after every few opcodes).
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.nodes.capacity() * size_of::<Node>()
            + self.text.capacity()
            + self.elems.capacity() * 4
            + self.pairs.capacity() * 8
            + (self.own_elems.capacity() + self.own_pairs.capacity()) * 24
            + self.own_bytes
            + self.offsets.capacity() * 8
    }

    fn seq(&self, r: Run) -> &[Id] {
        match r {
            Run::Pool { start, len } => &self.elems[start as usize..(start + len) as usize],
            Run::Own(i) => &self.own_elems[i as usize],
        }
    }

    fn map(&self, r: Run) -> &[(Id, Id)] {
        match r {
            Run::Pool { start, len } => &self.pairs[start as usize..(start + len) as usize],
            Run::Own(i) => &self.own_pairs[i as usize],
        }
    }

    /// The value `id` names (every id this Doc hands out is valid).
    pub(crate) fn value(&self, id: Id) -> Value<'_> {
        if id & TAKEN != 0 {
            return Value::Taken(id & !TAKEN);
        }
        match self.nodes[id as usize] {
            Node::None => Value::None,
            Node::Bool(b) => Value::Bool(b),
            Node::Int(i) => Value::Int(i),
            Node::Float(f) => Value::Float(f),
            Node::Str { start, len } => {
                let b = &self.text[start as usize..(start + len) as usize];
                // Checked as it was read.
                Value::Str(std::str::from_utf8(b).unwrap_or_default())
            }
            Node::Bytes { start, len } => {
                Value::Bytes(&self.text[start as usize..(start + len) as usize])
            }
            Node::List(r) => Value::List(self.seq(r)),
            Node::Tuple(r) => Value::Tuple(self.seq(r)),
            Node::Dict(r) => Value::Dict(self.map(r)),
        }
    }

    pub(crate) fn as_str(&self, id: Id) -> Option<&str> {
        match self.value(id) {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An integer (a boolean counts as 0 or 1, as in Python).
    pub(crate) fn as_int(&self, id: Id) -> Option<i64> {
        match self.value(id) {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self, id: Id) -> Option<bool> {
        match self.value(id) {
            Value::Bool(b) => Some(b),
            Value::Int(i) => Some(i != 0),
            _ => None,
        }
    }

    /// The elements of a list or a tuple.
    pub(crate) fn as_seq(&self, id: Id) -> Option<&[Id]> {
        match self.value(id) {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    pub(crate) fn as_dict(&self, id: Id) -> Option<&[(Id, Id)]> {
        match self.value(id) {
            Value::Dict(v) => Some(v),
            _ => None,
        }
    }

    /// How many elements a list or tuple holds, or pairs a dict (0 for
    /// anything else). Containers only grow while a pickle is read.
    pub(crate) fn elements(&self, id: Id) -> usize {
        match self.value(id) {
            Value::List(v) | Value::Tuple(v) => v.len(),
            Value::Dict(v) => v.len(),
            _ => 0,
        }
    }

    /// The value of the string key `key` in dict `id` (the last one, as
    /// Python keeps, should a file repeat a key).
    pub(crate) fn get(&self, id: Id, key: &str) -> Option<Id> {
        let key = key.as_bytes();
        self.as_dict(id)?
            .iter()
            .rev()
            .find(|(k, _)| match self.nodes.get(*k as usize) {
                // Compared as bytes: strings were checked as they were read.
                Some(&Node::Str { start, len }) => {
                    &self.text[start as usize..(start + len) as usize] == key
                }
                _ => false,
            })
            .map(|(_, v)| *v)
    }

    /// A value with no elements, which cannot be given any (a string, a
    /// number, `None`): moved freely, nothing inside it has an id, and
    /// nothing done to it later can change what a taker read of it.
    fn is_leaf(&self, id: Id) -> bool {
        !matches!(
            self.nodes[id as usize],
            Node::List(_) | Node::Tuple(_) | Node::Dict(_)
        )
    }

    /// Python's type name of a value, for messages.
    pub(crate) fn type_name(&self, id: Id) -> &'static str {
        match self.value(id) {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Taken(_) => "value taken while reading",
        }
    }
}

/// Parses a whole pickle of `len` bytes from `input` (read through a buffer
/// of its own: give it a plain `File`).
pub fn parse(input: impl Read, len: u64) -> Result<Doc, PickleError> {
    Parser::new(input, len).run()
}

/// [`parse`], offering each dict appended to a list to `taker` (see the
/// module's notes).
pub(crate) fn parse_taking(
    input: impl Read,
    len: u64,
    taker: &mut dyn Take,
) -> Result<Doc, PickleError> {
    let mut p = Parser::new(input, len);
    p.taker = Some(taker);
    p.run()
}

/// [`parse`], also keeping the offset of every value ([`Doc::offset`]):
/// 8 more bytes a value, for saying where a value is wrong.
pub(crate) fn parse_with_offsets(input: impl Read, len: u64) -> Result<Doc, PickleError> {
    let mut p = Parser::new(input, len);
    p.keep_offsets = true;
    p.run()
}

/// Parses a pickle held in memory.
pub(crate) fn parse_slice(bytes: &[u8]) -> Result<Doc, PickleError> {
    parse(bytes, bytes.len() as u64)
}

const BUF: usize = 1 << 16;

/// Buffered reading with the offset of every byte known.
struct Source<R> {
    r: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// Input offset of `buf[0]`.
    base: u64,
    len: u64,
}

impl<R: Read> Source<R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.offset())
    }

    /// Makes at least `n` (≤ BUF) bytes available; false at the end of input.
    fn fill(&mut self, n: usize) -> Result<bool, String> {
        if self.end - self.pos >= n {
            return Ok(true);
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.base += self.pos as u64;
        self.end -= self.pos;
        self.pos = 0;
        while self.end < n {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading failed: {e}")),
            }
        }
        Ok(true)
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        if !self.fill(N)? {
            return Err("the file ends in the middle of an opcode (truncated)".into());
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    fn byte(&mut self) -> Result<Option<u8>, String> {
        if self.pos < self.end || self.fill(1)? {
            let b = self.buf[self.pos];
            self.pos += 1;
            Ok(Some(b))
        } else {
            Ok(None)
        }
    }

    /// Refuses an object of `n` bytes when more than what is left.
    fn check_left(&self, n: u64) -> Result<(), String> {
        if n > self.remaining() {
            return Err(format!(
                "an object of {n} bytes, but only {} bytes are left (truncated or corrupt)",
                self.remaining()
            ));
        }
        Ok(())
    }

    /// `n` bytes (no more than what is left: [`Source::check_left`])
    /// appended to `out`.
    fn read_into(&mut self, n: usize, out: &mut Vec<u8>) -> Result<(), String> {
        let end = out.len() + n;
        out.reserve(n);
        while out.len() < end {
            if self.pos == self.end && !self.fill(1)? {
                return Err("the file ends inside a string (truncated)".into());
            }
            let k = (end - out.len()).min(self.end - self.pos);
            out.extend_from_slice(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
        }
        Ok(())
    }

    /// `n` bytes, refused before any allocation when more than what is left.
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        self.check_left(n)?;
        let mut out = Vec::new();
        self.read_into(n as usize, &mut out)?;
        Ok(out)
    }
}

/// What is on the parser's stack.
#[derive(Clone, Copy)]
enum Slot {
    Value(Id),
    Mark,
}

/// Where the arena stood when a MARK was pushed: what a batch of
/// elements taken may cut it back to.
#[derive(Clone, Copy)]
struct Mark {
    nodes: usize,
    text: usize,
    elems: usize,
    own_elems: usize,
    pairs: usize,
    own_pairs: usize,
    memo: usize,
    /// The lowest index (in `Parser::marks`) of the marks that something
    /// done while this mark was on top made unclean (`usize::MAX`: none).
    /// A mark is clean, no container older than it changed since it was
    /// pushed and no older memo entry overwritten, when its `hit` (with
    /// those of the marks popped from above it, handed down) is above its
    /// own index. A change reaches every mark newer than what it changed:
    /// the marks from some index up; so one number per mark says it, set
    /// in O(1) (the index found by binary search: `nodes` and `memo` only
    /// grow from mark to mark).
    hit: usize,
}

struct Parser<'t, R> {
    src: Source<R>,
    doc: Doc,
    stack: Vec<Slot>,
    /// One per MARK on the stack, innermost last.
    marks: Vec<Mark>,
    taker: Option<&'t mut dyn Take>,
    memo: Vec<Id>,
    /// The most heap the parse may take ([`bound`]).
    budget: usize,
    /// Opcodes run.
    ops: u64,
    keep_offsets: bool,
    /// The offset of the opcode being run.
    op_at: u64,
}

/// The name of an opcode this reader refuses, for its message.
fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82..=0x84 => "EXT",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

/// The id of a new value: below [`TAKEN`].
fn value_id(n: usize) -> Result<Id, String> {
    match Id::try_from(n) {
        Ok(id) if id < TAKEN => Ok(id),
        _ => Err("more than 2^31 values".into()),
    }
}

/// The bytes `v`'s buffer grows by to take `more` elements (it doubles).
fn growth<T>(v: &Vec<T>, more: usize) -> usize {
    let (len, cap) = (v.len(), v.capacity());
    let new = if len + more <= cap {
        cap
    } else {
        (2 * cap).max(len + more)
    };
    (new - cap) * std::mem::size_of::<T>()
}

/// A length that must fit the 32-bit runs of the pools.
fn small(n: usize, what: &str) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("more than 2^32 {what}"))
}

impl<R: Read> Parser<'_, R> {
    fn new(r: R, len: u64) -> Self {
        Parser {
            src: Source {
                r,
                buf: vec![0u8; BUF].into_boxed_slice(),
                pos: 0,
                end: 0,
                base: 0,
                len,
            },
            doc: Doc::default(),
            stack: Vec::new(),
            marks: Vec::new(),
            taker: None,
            memo: Vec::new(),
            budget: bound(len),
            ops: 0,
            keep_offsets: false,
            op_at: 0,
        }
    }

    fn run(mut self) -> Result<Doc, PickleError> {
        loop {
            let at = self.src.offset();
            self.op_at = at;
            let op = match self.src.byte() {
                Ok(Some(op)) => op,
                Ok(None) if at == 0 => {
                    return Err(PickleError {
                        offset: 0,
                        why: "the file is empty".into(),
                    })
                }
                Ok(None) => {
                    return Err(PickleError {
                        offset: at,
                        why: "the file ends before the pickle's STOP (truncated)".into(),
                    })
                }
                Err(why) => return Err(PickleError { offset: at, why }),
            };
            self.ops += 1;
            let step = match self.ops % 64 {
                0 => self.room(0).and_then(|()| self.step(op)),
                _ => self.step(op),
            };
            match step {
                Ok(true) => {}
                Ok(false) => return self.finish(at),
                Err(why) => return Err(PickleError { offset: at, why }),
            }
        }
    }

    fn finish(mut self, at: u64) -> Result<Doc, PickleError> {
        let root = match (self.stack.pop(), self.stack.is_empty()) {
            (Some(Slot::Value(id)), true) => id,
            _ => {
                return Err(PickleError {
                    offset: at,
                    why: "STOP with other than one value on the stack (corrupt)".into(),
                })
            }
        };
        self.doc.root = root;
        Ok(self.doc)
    }

    /// Heap bytes the parse holds besides the taker, counting the
    /// vectors that grow by one an opcode as doubled when they are nearly
    /// full (the bound is checked every 64 opcodes; a string or a batch
    /// of elements, before it is added).
    fn held(&self) -> usize {
        use std::mem::size_of;
        fn doubled_soon<T>(v: &Vec<T>) -> usize {
            let free = v.capacity() - v.len();
            if free < 64 {
                v.capacity() * size_of::<T>()
            } else {
                0
            }
        }
        self.doc.memory_bytes()
            + doubled_soon(&self.doc.nodes)
            + doubled_soon(&self.doc.offsets)
            + self.stack.capacity() * size_of::<Slot>()
            + doubled_soon(&self.stack)
            + self.memo.capacity() * size_of::<Id>()
            + doubled_soon(&self.memo)
            + self.marks.capacity() * size_of::<Mark>()
            + BUF
    }

    /// Whether `more` bytes still fit the bound, with what the parse and
    /// the taker hold; refused otherwise.
    fn room(&self, more: usize) -> Result<(), String> {
        let taker = self.taker.as_ref().map_or(0, |t| t.memory_bytes());
        let need = (self.held() + taker).saturating_add(more);
        if need <= self.budget {
            return Ok(());
        }
        Err(format!(
            "its values would take more than {} of memory, over the bound of {} for a file of {} (4 × its size + 64 MiB; a bomb?)",
            size_text(need as u64),
            size_text(self.budget as u64),
            size_text(self.src.len)
        ))
    }

    fn push_node(&mut self, n: Node) -> Result<(), String> {
        let id = value_id(self.doc.nodes.len())?;
        self.doc.nodes.push(n);
        if self.keep_offsets {
            self.doc.offsets.push(self.op_at);
        }
        self.stack.push(Slot::Value(id));
        Ok(())
    }

    fn pop(&mut self) -> Result<Id, String> {
        match self.stack.pop() {
            Some(Slot::Value(id)) => Ok(id),
            Some(Slot::Mark) => {
                Err("a value was expected on the stack, found a MARK (corrupt)".into())
            }
            None => Err("the stack is empty (corrupt)".into()),
        }
    }

    fn top(&self) -> Result<Id, String> {
        match self.stack.last() {
            Some(Slot::Value(id)) => Ok(*id),
            _ => Err("a value was expected on the stack (corrupt)".into()),
        }
    }

    /// Where the topmost mark is; the values above it are the caller's
    /// (every caller consumes them: the walk costs what they cost).
    fn mark_at(&self) -> Result<usize, String> {
        self.stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| "no MARK on the stack (corrupt)".to_string())
    }

    /// The values above the topmost mark (removed with the mark), appended
    /// to `out`.
    fn pop_mark_into(&mut self, out: &mut Vec<Id>) -> Result<(), String> {
        let at = self.mark_at()?;
        // Nothing above the topmost mark is a mark.
        out.extend(self.stack[at + 1..].iter().filter_map(|s| match s {
            Slot::Value(id) => Some(*id),
            Slot::Mark => None,
        }));
        self.stack.truncate(at);
        self.pop_mark();
        Ok(())
    }

    /// Pops the topmost mark (its MARK already off the stack), handing
    /// what made marks unclean down to the mark under it.
    fn pop_mark(&mut self) {
        if let Some(m) = self.marks.pop() {
            if let Some(under) = self.marks.last_mut() {
                under.hit = under.hit.min(m.hit);
            }
        }
    }

    /// Marks from index `from` up are no longer clean; all but the topmost
    /// when `skip_top` (the mark its opcode is about to pop).
    fn unclean_from(&mut self, from: usize, skip_top: bool) {
        let n = self.marks.len() - skip_top as usize;
        if from < n {
            let m = &mut self.marks[n - 1];
            m.hit = m.hit.min(from);
        }
    }

    /// Whether no container older than the topmost mark changed since it
    /// was pushed, and no older memo entry was overwritten.
    fn top_clean(&self) -> bool {
        self.marks.last().is_some_and(|m| m.hit >= self.marks.len())
    }

    /// Container `target` (older than the mark on top when `skip_top`, its
    /// own) is being changed: the marks pushed after it was made are no
    /// longer clean.
    fn touch(&mut self, target: Id, skip_top: bool) {
        let n = self.marks.len() - skip_top as usize;
        let from = self.marks[..n].partition_point(|m| m.nodes <= target as usize);
        self.unclean_from(from, skip_top);
    }

    /// A new sequence run holding `items`.
    fn new_run(&mut self, items: &[Id]) -> Result<Run, String> {
        let start = small(self.doc.elems.len(), "list elements")?;
        self.doc.elems.extend_from_slice(items);
        small(self.doc.elems.len(), "list elements")?;
        Ok(Run::Pool {
            start,
            len: items.len() as u32,
        })
    }

    /// Moves the stack's values above the topmost mark into a new list or
    /// tuple node.
    fn seq_from_mark(&mut self, tuple: bool) -> Result<(), String> {
        let at = self.mark_at()?;
        self.room((self.stack.len() - at) * 2 * std::mem::size_of::<Id>())?;
        let mut items = Vec::new();
        self.pop_mark_into(&mut items)?;
        let run = self.new_run(&items)?;
        self.push_node(if tuple {
            Node::Tuple(run)
        } else {
            Node::List(run)
        })
    }

    fn tuple(&mut self, n: usize) -> Result<(), String> {
        let mut items = [0; 3];
        for i in (0..n).rev() {
            items[i] = self.pop()?;
        }
        let run = self.new_run(&items[..n])?;
        self.push_node(Node::Tuple(run))
    }

    fn text(&mut self, n: u64, utf8: bool) -> Result<(), String> {
        self.src.check_left(n)?;
        self.room(growth(&self.doc.text, n as usize))?;
        let start = self.doc.text.len();
        small(start + n as usize, "bytes of strings")?;
        self.src.read_into(n as usize, &mut self.doc.text)?;
        if utf8 {
            if let Err(e) = std::str::from_utf8(&self.doc.text[start..]) {
                return Err(format!(
                    "a string that is not UTF-8 (invalid byte at {} of it)",
                    e.valid_up_to()
                ));
            }
        }
        let (start, len) = (start as u32, n as u32);
        self.push_node(if utf8 {
            Node::Str { start, len }
        } else {
            Node::Bytes { start, len }
        })
    }

    fn long(&mut self, n: u64) -> Result<(), String> {
        if n > 8 {
            return Err(format!(
                "an integer of {n} bytes (snapshot files hold 64-bit integers)"
            ));
        }
        let b = self.src.bytes(n)?;
        let mut v: i64 = 0;
        for (i, x) in b.iter().enumerate() {
            v |= (*x as i64) << (8 * i);
        }
        // Two's complement of `n` bytes, sign-extended.
        if n > 0 && n < 8 && b[n as usize - 1] & 0x80 != 0 {
            v |= -1i64 << (8 * n);
        }
        self.push_node(Node::Int(v))
    }

    fn memo_put(&mut self, index: u64) -> Result<(), String> {
        let id = self.top()?;
        let len = self.memo.len() as u64;
        if index < len {
            self.memo[index as usize] = id;
            // What the batches being read made may now be reached from an
            // older entry.
            let from = self.marks.partition_point(|m| m.memo <= index as usize);
            self.unclean_from(from, false);
        } else if index == len {
            self.memo.push(id);
        } else {
            return Err(format!(
                "memo index {index} skips ahead of the memo's {len} entries (corrupt)"
            ));
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), String> {
        let id = *self
            .memo
            .get(index as usize)
            .ok_or_else(|| format!("memo index {index} was never stored (corrupt)"))?;
        self.stack.push(Slot::Value(id));
        Ok(())
    }

    /// Appends the values above the topmost mark (or the top value alone)
    /// to the list under them.
    fn append(&mut self, marked: bool) -> Result<(), String> {
        let first = if marked {
            self.mark_at()? + 1
        } else {
            self.stack
                .len()
                .checked_sub(1)
                .ok_or("the stack is empty (corrupt)")?
        };
        let list = match first
            .checked_sub(1 + marked as usize)
            .map(|i| self.stack[i])
        {
            Some(Slot::Value(id)) => id,
            _ => return Err("APPEND with no list under its values (corrupt)".into()),
        };
        if self.stack[first..].iter().any(|s| matches!(s, Slot::Mark)) {
            return Err("a MARK among APPEND's values (corrupt)".into());
        }
        let Some(&Node::List(run)) = self.doc.nodes.get(list as usize) else {
            return Err(format!(
                "APPEND to a {} (corrupt or hostile)",
                self.doc.type_name(list)
            ));
        };
        self.touch(list, marked);
        if self.taker.is_some() {
            self.take_items(first, list, marked);
        }
        // Taking may have cut the pool back: where the run can grow is
        // known now.
        let end = self.doc.elems.len();
        let in_place = |start: u32, len: u32| start as usize + len as usize == end || len == 0;
        let n = self.stack.len() - first;
        self.room(match run {
            Run::Pool { start, len } if in_place(start, len) => growth(&self.doc.elems, n),
            Run::Pool { len, .. } => 2 * (len as usize + n) * 4,
            Run::Own(i) => growth(&self.doc.own_elems[i as usize], n),
        })?;
        // No MARK among them (checked above).
        let items = self.stack[first..].iter().map(|s| match s {
            Slot::Value(id) => *id,
            Slot::Mark => 0,
        });
        let doc = &mut self.doc;
        match run {
            Run::Pool { start, len } if in_place(start, len) => {
                let start = if len == 0 { end } else { start as usize };
                doc.elems.extend(items);
                let len = small(doc.elems.len() - start, "list elements")?;
                small(doc.elems.len(), "list elements")?;
                doc.nodes[list as usize] = Node::List(Run::Pool {
                    start: start as u32,
                    len,
                });
            }
            Run::Pool { start, len } => {
                let mut own = doc.elems[start as usize..(start + len) as usize].to_vec();
                own.extend(items);
                let i = small(doc.own_elems.len(), "lists")?;
                doc.own_bytes += own.capacity() * 4;
                doc.own_elems.push(own);
                doc.nodes[list as usize] = Node::List(Run::Own(i));
            }
            Run::Own(i) => {
                let own = &mut doc.own_elems[i as usize];
                let before = own.capacity();
                own.extend(items);
                doc.own_bytes += (own.capacity() - before) * 4;
            }
        }
        self.stack.truncate(first - marked as usize);
        if marked {
            self.pop_mark();
        }
        Ok(())
    }

    /// Offers the dicts made since the batch's mark (for a lone APPEND,
    /// since `list`) among the values above `first` to the taker, and puts
    /// its tokens in their place; then, where nothing else can reach what
    /// they were built from, cuts the arena back to the mark.
    fn take_items(&mut self, first: usize, list: Id, marked: bool) {
        let held = self.held();
        let clean = self.top_clean();
        let Some(taker) = self.taker.as_deref_mut() else {
            return;
        };
        let mark = if marked {
            self.marks.last().copied()
        } else {
            None
        };
        let floor = mark.map_or(list as usize + 1, |m| m.nodes);
        // (value, its token), by value: a dict appended twice is taken once.
        let mut taken: Vec<(Id, Id)> = Vec::new();
        for slot in &mut self.stack[first..] {
            let Slot::Value(id) = *slot else { continue };
            if id & TAKEN != 0 || (id as usize) < floor {
                continue;
            }
            let token = match taken.last() {
                Some(&(last, _)) if id <= last => taken
                    .binary_search_by_key(&id, |t| t.0)
                    .ok()
                    .map(|i| taken[i].1),
                _ if matches!(self.doc.nodes[id as usize], Node::Dict(_)) => {
                    match taker.take(&self.doc, id, held) {
                        Some(t) if t & TAKEN == 0 => {
                            taken.push((id, t | TAKEN));
                            Some(t | TAKEN)
                        }
                        _ => None,
                    }
                }
                _ => None,
            };
            if let Some(t) = token {
                *slot = Slot::Value(t);
            }
        }
        let Some(mark) = mark.filter(|_| !taken.is_empty()) else {
            return;
        };
        let mut cut = clean
            && (list as usize) < mark.nodes
            && !self.keep_offsets
            && self.stack[first..].iter().all(
                |s| matches!(s, Slot::Value(id) if id & TAKEN != 0 || (*id as usize) < mark.nodes),
            );
        // The memo entries stored since the mark, as they will be: a value
        // taken or converted is its token; a string or a number is moved
        // down (below); anything else keeps the arena as it is.
        let mut leaves: Vec<Id> = Vec::new();
        for e in &mut self.memo[mark.memo..] {
            let id = *e;
            if id & TAKEN != 0 || (id as usize) < mark.nodes {
                continue;
            }
            if let Ok(i) = taken.binary_search_by_key(&id, |t| t.0) {
                *e = taken[i].1;
            } else if let Some(t) = taker.token_of(id).filter(|t| t & TAKEN == 0) {
                *e = t | TAKEN;
            } else if cut && self.doc.is_leaf(id) {
                leaves.push(id);
            } else {
                cut = false;
            }
        }
        if !cut {
            return;
        }
        leaves.sort_unstable();
        leaves.dedup();
        let d = &mut self.doc;
        let kept: Vec<(Node, Vec<u8>)> = leaves
            .iter()
            .map(|&id| {
                let n = d.nodes[id as usize];
                let text = match n {
                    Node::Str { start, len } | Node::Bytes { start, len } => {
                        d.text[start as usize..(start + len) as usize].to_vec()
                    }
                    _ => Vec::new(),
                };
                (n, text)
            })
            .collect();
        let own: usize = (d.own_elems[mark.own_elems..].iter())
            .map(|v| v.capacity() * 4)
            .chain(
                d.own_pairs[mark.own_pairs..]
                    .iter()
                    .map(|v| v.capacity() * 8),
            )
            .sum();
        d.own_bytes -= own;
        d.nodes.truncate(mark.nodes);
        d.text.truncate(mark.text);
        d.elems.truncate(mark.elems);
        d.own_elems.truncate(mark.own_elems);
        d.pairs.truncate(mark.pairs);
        d.own_pairs.truncate(mark.own_pairs);
        taker.forget(mark.nodes as Id);
        // The leaves again, just above the mark (the text of each is at
        // most what was cut, so the 32-bit runs still hold).
        for (n, text) in kept {
            let start = d.text.len() as u32;
            d.text.extend_from_slice(&text);
            d.nodes.push(match n {
                Node::Str { len, .. } => Node::Str { start, len },
                Node::Bytes { len, .. } => Node::Bytes { start, len },
                other => other,
            });
        }
        for e in &mut self.memo[mark.memo..] {
            if let Ok(i) = leaves.binary_search(e) {
                *e = (mark.nodes + i) as Id;
            }
        }
    }

    /// Sets the key-value pairs above the topmost mark (or the top two
    /// values) in the dict under them.
    fn set_items(&mut self, marked: bool) -> Result<(), String> {
        let first = if marked {
            self.mark_at()? + 1
        } else {
            self.stack
                .len()
                .checked_sub(2)
                .ok_or("SETITEM with too few values (corrupt)")?
        };
        if (self.stack.len() - first) % 2 != 0 {
            return Err("SETITEMS with an odd number of values (corrupt)".into());
        }
        let dict = match first
            .checked_sub(1 + marked as usize)
            .map(|i| self.stack[i])
        {
            Some(Slot::Value(id)) => id,
            _ => return Err("SETITEM with no dict under its values (corrupt)".into()),
        };
        let Some(&Node::Dict(run)) = self.doc.nodes.get(dict as usize) else {
            return Err(format!(
                "SETITEM on a {} (corrupt or hostile)",
                self.doc.type_name(dict)
            ));
        };
        let n = (self.stack.len() - first) / 2;
        let end = self.doc.pairs.len();
        let in_place = |start: u32, len: u32| start as usize + len as usize == end || len == 0;
        self.room(
            match run {
                Run::Pool { start, len } if in_place(start, len) => growth(&self.doc.pairs, n),
                Run::Pool { len, .. } => 2 * (len as usize + n) * 8,
                Run::Own(i) => growth(&self.doc.own_pairs[i as usize], n),
            } + n * 8,
        )?;
        self.touch(dict, marked);
        let mut values = Vec::with_capacity(self.stack.len() - first);
        for s in &self.stack[first..] {
            match s {
                Slot::Value(id) => values.push(*id),
                Slot::Mark => return Err("a MARK among SETITEMS' values (corrupt)".into()),
            }
        }
        let items = values.chunks_exact(2).map(|p| (p[0], p[1]));
        let doc = &mut self.doc;
        match run {
            Run::Pool { start, len } if in_place(start, len) => {
                let start = if len == 0 { end } else { start as usize };
                doc.pairs.extend(items);
                let len = small(doc.pairs.len() - start, "dict entries")?;
                small(doc.pairs.len(), "dict entries")?;
                doc.nodes[dict as usize] = Node::Dict(Run::Pool {
                    start: start as u32,
                    len,
                });
            }
            Run::Pool { start, len } => {
                let mut own = doc.pairs[start as usize..(start + len) as usize].to_vec();
                own.extend(items);
                let i = small(doc.own_pairs.len(), "dicts")?;
                doc.own_bytes += own.capacity() * 8;
                doc.own_pairs.push(own);
                doc.nodes[dict as usize] = Node::Dict(Run::Own(i));
            }
            Run::Own(i) => {
                let own = &mut doc.own_pairs[i as usize];
                let before = own.capacity();
                own.extend(items);
                doc.own_bytes += (own.capacity() - before) * 8;
            }
        }
        self.stack.truncate(first - marked as usize);
        if marked {
            self.pop_mark();
        }
        Ok(())
    }

    /// One opcode; false at STOP.
    fn step(&mut self, op: u8) -> Result<bool, String> {
        let src = &mut self.src;
        match op {
            0x80 => {
                let [v] = src.take::<1>()?;
                if !(2..=5).contains(&v) {
                    return Err(format!(
                        "pickle protocol {v} (snapshot files use protocols 2 to 5)"
                    ));
                }
            }
            0x95 => {
                src.take::<8>()?;
            }
            b'.' => return Ok(false),
            b'(' => {
                if self.marks.len() >= MAX_DEPTH {
                    return Err(format!("marks nested deeper than {MAX_DEPTH} (a bomb?)"));
                }
                let d = &self.doc;
                self.marks.push(Mark {
                    nodes: d.nodes.len(),
                    text: d.text.len(),
                    elems: d.elems.len(),
                    own_elems: d.own_elems.len(),
                    pairs: d.pairs.len(),
                    own_pairs: d.own_pairs.len(),
                    memo: self.memo.len(),
                    hit: usize::MAX,
                });
                self.stack.push(Slot::Mark);
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                let at = self.mark_at()?;
                self.stack.truncate(at);
                self.pop_mark();
            }
            b'}' => self.push_node(Node::Dict(Run::Pool { start: 0, len: 0 }))?,
            b']' => self.push_node(Node::List(Run::Pool { start: 0, len: 0 }))?,
            b')' => self.push_node(Node::Tuple(Run::Pool { start: 0, len: 0 }))?,
            b'l' => self.seq_from_mark(false)?,
            b't' => self.seq_from_mark(true)?,
            b'd' => {
                // DICT: the marked values become a new dict's items.
                let at = self.mark_at()?;
                let n = value_id(self.doc.nodes.len())?;
                self.doc
                    .nodes
                    .push(Node::Dict(Run::Pool { start: 0, len: 0 }));
                if self.keep_offsets {
                    self.doc.offsets.push(self.op_at);
                }
                self.stack.insert(at, Slot::Value(n));
                self.set_items(true)?;
            }
            0x85 => self.tuple(1)?,
            0x86 => self.tuple(2)?,
            0x87 => self.tuple(3)?,
            b'a' => self.append(false)?,
            b'e' => self.append(true)?,
            b's' => self.set_items(false)?,
            b'u' => self.set_items(true)?,
            b'N' => self.push_node(Node::None)?,
            0x88 => self.push_node(Node::Bool(true))?,
            0x89 => self.push_node(Node::Bool(false))?,
            b'J' => {
                let v = i32::from_le_bytes(src.take::<4>()?);
                self.push_node(Node::Int(v as i64))?;
            }
            b'K' => {
                let [v] = src.take::<1>()?;
                self.push_node(Node::Int(v as i64))?;
            }
            b'M' => {
                let v = u16::from_le_bytes(src.take::<2>()?);
                self.push_node(Node::Int(v as i64))?;
            }
            0x8a => {
                let [n] = src.take::<1>()?;
                self.long(n as u64)?;
            }
            0x8b => {
                let n = u32::from_le_bytes(src.take::<4>()?);
                self.long(n as u64)?;
            }
            b'G' => {
                let v = f64::from_be_bytes(src.take::<8>()?);
                self.push_node(Node::Float(v))?;
            }
            b'X' => {
                let n = u32::from_le_bytes(src.take::<4>()?);
                self.text(n as u64, true)?;
            }
            0x8c => {
                let [n] = src.take::<1>()?;
                self.text(n as u64, true)?;
            }
            0x8d => {
                let n = u64::from_le_bytes(src.take::<8>()?);
                self.text(n, true)?;
            }
            b'B' => {
                let n = u32::from_le_bytes(src.take::<4>()?);
                self.text(n as u64, false)?;
            }
            b'C' => {
                let [n] = src.take::<1>()?;
                self.text(n as u64, false)?;
            }
            0x8e => {
                let n = u64::from_le_bytes(src.take::<8>()?);
                self.text(n, false)?;
            }
            b'q' => {
                let [i] = src.take::<1>()?;
                self.memo_put(i as u64)?;
            }
            b'r' => {
                let i = u32::from_le_bytes(src.take::<4>()?);
                self.memo_put(i as u64)?;
            }
            0x94 => {
                let n = self.memo.len() as u64;
                self.memo_put(n)?;
            }
            b'h' => {
                let [i] = src.take::<1>()?;
                self.memo_get(i as u64)?;
            }
            b'j' => {
                let i = u32::from_le_bytes(src.take::<4>()?);
                self.memo_get(i as u64)?;
            }
            b'c' => {
                // GLOBAL "module\nname\n": named in the refusal.
                let mut name = Vec::new();
                let mut lines = 0;
                while lines < 2 && name.len() < 200 {
                    match src.byte()? {
                        Some(b'\n') => {
                            lines += 1;
                            name.push(b'.');
                        }
                        Some(b) => name.push(b),
                        None => break,
                    }
                }
                let name = String::from_utf8_lossy(&name);
                let name = vramscope_text::printable(name.trim_end_matches('.'));
                return Err(format!(
                    "refused: GLOBAL {name} (snapshot files hold plain data; this file asks to import and run code)"
                ));
            }
            0x93 => {
                let name = self.stack_global_name();
                return Err(format!(
                    "refused: STACK_GLOBAL {name} (snapshot files hold plain data; this file asks to import and run code)"
                ));
            }
            _ => {
                return Err(match refused_name(op) {
                    Some(name) => format!(
                        "refused: opcode {name} (snapshot files hold plain data; this file asks to build objects)"
                    ),
                    None => format!(
                        "opcode 0x{op:02x} is not one snapshot files use (not a snapshot, or corrupt)"
                    ),
                });
            }
        }
        Ok(true)
    }

    /// `module.name` of a STACK_GLOBAL, from the two strings under it.
    fn stack_global_name(&self) -> String {
        let s = |i: usize| {
            self.stack
                .len()
                .checked_sub(i)
                .and_then(|k| match self.stack[k] {
                    Slot::Value(id) => self.doc.as_str(id).map(vramscope_text::printable),
                    Slot::Mark => None,
                })
                .unwrap_or_else(|| "?".into())
        };
        format!("{}.{}", s(2), s(1))
    }
}
