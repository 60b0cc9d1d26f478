//! The segment layout of `FORMAT.md`: constants, the header and ring table as
//! plain values, and their validation. Pure code: it parses a private copy of
//! the bytes, never the shared mapping itself.

use super::error::RingError;
use vramscope_text::printable;

/// `VMScope1` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VMScope1");
pub(crate) const MAJOR: u16 = 1;
/// The minor this build writes; it reads every minor of [`MAJOR`]
/// (FORMAT.md, "Versions").
pub const MINOR: u16 = 3;
pub const HEADER_SIZE: usize = 256;
pub(crate) const RING_ENTRY_SIZE: usize = 32;
pub(crate) const RING_HEADER_SIZE: usize = 128;
pub(crate) const SLOT_SIZE: usize = 64;
pub const CONTROL_SIZE: usize = 128;
pub(crate) const MAX_RINGS: usize = 64;
pub(crate) const MAX_SLOTS: u64 = 1 << 24;
/// Payload words per slot (the eighth word is the sequence word).
pub(crate) const PAYLOAD_WORDS: usize = 7;

// Header field offsets.
pub const OFF_MAGIC: usize = 0;
pub const OFF_MAJOR: usize = 8;
pub(crate) const OFF_HEADER_SIZE: usize = 12;
pub(crate) const OFF_SEGMENT_SIZE: usize = 16;
pub const OFF_PID: usize = 24;
pub const OFF_START_TIME: usize = 32;
pub(crate) const OFF_PRODUCER: usize = 40;
pub(crate) const OFF_CREATED_NS: usize = 48;
pub(crate) const OFF_RING_COUNT: usize = 56;
pub(crate) const OFF_CONTROL_OFFSET: usize = 64;
pub(crate) const OFF_HEARTBEAT: usize = 72;
pub const OFF_STATE: usize = 80;
pub(crate) const OFF_FRAMEWORK: usize = 88;
pub(crate) const FRAMEWORK_LEN: usize = 32;
pub const OFF_LABEL: usize = 120;
pub(crate) const LABEL_LEN: usize = 64;

// Ring header offsets (relative to the ring's offset).
pub const RING_OFF_HEAD: usize = 0;
pub(crate) const RING_OFF_DROPPED: usize = 8;

// Control block offsets (relative to the control offset).
pub const CTL_LOCK: usize = 0;
pub(crate) const CTL_LOCK_NS: usize = 8;
pub(crate) const CTL_CMD_SEQ: usize = 16;
pub(crate) const CTL_CMD_KIND: usize = 24;
pub(crate) const CTL_CMD_ARG: usize = 32;
pub(crate) const CTL_POSTED_NS: usize = 40;
pub const CTL_ACK_SEQ: usize = 64;
pub const CTL_STATUS: usize = 72;
pub const CTL_RESULT0: usize = 80;
pub(crate) const CTL_RESULT1: usize = 88;
pub(crate) const CTL_RESULT2: usize = 96;

/// Header `flags` (bits 3 and 4 added in 1.1; a reader ignores bits it does
/// not know).
pub const FLAG_EVENTS: u32 = 1;
/// SNAP_BEGIN and STATS_C records carry ring positions.
pub const FLAG_POSITIONS: u32 = 8;
/// Allocator events carry context tags (CONTEXT records define them).
pub const FLAG_CONTEXTS: u32 = 16;

pub(crate) const STATE_LIVE: u32 = 1;
pub const STATE_CLOSED: u32 = 2;

/// Who writes a segment (header `producer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Producer {
    TorchExact,
    TorchSampled,
    Simulator,
    Test,
    Other(u32),
}

impl Producer {
    pub(crate) fn from_u32(v: u32) -> Self {
        match v {
            1 => Producer::TorchExact,
            2 => Producer::TorchSampled,
            3 => Producer::Simulator,
            4 => Producer::Test,
            v => Producer::Other(v),
        }
    }
    pub(crate) fn as_u32(self) -> u32 {
        match self {
            Producer::TorchExact => 1,
            Producer::TorchSampled => 2,
            Producer::Simulator => 3,
            Producer::Test => 4,
            Producer::Other(v) => v,
        }
    }
}

/// Ring roles (ring table `role`).
pub const ROLE_AGENT: u32 = 0;
pub const ROLE_DEVICE: u32 = 1;

/// One ring table entry, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingEntry {
    pub offset: usize,
    pub slot_count: u64,
    pub role: u32,
    pub device: u32,
}

impl RingEntry {
    pub fn bytes(&self) -> usize {
        RING_HEADER_SIZE + self.slot_count as usize * SLOT_SIZE
    }
}

/// The header and ring table of a segment, parsed from a private copy and
/// checked against every rule of `FORMAT.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub minor: u16,
    pub segment_size: usize,
    pub pid: u32,
    pub uid: u32,
    pub start_time: u64,
    pub producer: Producer,
    pub flags: u32,
    pub created_ns: u64,
    pub control_offset: usize,
    pub framework: String,
    pub label: String,
    pub rings: Vec<RingEntry>,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn text_at(b: &[u8], off: usize, len: usize) -> String {
    let raw = &b[off..off + len];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(len);
    printable(&String::from_utf8_lossy(&raw[..end]))
}

/// The number of bytes a reader must copy to parse a header with `ring_count`
/// rings (the header, the ring table and the control block).
pub fn prefix_len(ring_count: usize) -> usize {
    control_offset_for(ring_count) + CONTROL_SIZE
}

/// Where a writer puts the control block for `ring_count` rings.
pub fn control_offset_for(ring_count: usize) -> usize {
    (HEADER_SIZE + ring_count * RING_ENTRY_SIZE).next_multiple_of(64)
}

/// What a header parse can say before the header is known to be valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// The magic word is still 0: the producer is filling the segment in.
    Initialising,
    Ready(Header),
}

/// Parses and validates the header and ring table from `bytes`, a private
/// copy of the start of a segment whose file is `file_size` bytes long.
/// `bytes` may be shorter than the whole segment but must cover the header;
/// if it does not cover the ring table, the error says how much is needed.
pub fn parse_header(bytes: &[u8], file_size: u64) -> Result<Parsed, RingError> {
    if bytes.len() < HEADER_SIZE || file_size < HEADER_SIZE as u64 {
        return invalid(format!(
            "segment is {file_size} bytes, smaller than the {HEADER_SIZE}-byte header"
        ));
    }
    let magic = u64_at(bytes, OFF_MAGIC);
    if magic == 0 {
        return Ok(Parsed::Initialising);
    }
    if magic != MAGIC {
        return invalid(format!("bad magic {magic:#018x}, not a vramscope segment"));
    }
    let minor = check_version(bytes)?;
    let frame = check_frame(bytes, file_size)?;
    let needed = frame.control_offset + CONTROL_SIZE;
    if bytes.len() < needed {
        return Err(RingError::ShortCopy { needed });
    }
    let mut rings: Vec<RingEntry> = Vec::with_capacity(frame.ring_count);
    for i in 0..frame.ring_count {
        let entry = ring_entry(bytes, i, needed, frame.segment_size)?;
        let (start, end) = (entry.offset, entry.offset + entry.bytes());
        if let Some((j, _)) = rings
            .iter()
            .enumerate()
            .find(|(_, r)| start < r.offset + r.bytes() && r.offset < end)
        {
            return invalid(format!("ring {i} overlaps ring {j}"));
        }
        rings.push(entry);
    }
    Ok(Parsed::Ready(Header {
        minor,
        segment_size: frame.segment_size,
        pid: u32_at(bytes, OFF_PID),
        uid: u32_at(bytes, OFF_PID + 4),
        start_time: u64_at(bytes, OFF_START_TIME),
        producer: Producer::from_u32(u32_at(bytes, OFF_PRODUCER)),
        flags: u32_at(bytes, OFF_PRODUCER + 4),
        created_ns: u64_at(bytes, OFF_CREATED_NS),
        control_offset: frame.control_offset,
        framework: text_at(bytes, OFF_FRAMEWORK, FRAMEWORK_LEN),
        label: text_at(bytes, OFF_LABEL, LABEL_LEN),
        rings,
    }))
}

fn invalid<T>(why: String) -> Result<T, RingError> {
    Err(RingError::Invalid(why))
}

/// The minor version, if the major is the one this build reads.
fn check_version(bytes: &[u8]) -> Result<u16, RingError> {
    let major = u16_at(bytes, OFF_MAJOR);
    let minor = u16_at(bytes, OFF_MAJOR + 2);
    if major != MAJOR {
        return invalid(format!(
            "format version {major}.{minor}, this vramscope reads {MAJOR}.0 to {MAJOR}.{MINOR} \
             (major {MAJOR}): use a vramscope that reads major {major}"
        ));
    }
    Ok(minor)
}

/// The sizes and offsets a header gives, checked against each other.
struct Frame {
    segment_size: usize,
    ring_count: usize,
    control_offset: usize,
}

/// Checks the header size, the segment size, the ring table and where the
/// control block is.
fn check_frame(bytes: &[u8], file_size: u64) -> Result<Frame, RingError> {
    let header_size = u32_at(bytes, OFF_HEADER_SIZE) as usize;
    if header_size != HEADER_SIZE {
        return invalid(format!("header_size {header_size}, expected {HEADER_SIZE}"));
    }
    let segment_size = u64_at(bytes, OFF_SEGMENT_SIZE);
    if segment_size != file_size {
        return invalid(format!(
            "header says {segment_size} bytes but the file has {file_size}"
        ));
    }
    let segment_size = usize::try_from(segment_size)
        .map_err(|_| RingError::Invalid(format!("segment_size {segment_size} too large")))?;
    let ring_count = u32_at(bytes, OFF_RING_COUNT) as usize;
    if ring_count == 0 || ring_count > MAX_RINGS {
        return invalid(format!("ring_count {ring_count}, must be 1 to {MAX_RINGS}"));
    }
    let table = u32_at(bytes, OFF_RING_COUNT + 4) as usize;
    if table != HEADER_SIZE {
        return invalid(format!("ring_table_offset {table}, expected {HEADER_SIZE}"));
    }
    let control_offset = u32_at(bytes, OFF_CONTROL_OFFSET) as usize;
    let control_size = u32_at(bytes, OFF_CONTROL_OFFSET + 4) as usize;
    let table_end = table + ring_count * RING_ENTRY_SIZE;
    if control_size != CONTROL_SIZE
        || control_offset % 64 != 0
        || control_offset < table_end
        || control_offset + CONTROL_SIZE > segment_size
    {
        return invalid(format!(
            "control block at {control_offset} ({control_size} bytes) does not fit \
             between the ring table end {table_end} and the segment end {segment_size}"
        ));
    }
    Ok(Frame {
        segment_size,
        ring_count,
        control_offset,
    })
}

/// Ring table entry `i`, checked to lie within `needed..segment_size`.
fn ring_entry(
    bytes: &[u8],
    i: usize,
    needed: usize,
    segment_size: usize,
) -> Result<RingEntry, RingError> {
    let e = HEADER_SIZE + i * RING_ENTRY_SIZE;
    let offset = u64_at(bytes, e);
    let slot_count = u32_at(bytes, e + 8) as u64;
    let slot_size = u32_at(bytes, e + 12) as usize;
    let role = u32_at(bytes, e + 16);
    let device = u32_at(bytes, e + 20);
    if slot_size != SLOT_SIZE {
        return invalid(format!(
            "ring {i}: slot_size {slot_size}, expected {SLOT_SIZE}"
        ));
    }
    check_slot_count(i, slot_count)?;
    if offset % 128 != 0 {
        return invalid(format!("ring {i}: offset {offset} is not 128-aligned"));
    }
    let entry = RingEntry {
        offset: offset as usize,
        slot_count,
        role,
        device,
    };
    let end = entry.offset.checked_add(entry.bytes());
    if entry.offset < needed || end.is_none_or(|end| end > segment_size) {
        return invalid(format!(
            "ring {i}: bytes {offset}..+{} fall outside the ring area {needed}..{segment_size}",
            entry.bytes()
        ));
    }
    Ok(entry)
}

fn check_slot_count(i: usize, slot_count: u64) -> Result<(), RingError> {
    if !(2..=MAX_SLOTS).contains(&slot_count) || !slot_count.is_power_of_two() {
        return invalid(format!(
            "ring {i}: slot_count {slot_count} is not a power of two in 2..={MAX_SLOTS}"
        ));
    }
    Ok(())
}

/// Lays out rings, given as `(slot_count, role, device)`, after the control
/// block; returns the ring entries and the total segment size.
pub fn plan(rings: &[(u64, u32, u32)]) -> Result<(Vec<RingEntry>, usize), RingError> {
    if rings.is_empty() || rings.len() > MAX_RINGS {
        return invalid(format!(
            "a segment needs 1 to {MAX_RINGS} rings, not {}",
            rings.len()
        ));
    }
    let mut at = prefix_len(rings.len()).next_multiple_of(4096);
    let mut out = Vec::with_capacity(rings.len());
    for (i, &(slot_count, role, device)) in rings.iter().enumerate() {
        check_slot_count(i, slot_count)?;
        let entry = RingEntry {
            offset: at,
            slot_count,
            role,
            device,
        };
        at = (at + entry.bytes()).next_multiple_of(4096);
        out.push(entry);
    }
    Ok((out, at))
}

/// Serialises a header and ring table (everything but `magic`, which the
/// writer stores last) into `buf`, which must be `prefix_len` bytes long.
pub fn encode_header(h: &Header, buf: &mut [u8]) {
    let put = |buf: &mut [u8], off: usize, v: &[u8]| buf[off..off + v.len()].copy_from_slice(v);
    buf.fill(0);
    put(buf, OFF_MAJOR, &MAJOR.to_le_bytes());
    put(buf, OFF_MAJOR + 2, &h.minor.to_le_bytes());
    put(buf, OFF_HEADER_SIZE, &(HEADER_SIZE as u32).to_le_bytes());
    put(
        buf,
        OFF_SEGMENT_SIZE,
        &(h.segment_size as u64).to_le_bytes(),
    );
    put(buf, OFF_PID, &h.pid.to_le_bytes());
    put(buf, OFF_PID + 4, &h.uid.to_le_bytes());
    put(buf, OFF_START_TIME, &h.start_time.to_le_bytes());
    put(buf, OFF_PRODUCER, &h.producer.as_u32().to_le_bytes());
    put(buf, OFF_PRODUCER + 4, &h.flags.to_le_bytes());
    put(buf, OFF_CREATED_NS, &h.created_ns.to_le_bytes());
    put(buf, OFF_RING_COUNT, &(h.rings.len() as u32).to_le_bytes());
    put(buf, OFF_RING_COUNT + 4, &(HEADER_SIZE as u32).to_le_bytes());
    put(
        buf,
        OFF_CONTROL_OFFSET,
        &(h.control_offset as u32).to_le_bytes(),
    );
    put(
        buf,
        OFF_CONTROL_OFFSET + 4,
        &(CONTROL_SIZE as u32).to_le_bytes(),
    );
    let text = |buf: &mut [u8], off: usize, len: usize, s: &str| {
        let mut n = s.len().min(len - 1);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        buf[off..off + n].copy_from_slice(&s.as_bytes()[..n]);
    };
    text(buf, OFF_FRAMEWORK, FRAMEWORK_LEN, &h.framework);
    text(buf, OFF_LABEL, LABEL_LEN, &h.label);
    for (i, r) in h.rings.iter().enumerate() {
        let e = HEADER_SIZE + i * RING_ENTRY_SIZE;
        put(buf, e, &(r.offset as u64).to_le_bytes());
        put(buf, e + 8, &(r.slot_count as u32).to_le_bytes());
        put(buf, e + 12, &(SLOT_SIZE as u32).to_le_bytes());
        put(buf, e + 16, &r.role.to_le_bytes());
        put(buf, e + 20, &r.device.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_made_printable() {
        assert_eq!(printable("train.py é ✓"), "train.py é ✓");
        let p = printable("a\x1b[2J\r\nb\u{9b}1m\u{202e}c\u{2028}\x07\x7f");
        assert!(!p
            .chars()
            .any(|c| c.is_control() || c == '\u{202e}' || c == '\u{2028}'));
        assert!(p.starts_with('a') && p.contains('b') && p.contains('c'));
    }

    fn sample() -> (Header, Vec<u8>) {
        let (rings, size) = plan(&[(64, ROLE_AGENT, u32::MAX), (128, ROLE_DEVICE, 0)]).unwrap();
        let h = Header {
            minor: MINOR,
            segment_size: size,
            pid: 42,
            uid: 1000,
            start_time: 777,
            producer: Producer::Test,
            flags: 3,
            created_ns: 5,
            control_offset: control_offset_for(rings.len()),
            framework: "torch 2.11.0+cu130".into(),
            label: "train.py".into(),
            rings,
        };
        let mut buf = vec![0u8; prefix_len(h.rings.len())];
        encode_header(&h, &mut buf);
        buf[..8].copy_from_slice(&MAGIC.to_le_bytes());
        (h, buf)
    }

    #[test]
    fn round_trip() {
        let (h, buf) = sample();
        assert_eq!(
            parse_header(&buf, h.segment_size as u64).unwrap(),
            Parsed::Ready(h)
        );
    }

    #[test]
    fn zero_magic_is_initialising() {
        let (h, mut buf) = sample();
        buf[..8].fill(0);
        assert_eq!(
            parse_header(&buf, h.segment_size as u64).unwrap(),
            Parsed::Initialising
        );
    }

    fn err(buf: &[u8], size: u64) -> String {
        parse_header(buf, size).unwrap_err().to_string()
    }

    #[test]
    fn refusals_name_the_problem() {
        let (h, buf) = sample();
        let size = h.segment_size as u64;
        let mut b = buf.clone();
        b[0] = b'X';
        assert!(err(&b, size).contains("bad magic"));
        let mut b = buf.clone();
        b[OFF_MAJOR] = 2;
        b[OFF_MAJOR + 2] = 0;
        assert!(err(&b, size).contains("format version 2.0"));
        assert!(
            err(&b, size).contains("reads 1.0 to 1.3"),
            "{}",
            err(&b, size)
        );
        assert!(err(&buf, size + 1).contains("the file has"));
        let mut b = buf.clone();
        b[OFF_RING_COUNT] = 0;
        assert!(err(&b, size).contains("ring_count 0"));
        let mut b = buf.clone();
        b[HEADER_SIZE + 8] = 3; // slot_count 3
        assert!(err(&b, size).contains("not a power of two"));
        let mut b = buf.clone();
        // ring 1 placed on top of ring 0
        let r0 = h.rings[0].offset as u64;
        b[HEADER_SIZE + RING_ENTRY_SIZE..HEADER_SIZE + RING_ENTRY_SIZE + 8]
            .copy_from_slice(&r0.to_le_bytes());
        assert!(err(&b, size).contains("overlaps ring 0"));
        let mut b = buf.clone();
        b[HEADER_SIZE..HEADER_SIZE + 8].copy_from_slice(&(size - 64).to_le_bytes());
        let e = err(&b, size);
        assert!(
            e.contains("not 128-aligned") || e.contains("outside"),
            "{e}"
        );
        let mut b = buf.clone();
        b[OFF_CONTROL_OFFSET..OFF_CONTROL_OFFSET + 4].copy_from_slice(&64u32.to_le_bytes());
        assert!(err(&b, size).contains("control block"));
        assert!(err(&buf[..100], size).contains("smaller than"));
    }

    #[test]
    fn short_copy_asks_for_more() {
        let (h, buf) = sample();
        let e = parse_header(&buf[..HEADER_SIZE], h.segment_size as u64).unwrap_err();
        assert!(matches!(e, RingError::ShortCopy { needed } if needed == buf.len()));
    }
}
