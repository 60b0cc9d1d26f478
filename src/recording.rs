//! Recordings: everything the hub was fed (NVML readings, processes, their
//! allocator events, losses), with the collector's time, in a versioned
//! file that `vramscope replay` feeds back at any speed.
//!
//! # File format, version 1.0
//!
//! All integers little-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `VSCOPREC` |
//! | 2 | major version (1); a reader refuses another major |
//! | 2 | minor version (0); newer minors only add frame kinds, which readers skip |
//! | 4 | flags, 0 |
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
//! - 1, **input**: the payload is one `collect::Input` as JSON (every input
//!   except events).
//! - 2, **events**: `pid` u32, `start_time` u64, `delivered` u64, `lost` u64,
//!   `lost_now` u64, `count` u32, then `count` records of 56 bytes: the seven
//!   payload words of the wire format (`src/ring/FORMAT.md`, "Records"); a
//!   statistics sample is two adjacent records.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::event::Event;
use crate::model::ProcessKey;
use crate::ring::codec::{encode, Decoder, Words};

use crate::input::Input;

pub const MAGIC: &[u8; 8] = b"VSCOPREC";
pub const MAJOR: u16 = 1;
pub const MINOR: u16 = 0;
const KIND_INPUT: u8 = 1;
const KIND_EVENTS: u8 = 2;
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
    path: PathBuf,
    words: Vec<Words>,
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
            path: path.to_path_buf(),
            words: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
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
        match input {
            Input::Events {
                key,
                events,
                delivered,
                lost,
                lost_now,
            } => {
                self.words.clear();
                for (i, e) in events.iter().enumerate() {
                    encode(e, i as u32, &mut self.words);
                }
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
                self.frame(KIND_EVENTS, time_ns, &p)
            }
            other => {
                let json = serde_json::to_vec(other).map_err(std::io::Error::other)?;
                self.frame(KIND_INPUT, time_ns, &json)
            }
        }
    }

    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Moves a recorded input onto another clock: every time in it (event
/// times, the NVML sample time) goes through `map`. `replay --ui` maps the
/// recording onto this machine's monotonic clock at the playback speed.
pub fn retime(input: &mut Input, map: &impl Fn(u64) -> u64) {
    match input {
        Input::Events { events, .. } => {
            for e in events {
                e.time_ns = map(e.time_ns);
            }
        }
        Input::Machine { machine, .. } => {
            machine.sampled_ns = machine.sampled_ns.map(map);
        }
        _ => {}
    }
}

/// Reads a recording frame by frame.
pub struct Replayer {
    input: BufReader<File>,
    path: PathBuf,
    offset: u64,
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}
fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

impl Replayer {
    pub fn open(path: &Path) -> Result<Self, RecordingError> {
        let file = File::open(path).map_err(|e| RecordingError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let mut r = Replayer {
            input: BufReader::new(file),
            path: path.to_path_buf(),
            offset: 0,
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
                    "format version {major}.{minor}; this vramscope reads {MAJOR}.x: upgrade it"
                ),
            ));
        }
        r.offset = 16;
        Ok(r)
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

    /// The next input and its time, `None` at a clean end of file.
    pub fn next_input(&mut self) -> Result<Option<(u64, Input)>, RecordingError> {
        loop {
            let at = self.offset;
            let mut len = [0u8; 4];
            match self.read_up_to(&mut len)? {
                0 => return Ok(None),
                4 => {}
                n => return Err(self.bad(at, format!("truncated frame header ({n} of 4 bytes)"))),
            }
            let len = u32_le(&len);
            if !(9..=MAX_FRAME).contains(&len) {
                return Err(self.bad(at, format!("frame length {len} is out of range")));
            }
            let mut body = vec![0u8; len as usize];
            let n = self.read_up_to(&mut body)?;
            if n < body.len() {
                return Err(self.bad(
                    at,
                    format!("truncated frame: {len} bytes announced, {n} present"),
                ));
            }
            self.offset = at + 4 + len as u64;
            let kind = body[0];
            let time = u64_le(&body[1..9]);
            let payload = &body[9..];
            match kind {
                KIND_INPUT => {
                    let input = serde_json::from_slice(payload)
                        .map_err(|e| self.bad(at, format!("bad input frame: {e}")))?;
                    return Ok(Some((time, input)));
                }
                KIND_EVENTS => return self.events(at, time, payload).map(Some),
                _ => continue, // a newer minor's frame: skip it
            }
        }
    }

    fn events(&self, at: u64, time: u64, p: &[u8]) -> Result<(u64, Input), RecordingError> {
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
        let mut d = Decoder::default();
        let mut events: Vec<Event> = Vec::with_capacity(count);
        for r in recs.chunks_exact(56) {
            let mut w = [0u64; 7];
            for (i, v) in w.iter_mut().enumerate() {
                *v = u64_le(&r[i * 8..]);
            }
            if let Some(e) = d.decode(&w) {
                events.push(e);
            }
        }
        Ok((
            time,
            Input::Events {
                key,
                events,
                delivered,
                lost,
                lost_now,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::Machine;
    use crate::event::EventKind;

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
            &Input::Events {
                key,
                events: events.clone(),
                delivered: 2,
                lost: 0,
                lost_now: 0,
            },
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
            Input::Events { events: got, .. } => {
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
