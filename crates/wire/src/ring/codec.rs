//! Records: how an [`Event`] is packed into a slot's seven payload words and
//! unpacked again (`FORMAT.md`, "Records"). Pure code.

use crate::event::{
    BlockState, CtxTag, DropWhat, Event, EventKind, Held, Library, MarkSource, Outside,
    OutsideKind, OutsideOp, Phase, Place, PoolId, RingSpan, SegmentPool, Stats,
};

use super::layout::PAYLOAD_WORDS;

/// The seven payload words of one slot.
pub type Words = [u64; PAYLOAD_WORDS];

pub(crate) const K_ALLOC: u16 = 1;
pub(crate) const K_FREE_REQUESTED: u16 = 2;
pub(crate) const K_FREE_COMPLETED: u16 = 3;
pub(crate) const K_SEGMENT_ALLOC: u16 = 4;
pub(crate) const K_SEGMENT_FREE: u16 = 5;
pub(crate) const K_SEGMENT_MAP: u16 = 6;
pub(crate) const K_SEGMENT_UNMAP: u16 = 7;
pub(crate) const K_OOM: u16 = 9;
pub(crate) const K_STATS_A: u16 = 16;
pub(crate) const K_STATS_B: u16 = 17;
pub(crate) const K_SNAP_BEGIN: u16 = 32;
pub(crate) const K_SNAP_SEGMENT: u16 = 33;
pub(crate) const K_SNAP_BLOCK: u16 = 34;
pub(crate) const K_SNAP_END: u16 = 35;
pub(crate) const K_MARKER: u16 = 48;
// Added in 1.1 (FORMAT.md, "Changelog").
pub const K_STATS_C: u16 = 18;
pub const K_DROPPED: u16 = 49;
pub const K_STRING: u16 = 64;
pub const K_FRAME: u16 = 65;
pub const K_STACK: u16 = 66;
pub const K_CONTEXT: u16 = 67;
// Added in 1.2.
pub const K_ROLES: u16 = 68;
pub const K_ROLE: u16 = 69;
pub const K_ROLES_END: u16 = 70;
// Added in 1.3.
pub const K_OUTSIDE_ALLOC: u16 = 80;
pub const K_OUTSIDE_FREE: u16 = 81;
pub const K_OUTSIDE_TOTAL: u16 = 82;

/// Position-span flags (SNAP_BEGIN w6, STATS_C w4): bit 0 given, bit 1
/// exact, bit 2 ambiguous, bits 8–15 the ring index.
pub(crate) const SPAN_GIVEN: u64 = 1;
pub(crate) const SPAN_EXACT: u64 = 2;
pub(crate) const SPAN_AMBIGUOUS: u64 = 4;
/// CONTEXT w6 bit 0: w4 holds the step.
pub(crate) const CONTEXT_STEP_GIVEN: u64 = 1;
/// STRING: bytes of a string one record carries.
pub(crate) const STRING_CHUNK: usize = 32;
/// STRING: the longest string a producer may define (longer ones are cut at
/// a character boundary and counted as DROPPED `Strings`).
pub(crate) const STRING_MAX: usize = 4096;

pub const NO_DEVICE: u16 = 0xffff;

fn head(kind: u16, device: u16, aux: u32) -> u64 {
    kind as u64 | (device as u64) << 16 | (aux as u64) << 32
}

/// Splits a record header word into `(kind, device, aux)`.
pub(crate) fn split_head(w0: u64) -> (u16, u16, u32) {
    (w0 as u16, (w0 >> 16) as u16, (w0 >> 32) as u32)
}

/// A record but for its time: `(kind, device, aux)` and words 2 to 6.
type Body = (u16, u16, u32, [u64; 5]);

fn record((kind, device, aux, [a, b, c, d, e]): Body, time: u64) -> Words {
    [head(kind, device, aux), time, a, b, c, d, e]
}

fn placed(kind: u16, p: &Place, a: u64, b: u64) -> Body {
    (
        kind,
        p.device,
        p.ctx.aux(),
        [a, b, p.stream, p.pool.0, p.pool.1],
    )
}

/// The place of an allocator record (words 4 to 6, the context in `aux`).
fn place_of(device: u16, aux: u32, w: &Words) -> Place {
    Place {
        device,
        stream: w[4],
        pool: PoolId(w[5], w[6]),
        ctx: CtxTag::from_aux(aux),
    }
}

/// The `before`, `after` and flags words of a position span (`None`: all 0).
fn span_words(at: &Option<RingSpan>) -> [u64; 3] {
    [
        at.map_or(0, |a| a.before),
        at.map_or(0, |a| a.after),
        span_flags(at),
    ]
}

/// The flags word of a position span (`None`: 0, "not given").
pub(crate) fn span_flags(at: &Option<RingSpan>) -> u64 {
    match at {
        None => 0,
        Some(a) => {
            SPAN_GIVEN
                | if a.exact { SPAN_EXACT } else { 0 }
                | if a.ambiguous { SPAN_AMBIGUOUS } else { 0 }
                | (a.ring as u64) << 8
        }
    }
}

/// A position span from its `before`, `after` and flags words.
pub(crate) fn span_of(before: u64, after: u64, flags: u64) -> Option<RingSpan> {
    (flags & SPAN_GIVEN != 0).then_some(RingSpan {
        ring: (flags >> 8) as u8,
        before,
        after,
        exact: flags & SPAN_EXACT != 0,
        ambiguous: flags & SPAN_AMBIGUOUS != 0,
    })
}

fn mark_source_words(s: &MarkSource) -> (u64, u64) {
    match *s {
        MarkSource::Unknown => (0, 0),
        MarkSource::User => (1, 0),
        MarkSource::OptimizerStep { optimizer } => (2, optimizer as u64),
        MarkSource::Inferred => (3, 0),
        MarkSource::Run => (5, 0),
        MarkSource::MemoryLimit {
            device,
            whole_device,
        } => (6, device as u64 | (whole_device as u64) << 32),
        MarkSource::Other(c) => (c as u64, 0),
    }
}

fn mark_source_of(w3: u64, w4: u64) -> MarkSource {
    match w3 as u8 {
        0 => MarkSource::Unknown,
        1 => MarkSource::User,
        2 => MarkSource::OptimizerStep {
            optimizer: w4 as u32,
        },
        3 => MarkSource::Inferred,
        5 => MarkSource::Run,
        6 => MarkSource::MemoryLimit {
            device: (w4 & 0xffff) as u16,
            whole_device: w4 >> 32 & 1 == 1,
        },
        c => MarkSource::Other(c),
    }
}

fn phase_code(p: Phase) -> u64 {
    match p {
        Phase::NotGiven => 0,
        Phase::Forward => 1,
        Phase::Backward => 2,
        Phase::Optimizer => 3,
        Phase::Other(c) => c as u64,
    }
}

fn phase_of(w: u64) -> Phase {
    match w as u8 {
        0 => Phase::NotGiven,
        1 => Phase::Forward,
        2 => Phase::Backward,
        3 => Phase::Optimizer,
        c => Phase::Other(c),
    }
}

fn drop_code(w: DropWhat) -> u32 {
    match w {
        DropWhat::Records => 1,
        DropWhat::ContextIds => 2,
        DropWhat::Stacks => 3,
        DropWhat::Strings => 4,
        DropWhat::Definitions => 5,
        DropWhat::BlockTags => 6,
        DropWhat::Roles => 7,
        DropWhat::Outside => 8,
        DropWhat::Other(c) => c,
    }
}

fn drop_of(c: u32) -> DropWhat {
    match c {
        1 => DropWhat::Records,
        2 => DropWhat::ContextIds,
        3 => DropWhat::Stacks,
        4 => DropWhat::Strings,
        5 => DropWhat::Definitions,
        6 => DropWhat::BlockTags,
        7 => DropWhat::Roles,
        8 => DropWhat::Outside,
        c => DropWhat::Other(c),
    }
}

fn library_code(l: Library) -> u32 {
    match l {
        Library::Cuda => 1,
        Library::Torch => 2,
        Library::Nccl => 3,
        Library::Cublas => 4,
        Library::Cudnn => 5,
        Library::Cufft => 6,
        Library::Triton => 7,
        Library::TensorRt => 8,
        Library::CuPy => 9,
        Library::Other(c) => c as u32,
    }
}

pub fn library_of(c: u8) -> Library {
    match c {
        1 => Library::Cuda,
        2 => Library::Torch,
        3 => Library::Nccl,
        4 => Library::Cublas,
        5 => Library::Cudnn,
        6 => Library::Cufft,
        7 => Library::Triton,
        8 => Library::TensorRt,
        9 => Library::CuPy,
        c => Library::Other(c),
    }
}

fn outside_kind_code(k: OutsideKind) -> u32 {
    match k {
        OutsideKind::Context => 1,
        OutsideKind::Allocation => 2,
        OutsideKind::Physical => 3,
        OutsideKind::StreamOrdered => 4,
        OutsideKind::Managed => 5,
        OutsideKind::Host => 6,
        OutsideKind::Kernels => 7,
        OutsideKind::Streams => 8,
        OutsideKind::Before => 9,
        OutsideKind::Other(c) => c as u32,
    }
}

pub fn outside_kind_of(c: u8) -> OutsideKind {
    match c {
        1 => OutsideKind::Context,
        2 => OutsideKind::Allocation,
        3 => OutsideKind::Physical,
        4 => OutsideKind::StreamOrdered,
        5 => OutsideKind::Managed,
        6 => OutsideKind::Host,
        7 => OutsideKind::Kernels,
        8 => OutsideKind::Streams,
        9 => OutsideKind::Before,
        c => OutsideKind::Other(c),
    }
}

/// OUTSIDE_*: `aux` holds the library (bits 0–7) and the kind (8–15); w4–w6
/// the library's name.
fn outside_body(o: &Outside) -> Body {
    let kind = match o.op {
        OutsideOp::Alloc => K_OUTSIDE_ALLOC,
        OutsideOp::Free => K_OUTSIDE_FREE,
        OutsideOp::Total => K_OUTSIDE_TOTAL,
    };
    let aux = (library_code(o.library) & 0xff) | (outside_kind_code(o.kind) & 0xff) << 8;
    let word = |i: usize| u64::from_le_bytes(o.name[i * 8..i * 8 + 8].try_into().expect("8"));
    (
        kind,
        o.device,
        aux,
        [o.addr, o.bytes, word(0), word(1), word(2)],
    )
}

fn outside_of(kind: u16, device: u16, aux: u32, w: &Words) -> Option<EventKind> {
    let op = match kind {
        K_OUTSIDE_ALLOC => OutsideOp::Alloc,
        K_OUTSIDE_FREE => OutsideOp::Free,
        K_OUTSIDE_TOTAL => OutsideOp::Total,
        _ => return None,
    };
    let mut name = [0u8; 24];
    for (i, word) in w[4..7].iter().enumerate() {
        name[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    Some(EventKind::Outside(Outside {
        op,
        device,
        library: library_of(aux as u8),
        kind: outside_kind_of((aux >> 8) as u8),
        addr: w[2],
        bytes: w[3],
        name,
    }))
}

fn held_code(h: Held) -> u64 {
    match h {
        Held::Parameter => 1,
        Held::Buffer => 2,
        Held::Gradient => 3,
        Held::OptimizerState => 4,
        Held::Other(c) => c as u64,
    }
}

pub fn held_of(w: u64) -> Held {
    match w as u8 {
        1 => Held::Parameter,
        2 => Held::Buffer,
        3 => Held::Gradient,
        4 => Held::OptimizerState,
        c => Held::Other(c),
    }
}

fn pack32(bytes: &[u8; 32]) -> [u64; 4] {
    let mut w = [0u64; 4];
    for (i, c) in bytes.chunks_exact(8).enumerate() {
        w[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    w
}

fn unpack32(w: &[u64]) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, v) in w.iter().take(4).enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

#[cfg(test)]
/// The STRING records that define string `id` as `s` (cut at
/// [`STRING_MAX`] bytes on a character boundary), stamped `time`.
pub(crate) fn encode_string(id: u32, time: u64, s: &str, out: &mut Vec<Words>) {
    let mut n = s.len().min(STRING_MAX);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    let b = &s.as_bytes()[..n];
    let mut off = 0;
    loop {
        let mut chunk = [0u8; 32];
        let end = (off + STRING_CHUNK).min(n);
        chunk[..end - off].copy_from_slice(&b[off..end]);
        out.push(record(string_body(id, n as u32, off as u32, &chunk), time));
        off = end;
        if off >= n {
            break;
        }
    }
}

fn string_body(id: u32, len: u32, offset: u32, bytes: &[u8; 32]) -> Body {
    let [a, b, c, d] = pack32(bytes);
    let len_offset = len as u64 | (offset as u64) << 32;
    (K_STRING, NO_DEVICE, id, [len_offset, a, b, c, d])
}

/// Reassembles strings from their STRING chunks (in any order, repeats
/// allowed): what a reader keeps to resolve string ids.
#[derive(Debug, Default, Clone)]
pub struct Strings {
    partial: std::collections::HashMap<u32, (u32, Vec<u8>, Vec<bool>)>,
    done: std::collections::HashMap<u32, String>,
}

impl Strings {
    /// Takes one chunk; returns true when it completed its string.
    pub fn add(&mut self, id: u32, len: u32, offset: u32, bytes: &[u8; 32]) -> bool {
        if id == 0 || self.done.contains_key(&id) || len as usize > STRING_MAX {
            return false;
        }
        let chunks = (len as usize).div_ceil(STRING_CHUNK).max(1);
        let entry = self
            .partial
            .entry(id)
            .or_insert_with(|| (len, vec![0; len as usize], vec![false; chunks]));
        let off = offset as usize;
        if entry.0 != len || off % STRING_CHUNK != 0 || off / STRING_CHUNK >= chunks {
            return false;
        }
        let end = (off + STRING_CHUNK).min(len as usize);
        entry.1[off..end].copy_from_slice(&bytes[..end - off]);
        entry.2[off / STRING_CHUNK] = true;
        if entry.2.iter().all(|&b| b) {
            let (_, b, _) = self.partial.remove(&id).expect("present");
            // Text from a producer: printable before anything shows it.
            let text = vramscope_text::printable(&String::from_utf8_lossy(&b));
            self.done.insert(id, text);
            return true;
        }
        false
    }
    pub fn get(&self, id: u32) -> Option<&str> {
        self.done.get(&id).map(String::as_str)
    }
}

/// Packs one event into one or two records (statistics take two).
/// `sample` numbers statistics samples so a reader can pair the halves.
pub fn encode(e: &Event, sample: u32, out: &mut Vec<Words>) {
    let (first, second) = bodies(&e.kind, sample);
    out.push(record(first, e.time_ns));
    out.extend(second.map(|b| record(b, e.time_ns)));
}

/// The record of an event, and the second one of a statistics sample.
fn bodies(kind: &EventKind, sample: u32) -> (Body, Option<Body>) {
    use EventKind as E;
    let one = match kind {
        E::Alloc { place, addr, size } => placed(K_ALLOC, place, *addr, *size),
        E::FreeRequested { place, addr, size } => placed(K_FREE_REQUESTED, place, *addr, *size),
        E::FreeCompleted { place, addr, size } => placed(K_FREE_COMPLETED, place, *addr, *size),
        E::SegmentAlloc { place, addr, size } => placed(K_SEGMENT_ALLOC, place, *addr, *size),
        E::SegmentFree { place, addr, size } => placed(K_SEGMENT_FREE, place, *addr, *size),
        E::SegmentMap { place, addr, size } => placed(K_SEGMENT_MAP, place, *addr, *size),
        E::SegmentUnmap { place, addr, size } => placed(K_SEGMENT_UNMAP, place, *addr, *size),
        E::Oom {
            place,
            device_free,
            request,
        } => placed(K_OOM, place, *device_free, *request),
        E::Stats { device, stats } => {
            let [a, b] = stats_bodies(*device, sample, stats);
            return (a, Some(b));
        }
        E::StatsPosition { device, at } => {
            let [before, after, flags] = span_words(&Some(*at));
            (K_STATS_C, *device, sample, [before, after, flags, 0, 0])
        }
        E::SnapshotBegin { .. }
        | E::SnapshotSegment { .. }
        | E::SnapshotBlock { .. }
        | E::SnapshotEnd { .. } => snapshot_body(kind),
        E::StringChunk { .. } | E::Frame { .. } | E::Stack { .. } | E::Context { .. } => {
            definition_body(kind)
        }
        E::Marker { value, source } => {
            let (code, arg) = mark_source_words(source);
            (K_MARKER, NO_DEVICE, 0, [*value, code, arg, 0, 0])
        }
        E::Dropped {
            device,
            what,
            count,
            bound,
        } => (
            K_DROPPED,
            *device,
            drop_code(*what),
            [*count, *bound, 0, 0, 0],
        ),
        E::Roles { list, count } => (K_ROLES, NO_DEVICE, *list, [*count, 0, 0, 0, 0]),
        E::Role {
            list,
            device,
            addr,
            bytes,
            held,
            module,
        } => (
            K_ROLE,
            *device,
            *list,
            [*addr, *bytes, held_code(*held), *module as u64, 0],
        ),
        E::RolesEnd { list, count } => (K_ROLES_END, NO_DEVICE, *list, [*count, 0, 0, 0, 0]),
        E::Outside(o) => outside_body(o),
        E::Unknown { kind } => (*kind, NO_DEVICE, 0, [0; 5]),
    };
    (one, None)
}

/// STATS_A and STATS_B: the two halves of sample `sample`.
fn stats_bodies(device: u16, sample: u32, s: &Stats) -> [Body; 2] {
    let ooms_segments = (s.ooms & 0xffff_ffff) | (s.segments.min(u32::MAX as u64)) << 32;
    [
        (
            K_STATS_A,
            device,
            sample,
            [
                s.allocated,
                s.reserved,
                s.active,
                s.inactive_split,
                s.requested,
            ],
        ),
        (
            K_STATS_B,
            device,
            sample,
            [
                s.allocated_peak,
                s.reserved_peak,
                s.active_peak,
                s.alloc_retries,
                ooms_segments,
            ],
        ),
    ]
}

/// SNAP_BEGIN, SNAP_SEGMENT, SNAP_BLOCK and SNAP_END.
fn snapshot_body(kind: &EventKind) -> Body {
    match kind {
        EventKind::SnapshotBegin {
            device,
            id,
            segments,
            blocks,
            at,
        } => {
            let [before, after, flags] = span_words(at);
            (
                K_SNAP_BEGIN,
                *device,
                *id,
                [*segments, *blocks, before, after, flags],
            )
        }
        EventKind::SnapshotSegment {
            id,
            place,
            addr,
            size,
            pool_kind,
            expandable,
        } => {
            let flags = (*pool_kind == SegmentPool::Small) as u64 | (*expandable as u64) << 1;
            let (stream, pool) = (place.stream, place.pool);
            let words = [*addr, *size, stream, pool.0, flags | pool.1 << 8];
            (K_SNAP_SEGMENT, place.device, *id, words)
        }
        EventKind::SnapshotBlock {
            id,
            device,
            addr,
            size,
            requested,
            state,
            ctx,
        } => {
            let st = match state {
                BlockState::Allocated => 0,
                BlockState::PendingFree => 1,
                BlockState::Inactive => 2,
            };
            let words = [*addr, *size, *requested, st, ctx.aux() as u64];
            (K_SNAP_BLOCK, *device, *id, words)
        }
        EventKind::SnapshotEnd { device, id } => (K_SNAP_END, *device, *id, [0; 5]),
        _ => unreachable!("not a snapshot record"),
    }
}

/// STRING, FRAME, STACK and CONTEXT: the definitions of 1.1.
fn definition_body(kind: &EventKind) -> Body {
    match kind {
        EventKind::StringChunk {
            id,
            len,
            offset,
            bytes,
        } => string_body(*id, *len, *offset, bytes),
        EventKind::Frame {
            id,
            file,
            function,
            line,
        } => {
            let words = [*file as u64, *function as u64, *line as u64, 0, 0];
            (K_FRAME, NO_DEVICE, *id, words)
        }
        EventKind::Stack { id, frame, parent } => (
            K_STACK,
            NO_DEVICE,
            *id,
            [*frame as u64, *parent as u64, 0, 0, 0],
        ),
        EventKind::Context {
            id,
            module,
            phase,
            stack,
            step,
        } => {
            let given = if step.is_some() {
                CONTEXT_STEP_GIVEN
            } else {
                0
            };
            let words = [
                *module as u64,
                phase_code(*phase),
                step.unwrap_or(0),
                *stack as u64,
                given,
            ];
            (K_CONTEXT, NO_DEVICE, *id, words)
        }
        _ => unreachable!("not a definition record"),
    }
}

/// Turns records back into events. Holds the first half of a statistics
/// sample until its second half arrives; a sample missing either half is
/// dropped (and counted), never half-reported.
#[derive(Debug, Default)]
pub struct Decoder {
    pending_stats: Option<(u16, u32, Words)>,
    /// The last complete sample number of each device, for its STATS_C.
    last_samples: Vec<(u16, u32)>,
    /// Statistics samples dropped because one half was lost.
    pub(crate) dropped_samples: u64,
}

impl Decoder {
    /// Decodes one record. Returns `None` for the first half of a statistics
    /// sample, or for a half that cannot be paired.
    pub fn decode(&mut self, w: &Words) -> Option<Event> {
        let (kind, device, aux) = split_head(w[0]);
        let time_ns = w[1];
        let kind = match kind {
            K_STATS_A => return self.stats_a(device, aux, w),
            K_STATS_B => self.stats_b(device, aux, w)?,
            K_STATS_C => return self.stats_c(device, aux, w),
            _ => stateless(kind, device, aux, w),
        };
        self.drop_pending();
        Some(Event { time_ns, kind })
    }

    /// A pending first half that no second half followed.
    fn drop_pending(&mut self) {
        if self.pending_stats.take().is_some() {
            self.dropped_samples += 1;
        }
    }

    /// STATS_A: held until its STATS_B.
    fn stats_a(&mut self, device: u16, aux: u32, w: &Words) -> Option<Event> {
        if self.pending_stats.replace((device, aux, *w)).is_some() {
            self.dropped_samples += 1;
        }
        None
    }

    /// STATS_B: the sample, if the first half held is its own.
    fn stats_b(&mut self, device: u16, aux: u32, w: &Words) -> Option<EventKind> {
        let Some((d, sample, a)) = self.pending_stats.take() else {
            self.dropped_samples += 1;
            return None;
        };
        if d != device || sample != aux {
            // The first half belongs to another sample: both are incomplete.
            self.dropped_samples += 2;
            return None;
        }
        match self.last_samples.iter_mut().find(|(d, _)| *d == device) {
            Some(last) => last.1 = aux,
            None => self.last_samples.push((device, aux)),
        }
        let stats = Stats {
            allocated: a[2],
            reserved: a[3],
            active: a[4],
            inactive_split: a[5],
            requested: a[6],
            allocated_peak: w[2],
            reserved_peak: w[3],
            active_peak: w[4],
            alloc_retries: w[5],
            ooms: w[6] & 0xffff_ffff,
            segments: w[6] >> 32,
        };
        Some(EventKind::Stats { device, stats })
    }

    /// STATS_C: only for the sample just completed on this ring; a STATS_C
    /// whose halves were lost is dropped with them.
    fn stats_c(&mut self, device: u16, aux: u32, w: &Words) -> Option<Event> {
        let at = span_of(w[2], w[3], w[4]);
        let last = self.last_samples.iter().position(|&l| l == (device, aux));
        self.drop_pending();
        let (at, i) = at.zip(last)?;
        self.last_samples.swap_remove(i);
        Some(Event {
            time_ns: w[1],
            kind: EventKind::StatsPosition { device, at },
        })
    }
}

/// Every record but the statistics ones: each stands alone. Each kind is
/// returned as it is built, and the function is kept out of line so that
/// it builds the event in its caller's slot: a chain of `or_else`
/// closures moved every event through temporaries (callgrind, the
/// GPT-2 job's records: 135 → 100 instructions per record decoded).
#[inline(never)]
fn stateless(kind: u16, device: u16, aux: u32, w: &Words) -> EventKind {
    if let Some(e) = placed_of(kind, place_of(device, aux, w), w) {
        return e;
    }
    if let Some(e) = snapshot_of(kind, device, aux, w) {
        return e;
    }
    if let Some(e) = definition_of(kind, aux, w) {
        return e;
    }
    match kind {
        K_MARKER => EventKind::Marker {
            value: w[2],
            source: mark_source_of(w[3], w[4]),
        },
        K_DROPPED => EventKind::Dropped {
            device,
            what: drop_of(aux),
            count: w[2],
            bound: w[3],
        },
        K_ROLES => EventKind::Roles {
            list: aux,
            count: w[2],
        },
        K_ROLE => EventKind::Role {
            list: aux,
            device,
            addr: w[2],
            bytes: w[3],
            held: held_of(w[4]),
            module: w[5] as u32,
        },
        K_ROLES_END => EventKind::RolesEnd {
            list: aux,
            count: w[2],
        },
        other => outside_of(other, device, aux, w).unwrap_or(EventKind::Unknown { kind: other }),
    }
}

/// The allocator records: a place and two words.
fn placed_of(kind: u16, place: Place, w: &Words) -> Option<EventKind> {
    let (addr, size) = (w[2], w[3]);
    Some(match kind {
        K_ALLOC => EventKind::Alloc { place, addr, size },
        K_FREE_REQUESTED => EventKind::FreeRequested { place, addr, size },
        K_FREE_COMPLETED => EventKind::FreeCompleted { place, addr, size },
        K_SEGMENT_ALLOC => EventKind::SegmentAlloc { place, addr, size },
        K_SEGMENT_FREE => EventKind::SegmentFree { place, addr, size },
        K_SEGMENT_MAP => EventKind::SegmentMap { place, addr, size },
        K_SEGMENT_UNMAP => EventKind::SegmentUnmap { place, addr, size },
        K_OOM => EventKind::Oom {
            place,
            device_free: addr,
            request: size,
        },
        _ => return None,
    })
}

fn snapshot_of(kind: u16, device: u16, aux: u32, w: &Words) -> Option<EventKind> {
    let (id, addr, size) = (aux, w[2], w[3]);
    Some(match kind {
        K_SNAP_BEGIN => EventKind::SnapshotBegin {
            device,
            id,
            segments: w[2],
            blocks: w[3],
            at: span_of(w[4], w[5], w[6]),
        },
        K_SNAP_SEGMENT => EventKind::SnapshotSegment {
            id,
            place: Place {
                device,
                stream: w[4],
                pool: PoolId(w[5], w[6] >> 8),
                ctx: CtxTag::NONE,
            },
            addr,
            size,
            pool_kind: if w[6] & 1 != 0 {
                SegmentPool::Small
            } else {
                SegmentPool::Large
            },
            expandable: w[6] & 2 != 0,
        },
        K_SNAP_BLOCK => EventKind::SnapshotBlock {
            id,
            device,
            addr,
            size,
            requested: w[4],
            state: match w[5] {
                0 => BlockState::Allocated,
                1 => BlockState::PendingFree,
                _ => BlockState::Inactive,
            },
            ctx: CtxTag::from_aux(w[6] as u32),
        },
        K_SNAP_END => EventKind::SnapshotEnd { device, id },
        _ => return None,
    })
}

fn definition_of(kind: u16, id: u32, w: &Words) -> Option<EventKind> {
    Some(match kind {
        K_STRING => EventKind::StringChunk {
            id,
            len: w[2] as u32,
            offset: (w[2] >> 32) as u32,
            bytes: unpack32(&w[3..7]),
        },
        K_FRAME => EventKind::Frame {
            id,
            file: w[2] as u32,
            function: w[3] as u32,
            line: w[4] as u32,
        },
        K_STACK => EventKind::Stack {
            id,
            frame: w[2] as u32,
            parent: w[3] as u32,
        },
        K_CONTEXT => EventKind::Context {
            id,
            module: w[2] as u32,
            phase: phase_of(w[3]),
            stack: w[5] as u32,
            step: (w[6] & CONTEXT_STEP_GIVEN != 0).then_some(w[4]),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Event> {
        let place = Place {
            device: 3,
            stream: 0xdead_beef,
            pool: PoolId(1, 2),
            ctx: CtxTag::NONE,
        };
        let k = vec![
            EventKind::Alloc {
                place,
                addr: 0x7f00_0000_0000,
                size: 4096,
            },
            EventKind::FreeRequested {
                place,
                addr: 1,
                size: 2,
            },
            EventKind::FreeCompleted {
                place,
                addr: 3,
                size: 4,
            },
            EventKind::SegmentAlloc {
                place,
                addr: 5,
                size: 6,
            },
            EventKind::SegmentFree {
                place,
                addr: 7,
                size: 8,
            },
            EventKind::SegmentMap {
                place,
                addr: 9,
                size: 10,
            },
            EventKind::SegmentUnmap {
                place,
                addr: 11,
                size: 12,
            },
            EventKind::Oom {
                place,
                device_free: 13,
                request: 14,
            },
            EventKind::Stats {
                device: 1,
                stats: Stats {
                    allocated: 1,
                    reserved: 2,
                    active: 3,
                    inactive_split: 4,
                    requested: 5,
                    allocated_peak: 6,
                    reserved_peak: 7,
                    active_peak: 8,
                    alloc_retries: 9,
                    ooms: 10,
                    segments: 11,
                },
            },
            EventKind::SnapshotBegin {
                device: 0,
                id: 9,
                segments: 2,
                blocks: 5,
                at: None,
            },
            EventKind::SnapshotSegment {
                id: 9,
                place,
                addr: 100,
                size: 2 << 20,
                pool_kind: SegmentPool::Small,
                expandable: true,
            },
            EventKind::SnapshotBlock {
                id: 9,
                device: 3,
                addr: 100,
                size: 512,
                requested: 500,
                state: BlockState::PendingFree,
                ctx: CtxTag::NONE,
            },
            EventKind::SnapshotEnd { device: 0, id: 9 },
            EventKind::Marker {
                value: 17,
                source: MarkSource::Unknown,
            },
            EventKind::Unknown { kind: 999 },
        ];
        k.into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                time_ns: i as u64 * 10,
                kind,
            })
            .collect()
    }

    /// Each event, encoded as statistics sample `sample`, decodes back to
    /// itself, none dropped.
    fn assert_round_trips(events: Vec<Event>, sample: u32) {
        let mut d = Decoder::default();
        let mut words = Vec::new();
        for e in events {
            words.clear();
            encode(&e, sample, &mut words);
            let back: Vec<Event> = words.iter().filter_map(|w| d.decode(w)).collect();
            assert_eq!(back, vec![e]);
        }
        assert_eq!(d.dropped_samples, 0);
    }

    #[test]
    fn every_kind_round_trips() {
        assert_round_trips(all_kinds(), 7);
    }

    #[test]
    fn half_a_stats_sample_is_dropped_not_reported() {
        let stats = all_kinds()
            .into_iter()
            .find(|e| matches!(e.kind, EventKind::Stats { .. }));
        let mut words = Vec::new();
        encode(&stats.unwrap(), 1, &mut words);
        let mut d = Decoder::default();
        // Only the second half arrives.
        assert_eq!(d.decode(&words[1]), None);
        assert_eq!(d.dropped_samples, 1);
        // First half, then an unrelated record: the half is dropped.
        assert_eq!(d.decode(&words[0]), None);
        let marker = [head(K_MARKER, NO_DEVICE, 0), 0, 5, 0, 0, 0, 0];
        assert!(d.decode(&marker).is_some());
        assert_eq!(d.dropped_samples, 2);
        // Halves of two different samples do not pair.
        let mut other = Vec::new();
        encode(&all_kinds()[8], 2, &mut other);
        assert_eq!(d.decode(&words[0]), None);
        assert_eq!(d.decode(&other[1]), None);
        assert_eq!(d.dropped_samples, 4);
    }
    /// Every 1.1 record, with every new field set.
    pub(crate) fn new_kinds() -> Vec<Event> {
        let tag = CtxTag {
            context: 0x00ab_cdef,
            step_tag: 200,
        };
        let place = Place {
            device: 2,
            stream: 7,
            pool: PoolId(0, 0),
            ctx: tag,
        };
        let span = RingSpan {
            ring: 3,
            before: 1_000,
            after: 1_004,
            exact: false,
            ambiguous: true,
        };
        let mut bytes = [0u8; 32];
        bytes[..20].copy_from_slice(b"transformer.h.3.attn");
        let k = vec![
            EventKind::Alloc {
                place,
                addr: 1 << 40,
                size: 4096,
            },
            EventKind::FreeRequested {
                place,
                addr: 1 << 40,
                size: 4096,
            },
            EventKind::FreeCompleted {
                place,
                addr: 1 << 40,
                size: 4096,
            },
            EventKind::SegmentAlloc {
                place,
                addr: 1 << 40,
                size: 2 << 20,
            },
            EventKind::SegmentFree {
                place,
                addr: 1 << 40,
                size: 2 << 20,
            },
            EventKind::SegmentMap {
                place,
                addr: 1 << 40,
                size: 2 << 20,
            },
            EventKind::SegmentUnmap {
                place,
                addr: 1 << 40,
                size: 2 << 20,
            },
            EventKind::Oom {
                place,
                device_free: 1,
                request: 2,
            },
            EventKind::Marker {
                value: 41,
                source: MarkSource::User,
            },
            EventKind::Marker {
                value: 42,
                source: MarkSource::OptimizerStep { optimizer: 2 },
            },
            EventKind::Marker {
                value: 43,
                source: MarkSource::Inferred,
            },
            EventKind::Marker {
                value: 44,
                source: MarkSource::Other(4),
            },
            EventKind::Marker {
                value: 0,
                source: MarkSource::Run,
            },
            EventKind::Stats {
                device: 2,
                stats: Stats {
                    allocated: 1,
                    reserved: 2,
                    ..Stats::default()
                },
            },
            EventKind::StatsPosition {
                device: 2,
                at: RingSpan {
                    exact: true,
                    ambiguous: false,
                    after: 1_000,
                    ..span
                },
            },
            EventKind::SnapshotBegin {
                device: 2,
                id: 5,
                segments: 1,
                blocks: 1,
                at: Some(span),
            },
            EventKind::SnapshotBlock {
                id: 5,
                device: 2,
                addr: 1 << 40,
                size: 512,
                requested: 500,
                state: BlockState::Allocated,
                ctx: tag,
            },
            EventKind::Dropped {
                device: NO_DEVICE,
                what: DropWhat::ContextIds,
                count: 12,
                bound: CtxTag::MAX_CONTEXT as u64,
            },
            EventKind::Dropped {
                device: 0,
                what: DropWhat::Other(77),
                count: 1,
                bound: 0,
            },
            EventKind::StringChunk {
                id: 1,
                len: 20,
                offset: 0,
                bytes,
            },
            EventKind::Frame {
                id: 1,
                file: 2,
                function: 3,
                line: 118,
            },
            EventKind::Stack {
                id: 4,
                frame: 1,
                parent: 0,
            },
            EventKind::Context {
                id: 0x00ab_cdef,
                module: 1,
                phase: Phase::Backward,
                stack: 4,
                step: None,
            },
            EventKind::Context {
                id: 9,
                module: 0,
                phase: Phase::Other(9),
                stack: 0,
                step: Some(0),
            },
            EventKind::Roles { list: 7, count: 2 },
            EventKind::Role {
                list: 7,
                device: 1,
                addr: 0x7f00_0020_0000,
                bytes: 4 << 20,
                held: Held::OptimizerState,
                module: 12,
            },
            EventKind::Role {
                list: 7,
                device: 0,
                addr: 0x7f00_0040_0000,
                bytes: 512,
                held: Held::Other(77),
                module: 0,
            },
            EventKind::RolesEnd { list: 7, count: 1 },
            // 1.3: outside the caching allocator, a name with an escape.
            EventKind::Outside(Outside {
                op: OutsideOp::Alloc,
                device: 1,
                library: Library::Nccl,
                kind: OutsideKind::Physical,
                addr: 0x7f10_0000_0000,
                bytes: 388 << 20,
                name: *b"libnccl.so.2\x1b[31m\0\0\0\0\0\0\0",
            }),
            EventKind::Outside(Outside {
                op: OutsideOp::Free,
                device: NO_DEVICE,
                library: Library::Other(200),
                kind: OutsideKind::Host,
                addr: 0x5555_0000,
                bytes: 4096,
                name: [0xff; 24],
            }),
            EventKind::Outside(Outside {
                op: OutsideOp::Total,
                device: 0,
                library: Library::Cuda,
                kind: OutsideKind::Other(77),
                addr: 0,
                bytes: (-2i64 << 20) as u64,
                name: [0; 24],
            }),
        ];
        k.into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                time_ns: 1_000 + i as u64,
                kind,
            })
            .collect()
    }

    /// Each event's class is the group FORMAT.md numbers its kind in
    /// (1–15 allocator events, 16–31 statistics, 32–47 snapshots, 48–63
    /// markers and producer notes, 64–79 definitions and roles, 80–95
    /// memory outside the caching allocator), and the
    /// allocator's events are the ones given a place.
    #[test]
    fn every_kind_is_classed_as_the_format_numbers_it() {
        use crate::event::Class as C;
        let mut seen = std::collections::HashSet::new();
        for e in all_kinds().into_iter().chain(new_kinds()) {
            let class = e.kind.class();
            seen.insert(class);
            assert_eq!(e.kind.place().is_some(), class.is_allocator(), "{e:?}");
            let mut words = Vec::new();
            encode(&e, 1, &mut words);
            let (kind, _, _) = split_head(words[0][0]);
            let group = match class {
                C::Block => vec![K_ALLOC, K_FREE_REQUESTED, K_FREE_COMPLETED],
                C::Segment => vec![
                    K_SEGMENT_ALLOC,
                    K_SEGMENT_FREE,
                    K_SEGMENT_MAP,
                    K_SEGMENT_UNMAP,
                ],
                C::Oom => vec![K_OOM],
                C::Stats => vec![K_STATS_A],
                C::StatsPosition => vec![K_STATS_C],
                C::Snapshot => (K_SNAP_BEGIN..=K_SNAP_END).collect(),
                C::Marker => vec![K_MARKER],
                C::Dropped => vec![K_DROPPED],
                C::Definition => vec![K_STRING, K_FRAME, K_STACK, K_CONTEXT],
                C::Role => vec![K_ROLES, K_ROLE, K_ROLES_END],
                C::Outside => vec![K_OUTSIDE_ALLOC, K_OUTSIDE_FREE, K_OUTSIDE_TOTAL],
                C::Unknown => vec![999],
            };
            assert!(group.contains(&kind), "{e:?} is {class:?}, kind {kind}");
        }
        assert_eq!(seen.len(), 12, "a class with no kind here: {seen:?}");
    }

    #[test]
    fn every_new_kind_round_trips() {
        assert_round_trips(new_kinds(), 9);
    }

    /// With every 1.1 field zero, a record is word for word what 1.0 wrote
    /// (the words 1.0 left 0 stay 0).
    #[test]
    fn zero_new_fields_encode_as_one_point_zero() {
        for e in all_kinds() {
            let mut words = Vec::new();
            encode(&e, 7, &mut words);
            for w in &words {
                let (kind, _, aux) = split_head(w[0]);
                match kind {
                    K_ALLOC..=K_SEGMENT_UNMAP | K_OOM | K_MARKER => assert_eq!(aux, 0),
                    _ => {}
                }
                match kind {
                    K_MARKER => assert_eq!(&w[3..], &[0, 0, 0, 0]),
                    K_SNAP_BEGIN => assert_eq!(&w[4..], &[0, 0, 0]),
                    K_SNAP_BLOCK => assert_eq!(w[6], 0),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn stats_position_belongs_to_the_sample_before_it() {
        let news = new_kinds();
        let stats = news
            .iter()
            .find(|e| matches!(e.kind, EventKind::Stats { .. }))
            .unwrap();
        let pos = news
            .iter()
            .find(|e| matches!(e.kind, EventKind::StatsPosition { .. }))
            .unwrap();
        let marker = &news[8];
        let (mut s, mut p, mut m) = (Vec::new(), Vec::new(), Vec::new());
        encode(stats, 3, &mut s);
        encode(pos, 3, &mut p);
        encode(marker, 0, &mut m);
        // A, B, another thread's marker, C: placed.
        let mut d = Decoder::default();
        let got: Vec<_> = [&s[0], &s[1], &m[0], &p[0]]
            .into_iter()
            .filter_map(|w| d.decode(w))
            .collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[2], *pos);
        // C twice: the second is an orphan.
        assert_eq!(d.decode(&p[0]), None);
        // C whose halves were lost (only B arrived): dropped with them.
        let mut d = Decoder::default();
        assert_eq!(d.decode(&s[1]), None);
        assert_eq!(d.decode(&p[0]), None);
        assert_eq!(d.dropped_samples, 1);
        // C of another sample number: dropped.
        let mut other = Vec::new();
        encode(pos, 4, &mut other);
        let mut d = Decoder::default();
        assert!(d.decode(&s[0]).is_none());
        assert!(d.decode(&s[1]).is_some());
        assert_eq!(d.decode(&other[0]), None);
        // A position span that says "not given" is no position.
        let mut bare = p[0];
        bare[4] = 0;
        let mut d = Decoder::default();
        d.decode(&s[0]);
        d.decode(&s[1]);
        assert_eq!(d.decode(&bare), None);
    }

    #[test]
    fn strings_chunk_and_reassemble_in_any_order() {
        let long: String = "αβγ.".repeat(30); // 210 bytes, multi-byte characters
        let mut words = Vec::new();
        encode_string(7, 1, &long, &mut words);
        assert_eq!(words.len(), long.len().div_ceil(STRING_CHUNK));
        let mut d = Decoder::default();
        let mut chunks: Vec<Event> = words.iter().filter_map(|w| d.decode(w)).collect();
        chunks.reverse();
        let mut strings = Strings::default();
        let mut done = 0;
        for c in &chunks {
            if let EventKind::StringChunk {
                id,
                len,
                offset,
                bytes,
            } = &c.kind
            {
                done += strings.add(*id, *len, *offset, bytes) as u32;
            }
        }
        assert_eq!(done, 1);
        assert_eq!(strings.get(7), Some(long.as_str()));
        // Cut at the bound on a character boundary.
        let huge = "é".repeat(STRING_MAX);
        words.clear();
        encode_string(8, 1, &huge, &mut words);
        assert_eq!(words[0][2] as u32 as usize, STRING_MAX);
        // An empty string is one record.
        words.clear();
        encode_string(9, 1, "", &mut words);
        assert_eq!(words.len(), 1);
        let mut s = Strings::default();
        if let Some(Event {
            kind:
                EventKind::StringChunk {
                    id,
                    len,
                    offset,
                    bytes,
                },
            ..
        }) = Decoder::default().decode(&words[0])
        {
            assert!(s.add(id, len, offset, &bytes));
        }
        assert_eq!(s.get(9), Some(""));
    }

    #[test]
    fn ctx_tag_packs_into_aux() {
        let t = CtxTag {
            context: CtxTag::MAX_CONTEXT,
            step_tag: CtxTag::step_tag_of(254),
        };
        assert_eq!(t.step_tag, 255);
        assert_eq!(CtxTag::from_aux(t.aux()), t);
        assert_eq!(CtxTag::step_tag_of(255), 1);
        assert_eq!(CtxTag::from_aux(0), CtxTag::NONE);
    }
}
