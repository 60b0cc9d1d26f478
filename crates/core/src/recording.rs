//! Recordings: everything the hub was fed (NVML readings, processes, their
//! allocator events, losses), with the collector's time, in a versioned
//! file that `vramscope replay` feeds back at any speed.
//!
//! # File format, version 1.2
//!
//! All integers little-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `VSCOPREC` |
//! | 2 | major version (1); a reader refuses another major |
//! | 2 | minor version (2; 1 before peak resets were inputs, 0 in files of vramscope 0.1.0) |
//! | 4 | flags, 0 (a minor may define bits; readers ignore bits they do not know) |
//!
//! Then frames until the end of the file:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | `len`: bytes that follow in this frame (kind + time + payload) |
//! | 1 | `kind` |
//! | 8 | `time_ns`: the recorder's `CLOCK_MONOTONIC` when the input was applied |
//! | len − 9 | payload |
//!
//! Kinds:
//!
//! - 1, **input**: the payload is one [`Input`] as JSON, of a variant that
//!   format 1.0 knew (`Attach`, `Gone`, `Forget`, `Machine`, `Problems`;
//!   `Events` go into kind 2).
//! - 2, **events**: `pid` u32, `start_time` u64, `delivered` u64, `lost` u64,
//!   `lost_now` u64, `count` u32, then `count` records of 56 bytes: the seven
//!   payload words of the wire format (`crates/wire/src/ring/FORMAT.md`, "Records"); a
//!   statistics sample is two adjacent records (STATS_A, STATS_B), and its
//!   STATS_C, if any, follows later in the same frame or a later one of the
//!   same process. Sample numbers (`aux`) count a process's samples.
//! - 3, **positions** (1.1): where the records of the events frame just
//!   before it sat in their rings. `pid` u32, `start_time` u64 (the same
//!   process as that frame), `runs` u32, then `runs` runs of 16 bytes:
//!   `ring` u32 (index in the ring table), `count` u32, `first` u64. The runs
//!   cover the records of the events frame in order: the next `count`
//!   records sat at positions `first`, `first + 1`, … of ring `ring`; their
//!   counts sum to the frame's record count. Positions no run covers were
//!   not delivered (skipped, lost — the events frame's counters say how many
//!   were lost — or records that decode to no event). A positions frame that
//!   does not follow an events frame of its process is skipped.
//! - 4, **input, added after 1.0** (1.1): like kind 1, for variants that 1.0
//!   did not know (`Dropped`; `PeaksReset`, 1.2; and those of later minors).
//!
//! ## Versions
//!
//! A minor version only adds, so that every reader of the major replays
//! every file of it: a reader of an older minor gets the same figures from
//! a newer file, only less detail. A minor may add:
//!
//! - frame kinds: readers skip kinds they do not know (that is how 1.0
//!   readers skip kinds 3 and 4);
//! - JSON fields in existing inputs: absent means the default ("not
//!   given"), and readers ignore fields they do not know (serde's default;
//!   `Input` must never deny unknown fields). In Rust every added field
//!   carries `#[serde(default)]`;
//! - `Input` variants, in frames of kind 4 only: a reader of 1.1 or later
//!   skips a variant it does not know, in kind 1 or kind 4, and counts it
//!   ([`Replayer::skipped_inputs`]), never an error. (1.0 readers fail on an
//!   unknown variant in kind 1, which is why new variants go into kind 4.)
//! - meanings in the event records, as the segment format's minors do.
//!
//! A major version is anything else (a new frame header, a changed meaning);
//! a reader refuses another major with one line naming the file and both
//! versions.
//!
//! ## Changelog
//!
//! - **1.2**: `Input::PeaksReset` (a process reset its peak statistics; the
//!   peaks the model tracks of it start again), in frames of kind 4. A 1.1
//!   reader skips and counts it, a 1.0 reader skips the frame kind: their
//!   replays show the block map's peaks since the start, as every replay
//!   did before (the process's own statistics carry its reset either way).
//!   Nothing else changed.
//! - **1.1**: `Attach.watch` ([`Watch`](crate::model::Watch): when watching began, whether it
//!   began mid-run, the per-ring start positions, the anchor snapshot);
//!   `Events.at` (the ring position of every event) written as a positions
//!   frame (kind 3) after its events frame; `Input::Dropped` (what a bound
//!   of the collector or model dropped) in frames of kind 4; event records
//!   of segment format 1.1 (STATS_C, MARKER sources, context tags, DROPPED,
//!   definitions) inside events frames; readers tolerate unknown inputs.
//! - **1.0**: vramscope 0.1.0 (`tests/fixtures/recordings/v1.0-demo-leak.vsrec`).
//!
//! [`census`]: the processes a recording holds, and which one a command
//! takes (`--pid`, else the most allocator events).

pub mod census;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::input::{EventBatch, Input};
use crate::model::ProcessKey;
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{Event, EventKind};
use vramscope_wire::ring::codec::{encode, Decoder, Words};

pub const MAGIC: &[u8; 8] = b"VSCOPREC";
pub const MAJOR: u16 = 1;
pub(crate) const MINOR: u16 = 2;
const KIND_INPUT: u8 = 1;
const KIND_EVENTS: u8 = 2;
const KIND_POSITIONS: u8 = 3;
const KIND_INPUT_NEW: u8 = 4;
const MAX_FRAME: u32 = 1 << 30;

/// What can go wrong reading a recording: always names the file, and the
/// byte offset where the problem starts.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: at offset {offset}: {why}")]
    Bad {
        path: PathBuf,
        offset: u64,
        why: String,
    },
}

/// Writes a recording.
pub struct Recorder {
    out: BufWriter<File>,
    words: Vec<Words>,
    /// Statistics samples numbered per process, so that a STATS_C written in
    /// a later frame still names its sample.
    samples: HashMap<ProcessKey, u32>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Self, RecordingError> {
        let io = |e| RecordingError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        out.write_all(MAGIC).map_err(io)?;
        out.write_all(&MAJOR.to_le_bytes()).map_err(io)?;
        out.write_all(&MINOR.to_le_bytes()).map_err(io)?;
        out.write_all(&0u32.to_le_bytes()).map_err(io)?;
        Ok(Recorder {
            out,
            words: Vec::new(),
            samples: HashMap::new(),
        })
    }

    fn frame(&mut self, kind: u8, time_ns: u64, payload: &[u8]) -> std::io::Result<()> {
        let len = u32::try_from(payload.len() + 9)
            .ok()
            .filter(|&l| l <= MAX_FRAME)
            .ok_or_else(|| std::io::Error::other("frame too large"))?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&[kind])?;
        self.out.write_all(&time_ns.to_le_bytes())?;
        self.out.write_all(payload)
    }

    /// Appends one input.
    pub fn write(&mut self, time_ns: u64, input: &Input) -> std::io::Result<()> {
        let Input::Events(EventBatch {
            key,
            events,
            delivered,
            lost,
            lost_now,
            at,
        }) = input
        else {
            let json = serde_json::to_vec(input).map_err(std::io::Error::other)?;
            let kind = if input.known_to_1_0() {
                KIND_INPUT
            } else {
                KIND_INPUT_NEW
            };
            return self.frame(kind, time_ns, &json);
        };
        if !at.is_empty() && at.len() != events.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} positions for {} events", at.len(), events.len()),
            ));
        }
        let runs = self.encode_events(*key, events, at);
        let mut p = Vec::with_capacity(40 + self.words.len() * 56);
        p.extend_from_slice(&key.pid.to_le_bytes());
        p.extend_from_slice(&key.start_time.to_le_bytes());
        p.extend_from_slice(&delivered.to_le_bytes());
        p.extend_from_slice(&lost.to_le_bytes());
        p.extend_from_slice(&lost_now.to_le_bytes());
        p.extend_from_slice(&(self.words.len() as u32).to_le_bytes());
        for w in &self.words {
            for v in w {
                p.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.frame(KIND_EVENTS, time_ns, &p)?;
        if runs.is_empty() {
            return Ok(());
        }
        let mut p = Vec::with_capacity(16 + runs.len() * 16);
        p.extend_from_slice(&key.pid.to_le_bytes());
        p.extend_from_slice(&key.start_time.to_le_bytes());
        p.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for (ring, count, first) in runs {
            p.extend_from_slice(&ring.to_le_bytes());
            p.extend_from_slice(&count.to_le_bytes());
            p.extend_from_slice(&first.to_le_bytes());
        }
        self.frame(KIND_POSITIONS, time_ns, &p)
    }

    /// Encodes `events` into `self.words`; returns the runs `(ring, count,
    /// first)` of ring positions of the records, in order (none if `at` is
    /// empty).
    fn encode_events(
        &mut self,
        key: ProcessKey,
        events: &[Event],
        at: &[RingPos],
    ) -> Vec<(u32, u32, u64)> {
        self.words.clear();
        let mut runs: Vec<(u32, u32, u64)> = Vec::new();
        let sample = self.samples.entry(key).or_insert(0);
        for (i, e) in events.iter().enumerate() {
            if matches!(e.kind, EventKind::Stats { .. }) {
                *sample = sample.wrapping_add(1);
            }
            let before = self.words.len();
            encode(e, *sample, &mut self.words);
            let n = (self.words.len() - before) as u64;
            if let Some(p) = at.get(i) {
                let first = (p.position + 1).saturating_sub(n);
                match runs.last_mut() {
                    Some((r, c, f)) if *r == p.ring && *f + *c as u64 == first => *c += n as u32,
                    _ => runs.push((p.ring, n as u32, first)),
                }
            }
        }
        runs
    }

    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Moves a recorded input onto another clock: every time in it (event
/// times, the NVML sample time, when watching began) goes through `map`.
/// `replay --ui` maps the recording onto this machine's monotonic clock at
/// the playback speed.
pub fn retime(input: &mut Input, map: &impl Fn(u64) -> u64) {
    match input {
        Input::Events(b) => {
            for e in &mut b.events {
                e.time_ns = map(e.time_ns);
            }
        }
        Input::Machine { machine, .. } => {
            machine.sampled_ns = machine.sampled_ns.map(map);
        }
        Input::Attach { watch, .. } => {
            watch.began_ns = watch.began_ns.map(map);
        }
        _ => {}
    }
}

/// Reads a recording frame by frame.
///
/// A file that ends inside a frame (a recorder killed mid-write, a disk
/// that filled, a copy cut short) is read up to its last complete frame:
/// the torn frame ends the file as a clean end would, and where it
/// stopped is said once on standard error (once for all the readings of
/// one file that [`Replayer::again`] makes).
pub struct Replayer {
    input: BufReader<Box<dyn Read + Send>>,
    /// What the bytes come from, to read them again ([`Replayer::again`]).
    bytes: Option<Arc<[u8]>>,
    path: PathBuf,
    offset: u64,
    minor: u16,
    /// A frame read ahead (to see whether positions follow an events frame).
    ahead: Option<Frame>,
    decoders: HashMap<ProcessKey, Decoder>,
    skipped_inputs: u64,
    /// Complete frames read.
    frames: u64,
    cut: Option<CutShort>,
    /// Whether a torn end was said already (shared by every reading of
    /// the file [`Replayer::again`] makes); `None`: never said.
    said: Option<Arc<AtomicBool>>,
}

/// Where a recording cut short stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CutShort {
    /// The byte offset of the torn frame (everything before it was read).
    pub(crate) offset: u64,
    /// The complete frames before it.
    pub(crate) frames: u64,
    /// What is there of the torn frame.
    pub(crate) why: String,
}

struct Frame {
    at: u64,
    kind: u8,
    time: u64,
    payload: Vec<u8>,
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}
fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Parses one input frame's JSON. `Ok(None)`: a variant this build does not
/// know (a later minor's), to be skipped.
fn parse_input(payload: &[u8]) -> Result<Option<Input>, String> {
    let v: serde_json::Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    let name = match &v {
        serde_json::Value::Object(m) if m.len() == 1 => m.keys().next().cloned(),
        serde_json::Value::String(s) => Some(s.clone()),
        _ => None,
    };
    if let Some(n) = name {
        if !Input::VARIANTS.contains(&n.as_str()) {
            return Ok(None);
        }
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(|e| e.to_string())
}

impl Replayer {
    pub fn open(path: &Path) -> Result<Self, RecordingError> {
        let file = File::open(path).map_err(|e| RecordingError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::start(path, Box::new(file), None)
    }

    /// A recording held in memory (read once from a pipe), named `path`
    /// in what is said of it.
    pub fn from_bytes(path: &Path, bytes: Arc<[u8]>) -> Result<Self, RecordingError> {
        let input = Box::new(std::io::Cursor::new(bytes.clone()));
        Self::start(path, input, Some(bytes))
    }

    fn start(
        path: &Path,
        input: Box<dyn Read + Send>,
        bytes: Option<Arc<[u8]>>,
    ) -> Result<Self, RecordingError> {
        let mut r = Replayer {
            input: BufReader::new(input),
            bytes,
            path: path.to_path_buf(),
            offset: 0,
            minor: 0,
            ahead: None,
            decoders: HashMap::new(),
            skipped_inputs: 0,
            frames: 0,
            cut: None,
            said: Some(Arc::new(AtomicBool::new(false))),
        };
        let mut head = [0u8; 16];
        let n = r.read_up_to(&mut head)?;
        if n < 16 {
            return Err(r.bad(
                0,
                format!("{n} bytes, shorter than the 16-byte file header"),
            ));
        }
        if &head[..8] != MAGIC {
            return Err(r.bad(0, "not a vramscope recording (bad magic)".into()));
        }
        let major = u16::from_le_bytes([head[8], head[9]]);
        let minor = u16::from_le_bytes([head[10], head[11]]);
        if major != MAJOR {
            return Err(r.bad(
                8,
                format!(
                    "format version {major}.{minor}; this vramscope reads {MAJOR}.0 to \
                     {MAJOR}.{MINOR} (major {MAJOR}): upgrade it"
                ),
            ));
        }
        r.minor = minor;
        r.offset = 16;
        Ok(r)
    }

    /// The file's minor version.
    pub fn minor(&self) -> u16 {
        self.minor
    }

    /// The same file from its start, for another reading (`diff`, `sim`
    /// and `replay --ui` read a recording more than once): a torn end is
    /// said once for all of them.
    pub fn again(&self) -> Result<Self, RecordingError> {
        let mut r = match &self.bytes {
            Some(b) => Replayer::from_bytes(&self.path, b.clone())?,
            None => Replayer::open(&self.path)?,
        };
        r.said.clone_from(&self.said);
        Ok(r)
    }

    /// Says nothing on standard error of a torn end (the fuzz targets,
    /// tests).
    pub fn quiet(mut self) -> Self {
        self.said = None;
        self
    }

    /// The file ends inside the frame at `at`: the end of the reading.
    fn torn(&mut self, at: u64, why: String) -> Option<Frame> {
        let cut = CutShort {
            offset: at,
            frames: self.frames,
            why,
        };
        if let Some(said) = &self.said {
            if !said.swap(true, Ordering::Relaxed) {
                vramscope_text::stderr_line(format_args!(
                    "vramscope: {}: cut short at byte {}, after {} complete frames ({}): read up to there",
                    self.path.display(),
                    cut.offset,
                    cut.frames,
                    cut.why
                ));
            }
        }
        self.cut = Some(cut);
        None
    }

    /// Inputs skipped so far because this build does not know their
    /// variant (a later minor's).
    pub fn skipped_inputs(&self) -> u64 {
        self.skipped_inputs
    }

    fn bad(&self, offset: u64, why: String) -> RecordingError {
        RecordingError::Bad {
            path: self.path.clone(),
            offset,
            why,
        }
    }

    fn read_up_to(&mut self, buf: &mut [u8]) -> Result<usize, RecordingError> {
        let mut n = 0;
        while n < buf.len() {
            match self.input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(RecordingError::Io {
                        path: self.path.clone(),
                        source: e,
                    })
                }
            }
        }
        Ok(n)
    }

    fn read_frame(&mut self) -> Result<Option<Frame>, RecordingError> {
        if let Some(f) = self.ahead.take() {
            return Ok(Some(f));
        }
        if self.cut.is_some() {
            return Ok(None);
        }
        let at = self.offset;
        let mut len = [0u8; 4];
        match self.read_up_to(&mut len)? {
            0 => return Ok(None),
            4 => {}
            n => return Ok(self.torn(at, format!("{n} of the 4 bytes of a frame header"))),
        }
        let len = u32_le(&len);
        if !(9..=MAX_FRAME).contains(&len) {
            return Err(self.bad(at, format!("frame length {len} is out of range")));
        }
        // Read as it comes, never more than is there: a length that
        // announces more than the file holds costs what the file holds.
        let mut body = Vec::with_capacity((len as usize).min(1 << 20));
        let n = std::io::Read::by_ref(&mut self.input)
            .take(u64::from(len))
            .read_to_end(&mut body)
            .map_err(|e| RecordingError::Io {
                path: self.path.clone(),
                source: e,
            })?;
        if n < len as usize {
            return Ok(self.torn(at, format!("a frame of {len} bytes announced, {n} present")));
        }
        self.frames += 1;
        self.offset = at + 4 + len as u64;
        let kind = body[0];
        let time = u64_le(&body[1..9]);
        body.drain(..9);
        Ok(Some(Frame {
            at,
            kind,
            time,
            payload: body,
        }))
    }

    /// The next input and its time, `None` at a clean end of file.
    pub fn next_input(&mut self) -> Result<Option<(u64, Input)>, RecordingError> {
        while let Some(f) = self.read_frame()? {
            match f.kind {
                KIND_INPUT | KIND_INPUT_NEW => match parse_input(&f.payload) {
                    Ok(Some(input)) => return Ok(Some((f.time, input))),
                    Ok(None) => self.skipped_inputs += 1,
                    Err(e) => return Err(self.bad(f.at, format!("bad input frame: {e}"))),
                },
                KIND_EVENTS => {
                    let (input, sources) = self.events(f.at, &f.payload)?;
                    // `events` checked the frame holds exactly this many.
                    let records = (f.payload.len() - 40) / 56;
                    return self
                        .with_positions(f.time, input, sources, records)
                        .map(Some);
                }
                // A newer minor's frame, or positions without their events: skip.
                _ => continue,
            }
        }
        Ok(None)
    }

    /// Reads ahead: if a positions frame of the same process follows, gives
    /// each event its ring position.
    fn with_positions(
        &mut self,
        time: u64,
        mut input: Input,
        sources: Vec<u32>,
        frame_records: usize,
    ) -> Result<(u64, Input), RecordingError> {
        let Input::Events(EventBatch { key, at, .. }) = &mut input else {
            return Ok((time, input));
        };
        let Some(next) = self.read_frame()? else {
            return Ok((time, input));
        };
        if next.kind != KIND_POSITIONS {
            self.ahead = Some(next);
            return Ok((time, input));
        }
        let p = &next.payload;
        let bad = |why: &str| self.bad(next.at, format!("bad positions frame: {why}"));
        if p.len() < 16 {
            return Err(bad("shorter than its 16-byte header"));
        }
        if u32_le(p) != key.pid || u64_le(&p[4..]) != key.start_time {
            return Ok((time, input)); // not this frame's: skipped
        }
        let runs = u32_le(&p[12..]) as usize;
        if p.len() != 16 + runs * 16 {
            return Err(bad(&format!("{runs} runs in {} bytes", p.len())));
        }
        // The ring position of every record of the events frame: never
        // more than the frame holds (a crafted count must not allocate).
        let mut positions: Vec<RingPos> = Vec::with_capacity(frame_records);
        for r in p[16..].chunks_exact(16) {
            let (ring, count, first) = (u32_le(r), u32_le(&r[4..]) as u64, u64_le(&r[8..]));
            if positions.len() as u64 + count > frame_records as u64 {
                return Err(bad(&format!(
                    "positions for more than the {frame_records} records of its events frame"
                )));
            }
            if first.checked_add(count).is_none() {
                return Err(bad(&format!(
                    "a run of {count} from position {first} overflows"
                )));
            }
            positions.extend((0..count).map(|i| RingPos {
                ring,
                position: first + i,
            }));
        }
        let records = sources.iter().max().map_or(0, |&m| m as usize + 1);
        if positions.len() < records {
            return Err(bad(&format!(
                "{} positions for at least {records} records",
                positions.len()
            )));
        }
        *at = sources.iter().map(|&j| positions[j as usize]).collect();
        Ok((time, input))
    }

    /// Decodes an events frame; also returns, for each event, the index of
    /// the record that completed it.
    fn events(&mut self, at: u64, p: &[u8]) -> Result<(Input, Vec<u32>), RecordingError> {
        if p.len() < 40 {
            return Err(self.bad(at, "events frame shorter than its 40-byte header".into()));
        }
        let key = ProcessKey {
            pid: u32_le(p),
            start_time: u64_le(&p[4..]),
        };
        let (delivered, lost, lost_now) = (u64_le(&p[12..]), u64_le(&p[20..]), u64_le(&p[28..]));
        let count = u32_le(&p[36..]) as usize;
        let recs = &p[40..];
        if recs.len() != count * 56 {
            return Err(self.bad(
                at,
                format!(
                    "events frame announces {count} records but holds {} bytes",
                    recs.len()
                ),
            ));
        }
        let d = self.decoders.entry(key).or_default();
        let mut events: Vec<Event> = Vec::with_capacity(count);
        let mut sources: Vec<u32> = Vec::with_capacity(count);
        for (j, r) in recs.chunks_exact(56).enumerate() {
            let mut w = [0u64; 7];
            for (i, v) in w.iter_mut().enumerate() {
                *v = u64_le(&r[i * 8..]);
            }
            if let Some(e) = d.decode(&w) {
                events.push(e);
                sources.push(j as u32);
            }
        }
        Ok((
            Input::Events(EventBatch {
                key,
                events,
                delivered,
                lost,
                lost_now,
                at: Vec::new(),
            }),
            sources,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::Machine;
    use crate::input::{Identity, Source};
    use crate::model::Mode;
    use crate::model::Watch;
    use vramscope_wire::event::{EventKind, Place, RingSpan, Stats};

    fn key() -> ProcessKey {
        ProcessKey {
            pid: 7,
            start_time: 9,
        }
    }

    fn ev(t: u64, kind: EventKind) -> Event {
        Event { time_ns: t, kind }
    }

    /// Events from two rings, interleaved, with a statistics sample whose
    /// STATS_C comes in the next frame, and their ring positions.
    fn positioned() -> (Input, Input) {
        let place = Place::default();
        let stats = EventKind::Stats {
            device: 0,
            stats: Stats {
                allocated: 4096,
                ..Stats::default()
            },
        };
        let at = |ring, position| RingPos { ring, position };
        let a = Input::Events(EventBatch {
            key: key(),
            events: vec![
                ev(
                    1,
                    EventKind::Alloc {
                        place,
                        addr: 1 << 30,
                        size: 4096,
                    },
                ),
                ev(2, stats),
                ev(
                    3,
                    EventKind::Alloc {
                        place,
                        addr: 2 << 30,
                        size: 512,
                    },
                ),
                ev(
                    4,
                    EventKind::FreeRequested {
                        place,
                        addr: 2 << 30,
                        size: 512,
                    },
                ),
                ev(5, stats),
            ],
            delivered: 7,
            lost: 3,
            lost_now: 3,
            // Ring 1 positions 10, (gap) 14, 15; ring 0: 3 (4 is STATS_B), 6.
            at: vec![at(1, 10), at(0, 4), at(1, 14), at(1, 15), at(0, 6)],
        });
        let b = Input::Events(EventBatch {
            key: key(),
            events: vec![ev(
                6,
                EventKind::StatsPosition {
                    device: 0,
                    at: RingSpan {
                        ring: 1,
                        before: 15,
                        after: 16,
                        exact: false,
                        ambiguous: true,
                    },
                },
            )],
            delivered: 8,
            lost: 3,
            lost_now: 0,
            at: vec![at(0, 7)],
        });
        (a, b)
    }

    #[test]
    fn positions_and_new_inputs_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let (a, b) = positioned();
        let attach = Input::Attach {
            key: key(),
            identity: Identity::default(),
            source: Source::unattached(Mode::Exact),
            watch: Watch {
                began_ns: Some(5),
                mid_run: true,
                ring_starts: vec![0, 9],
                anchor_snapshot: Some(3),
            },
        };
        let dropped = Input::Dropped {
            key: Some(key()),
            what: "events".into(),
            count: 12,
        };
        let mut rec = Recorder::create(&path).unwrap();
        for (t, i) in [(1, &attach), (2, &a), (3, &dropped), (4, &b)] {
            rec.write(t, i).unwrap();
        }
        let reset = Input::PeaksReset { key: key() };
        rec.write(5, &reset).unwrap();
        rec.write(6, &Input::Gone { key: key() }).unwrap();
        rec.finish().unwrap();
        let mut r = Replayer::open(&path).unwrap();
        assert_eq!(r.minor(), MINOR);
        let mut got = Vec::new();
        while let Some((_, i)) = r.next_input().unwrap() {
            got.push(i);
        }
        assert_eq!(
            got,
            vec![attach, a, dropped, b, reset, Input::Gone { key: key() }]
        );
        assert_eq!(r.skipped_inputs(), 0);
    }

    #[test]
    fn positions_that_do_not_match_their_events_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = Recorder::create(&dir.path().join("r.vsrec")).unwrap();
        let (mut a, _) = positioned();
        if let Input::Events(EventBatch { at, .. }) = &mut a {
            at.pop();
        }
        assert!(rec.write(1, &a).is_err());
    }

    #[test]
    fn unknown_inputs_and_frames_are_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let mut rec = Recorder::create(&path).unwrap();
        rec.frame(KIND_INPUT, 1, br#"{"FromTheFuture":{"x":1}}"#)
            .unwrap();
        rec.frame(KIND_INPUT_NEW, 2, br#""AlsoNew""#).unwrap();
        rec.frame(42, 3, b"a frame kind of a later minor").unwrap();
        // Positions with no events frame before them: skipped.
        rec.frame(KIND_POSITIONS, 4, &[0u8; 16]).unwrap();
        // A known input with a field this build does not know: read.
        rec.frame(
            KIND_INPUT,
            5,
            br#"{"Gone":{"key":{"pid":7,"start_time":9},"later_field":true}}"#,
        )
        .unwrap();
        rec.finish().unwrap();
        let mut r = Replayer::open(&path).unwrap();
        assert_eq!(
            r.next_input().unwrap(),
            Some((5, Input::Gone { key: key() }))
        );
        assert_eq!(r.next_input().unwrap(), None);
        assert_eq!(r.skipped_inputs(), 2);
        // A known variant that is malformed is still an error.
        let path = dir.path().join("bad.vsrec");
        let mut rec = Recorder::create(&path).unwrap();
        rec.frame(KIND_INPUT, 1, br#"{"Gone":{"key":3}}"#).unwrap();
        rec.finish().unwrap();
        let err = Replayer::open(&path).unwrap().next_input().unwrap_err();
        assert!(err.to_string().contains("bad input frame"), "{err}");
    }

    #[test]
    fn every_input_variant_is_named_in_variants() {
        let (a, _) = positioned();
        let all = [
            Input::Attach {
                key: key(),
                identity: Identity::default(),
                source: Source::unattached(Mode::Exact),
                watch: Watch::default(),
            },
            a,
            Input::Gone { key: key() },
            Input::Forget { key: key() },
            Input::Machine {
                machine: Machine::default(),
                host_pids: vec![],
                fresh: vec![],
            },
            Input::Problems { problems: vec![] },
            Input::Dropped {
                key: None,
                what: "x".into(),
                count: 1,
            },
            Input::PeaksReset { key: key() },
        ];
        for i in &all {
            let v = serde_json::to_value(i).unwrap();
            let name = v.as_object().unwrap().keys().next().unwrap().clone();
            assert!(Input::VARIANTS.contains(&name.as_str()), "{name}");
        }
        assert_eq!(all.len(), Input::VARIANTS.len());
    }

    /// What vramscope 0.1.0 (recording 1.0) declared, to check that it reads
    /// a 1.1 `Attach` (the new field is ignored) — serde's default, which
    /// `Input` must keep.
    #[test]
    fn a_1_0_reader_ignores_the_new_attach_fields() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        enum Input10 {
            Attach {
                key: ProcessKey,
                identity: Identity,
                source: Source,
            },
        }
        let json = serde_json::to_string(&Input::Attach {
            key: key(),
            identity: Identity::default(),
            source: Source::unattached(Mode::Exact),
            watch: Watch {
                began_ns: Some(1),
                mid_run: true,
                ring_starts: vec![1, 2],
                anchor_snapshot: Some(4),
            },
        })
        .unwrap();
        let old: Input10 = serde_json::from_str(&json).unwrap();
        assert!(matches!(old, Input10::Attach { key: k, .. } if k == key()));
        // And a 1.0 Attach (no watch) reads as "not given".
        let v10 = r#"{"Attach":{"key":{"pid":7,"start_time":9},"identity":{"host_pid":0,"ns_pid":0,"name":"","cmdline":"","user":"","uid":null,"label":"","alive":false},"source":{"mode":"exact","segment":null,"producer":null,"framework":null,"delivered":0,"lost":0,"commands":false}}}"#;
        match serde_json::from_str::<Input>(v10).unwrap() {
            Input::Attach { watch, .. } => assert_eq!(watch, Watch::default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn frames_round_trip_and_retime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.vsrec");
        let key = ProcessKey {
            pid: 7,
            start_time: 9,
        };
        let events = vec![
            Event {
                time_ns: 1_000,
                kind: EventKind::Marker {
                    value: 1,
                    source: Default::default(),
                },
            },
            Event {
                time_ns: 3_000,
                kind: EventKind::Marker {
                    value: 2,
                    source: Default::default(),
                },
            },
        ];
        let mut rec = Recorder::create(&path).unwrap();
        rec.write(
            10,
            &Input::Events(EventBatch {
                key,
                events: events.clone(),
                delivered: 2,
                lost: 0,
                lost_now: 0,
                at: Vec::new(),
            }),
        )
        .unwrap();
        let machine = Machine {
            sampled_ns: Some(2_000),
            ..Machine::default()
        };
        rec.write(
            20,
            &Input::Machine {
                machine,
                host_pids: vec![],
                fresh: vec![],
            },
        )
        .unwrap();
        rec.finish().unwrap();
        let mut r = Replayer::open(&path).unwrap();
        let (t, mut first) = r.next_input().unwrap().unwrap();
        assert_eq!(t, 10);
        // Twice the speed, starting at 1,000,000.
        let map = |x: u64| 1_000_000 + (x - 1_000) / 2;
        retime(&mut first, &map);
        match first {
            Input::Events(EventBatch { events: got, .. }) => {
                assert_eq!(
                    got.iter().map(|e| e.time_ns).collect::<Vec<_>>(),
                    vec![1_000_000, 1_001_000]
                );
            }
            other => panic!("{other:?}"),
        }
        let (_, mut second) = r.next_input().unwrap().unwrap();
        retime(&mut second, &map);
        assert!(
            matches!(second, Input::Machine { machine, .. } if machine.sampled_ns == Some(1_000_500))
        );
        assert!(r.next_input().unwrap().is_none());
    }
}
