//! The producer side: create a segment, write records into its rings from any
//! number of threads, keep the heartbeat, answer commands.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};

use super::codec::Words;
use super::control::CommandServer;
use super::discover::{self, proc_start_time, Liveness};
use super::error::RingError;
use super::layout::{self, Header, Producer, MAGIC, MINOR, OFF_HEARTBEAT, OFF_MAGIC, OFF_STATE};
use super::shm::monotonic_ns;
use super::shm::{RingView, Shared};

/// One ring a writer asks for.
#[derive(Debug, Clone, Copy)]
pub struct RingSpec {
    /// Slots in the ring (a power of two).
    pub(crate) slots: u64,
    /// `layout::ROLE_AGENT` or `layout::ROLE_DEVICE`.
    pub(crate) role: u32,
    /// Device hint for device rings, `u32::MAX` for any.
    pub(crate) device: u32,
}

/// Everything a producer says about itself when it creates a segment.
#[derive(Debug, Clone)]
pub struct SegmentConfig {
    /// The segment directory (see `discover::segment_dir`).
    pub(crate) dir: PathBuf,
    /// Optional name suffix, `[A-Za-z0-9_]{1,32}`.
    pub tag: Option<String>,
    pub(crate) producer: Producer,
    pub flags: u32,
    pub framework: String,
    pub label: String,
    pub(crate) rings: Vec<RingSpec>,
}

impl SegmentConfig {
    /// A config with one agent ring and `devices` device rings of `slots` each.
    pub fn new(dir: impl Into<PathBuf>, producer: Producer, devices: u32, slots: u64) -> Self {
        let mut rings = vec![RingSpec {
            slots,
            role: layout::ROLE_AGENT,
            device: u32::MAX,
        }];
        rings.extend((0..devices).map(|d| RingSpec {
            slots,
            role: layout::ROLE_DEVICE,
            device: d,
        }));
        SegmentConfig {
            dir: dir.into(),
            tag: None,
            producer,
            flags: 0,
            framework: String::new(),
            label: String::new(),
            rings,
        }
    }
}

/// A segment this process created and writes. Dropping it marks the segment
/// closed and removes the file.
pub struct SegmentWriter {
    path: PathBuf,
    shared: Shared,
    header: Header,
    notice: Option<String>,
    _file: File,
}

impl SegmentWriter {
    /// Creates and publishes a segment named for this process
    /// (`vramscope-<uid>-<pid>[-<tag>]`), replacing a stale one of ours of
    /// that name. When the name is held by a file it may not remove (another
    /// user's, or a live segment), it takes a tagged name of its own instead
    /// (FORMAT.md, "Naming and creation") and says so in one line on stderr
    /// (also in [`notice`](Self::notice)).
    pub fn create(cfg: &SegmentConfig) -> Result<Self, RingError> {
        let pid = std::process::id();
        let uid = discover::current_uid();
        let name = discover::segment_name(uid, pid, cfg.tag.as_deref())
            .ok_or_else(|| RingError::Invalid(format!("bad tag {:?}", cfg.tag)))?;
        let path = cfg.dir.join(name);
        let specs: Vec<_> = cfg
            .rings
            .iter()
            .map(|r| (r.slots, r.role, r.device))
            .collect();
        let (rings, size) = layout::plan(&specs)?;
        let header = Header {
            minor: MINOR,
            segment_size: size,
            pid,
            uid,
            start_time: proc_start_time(pid).unwrap_or(0),
            producer: cfg.producer,
            flags: cfg.flags,
            created_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
            control_offset: layout::control_offset_for(rings.len()),
            framework: cfg.framework.clone(),
            label: cfg.label.clone(),
            rings,
        };
        let (file, path, notice) = create_named(&cfg.dir, uid, pid, cfg.tag.as_deref(), path)?;
        if let Some(n) = &notice {
            vramscope_text::stderr_line(format_args!("vramscope: {n}"));
        }
        let result = (|| {
            file.set_len(size as u64)?;
            super::shm::reserve(&file, size)?;
            Shared::map(&file, size)
        })();
        let shared = match result {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(RingError::io(&path, e));
            }
        };
        let mut prefix = vec![0u8; layout::prefix_len(header.rings.len())];
        layout::encode_header(&header, &mut prefix);
        shared.store_prefix(&prefix);
        shared
            .u32_at(OFF_STATE)
            .store(layout::STATE_LIVE, Ordering::Relaxed);
        shared
            .u64_at(OFF_HEARTBEAT)
            .store(monotonic_ns(), Ordering::Relaxed);
        // Publish: everything above happens-before a reader that sees the magic.
        shared.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(SegmentWriter {
            path,
            shared,
            header,
            notice,
            _file: file,
        })
    }

    /// Why the segment got a tagged name of its own (printed on stderr at
    /// creation), or `None` when it has the name asked for.
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// A handle for writing into ring `i` (shareable between threads).
    pub fn ring(&self, i: usize) -> RingWriter<'_> {
        RingWriter {
            view: self.shared.ring(&self.header.rings[i]),
        }
    }

    /// Refreshes the heartbeat; call at least once a second.
    pub fn heartbeat(&self) {
        self.shared
            .u64_at(OFF_HEARTBEAT)
            .store(monotonic_ns(), Ordering::Release);
    }

    /// The producer's end of the control block.
    pub fn command_server(&self) -> CommandServer<'_> {
        CommandServer::new(&self.shared, self.header.control_offset)
    }
}

impl Drop for SegmentWriter {
    fn drop(&mut self) {
        self.shared
            .u32_at(OFF_STATE)
            .store(layout::STATE_CLOSED, Ordering::Release);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The segment's file, new: at `path` when free or held by a stale segment
/// of ours, else under a tagged name `vramscope-<uid>-<pid>-[<tag>_]r<hex>`
/// with a note saying why. Returns (file, its path, the note).
fn create_named(
    dir: &Path,
    uid: u32,
    pid: u32,
    tag: Option<&str>,
    path: PathBuf,
) -> Result<(File, PathBuf, Option<String>), RingError> {
    use std::os::unix::fs::MetadataExt;
    let held = match create_exclusive(&path) {
        Ok(f) => return Ok((f, path, None)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Only a stale segment of ours may be replaced (`inspect`
            // refuses any other file): never a live one, not even one
            // naming this process, and never one whose producer cannot be
            // told (it may live in a pid namespace this process cannot
            // see, as pid 1 of a container sharing the directory does).
            // Only the file that was checked is removed, never whatever
            // the path names now.
            let stale = match discover::inspect(&path) {
                Ok(info) => match info.liveness {
                    Liveness::Dead | Liveness::Reused => Some(info.file),
                    Liveness::Alive | Liveness::CannotTell => None,
                },
                Err(_) => None,
            };
            if stale.is_some_and(|id| discover::remove_if_same(&path, id)) {
                match create_exclusive(&path) {
                    Ok(f) => return Ok((f, path, None)),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(RingError::io(&path, e)),
                }
            }
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.uid() != uid => {
                    format!("a file of uid {} that this process cannot remove", m.uid())
                }
                Ok(_) => "a file of ours that is not a stale segment (a live producer's, or one that cannot be told)".to_string(),
                Err(e) => e.to_string(),
            }
        }
        Err(e) => return Err(RingError::io(&path, e)),
    };
    let mut last = None;
    for i in 0..16u64 {
        let r = random_bits(i) & 0xff_ffff_ffff;
        let alt = match tag {
            Some(t) => format!("{}_r{r:010x}", &t[..t.len().min(20)]),
            None => format!("r{r:010x}"),
        };
        let name = discover::segment_name(uid, pid, Some(&alt))
            .ok_or_else(|| RingError::Invalid(format!("bad tag {alt:?}")))?;
        let alt_path = dir.join(name);
        match create_exclusive(&alt_path) {
            Ok(f) => {
                let note = format!(
                    "{} is taken by {held}; using {}",
                    path.display(),
                    alt_path.file_name().unwrap_or_default().to_string_lossy()
                );
                return Ok((f, alt_path, Some(note)));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((alt_path, e)),
            Err(e) => return Err(RingError::io(&alt_path, e)),
        }
    }
    let (p, e) = last.expect("16 attempts");
    Err(RingError::io(&p, e))
}

/// Bits for a tag nobody can plant in advance: the OS's random state (a
/// `RandomState` key), the clock and `salt`.
fn random_bits(salt: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Writes records into one ring. Never blocks, never allocates, makes no
/// system call. `Sync`: any number of threads may share one.
#[derive(Clone, Copy)]
pub struct RingWriter<'a> {
    view: RingView<'a>,
}

impl RingWriter<'_> {
    /// Writes one record. Returns `false` when the slot was held by another
    /// writer (the record is lost and counted, see FORMAT.md).
    #[inline]
    pub fn write(&self, words: &Words) -> bool {
        let p = self.view.head().fetch_add(1, Ordering::Relaxed);
        let slot = self.view.slot(p);
        let writing = p.wrapping_mul(2).wrapping_add(1);
        // Fast path: the slot holds the previous lap's record (or nothing in
        // the first lap). One exchange takes the cache line exclusively at
        // once, with no separate load to share it first.
        let lap = self.view.slot_count();
        let previous = if p >= lap {
            (p - lap).wrapping_mul(2).wrapping_add(2)
        } else {
            0
        };
        if let Err(s) =
            slot.seq
                .compare_exchange(previous, writing, Ordering::AcqRel, Ordering::Relaxed)
        {
            // Some other even state below ours (an earlier lap was dropped):
            // still ours to take. Odd (held) or newer: drop.
            if s & 1 == 1
                || s >= writing
                || slot
                    .seq
                    .compare_exchange(s, writing, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                self.view.dropped().fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        fence(Ordering::Release);
        for (dst, &v) in slot.w.iter().zip(words) {
            dst.store(v, Ordering::Relaxed);
        }
        slot.seq.store(writing.wrapping_add(1), Ordering::Release);
        true
    }

    /// Writes one record when the caller guarantees that no other thread
    /// writes into this ring meanwhile (e.g. a device's ring, written only
    /// under that device's allocator lock). The same slot protocol with
    /// plain atomic stores instead of read-modify-writes: readers cannot
    /// tell the difference. Concurrent use voids the no-torn-record
    /// guarantee; use [`write`](Self::write) when unsure.
    #[inline]
    pub fn write_exclusive(&self, words: &Words) {
        let head = self.view.head();
        let p = head.load(Ordering::Relaxed);
        head.store(p.wrapping_add(1), Ordering::Relaxed);
        let slot = self.view.slot(p);
        let writing = p.wrapping_mul(2).wrapping_add(1);
        slot.seq.store(writing, Ordering::Relaxed);
        fence(Ordering::Release);
        for (dst, &v) in slot.w.iter().zip(words) {
            dst.store(v, Ordering::Relaxed);
        }
        slot.seq.store(writing.wrapping_add(1), Ordering::Release);
    }

    /// Positions claimed so far.
    pub fn head(&self) -> u64 {
        self.view.head().load(Ordering::Relaxed)
    }

    /// Claims a position and leaves it half-written, as a writer killed in
    /// the middle of a write would. For tests of crash recovery only.
    #[doc(hidden)]
    pub fn write_and_die_midway(&self, words: &Words) {
        let p = self.view.head().fetch_add(1, Ordering::Relaxed);
        let slot = self.view.slot(p);
        slot.seq
            .store(p.wrapping_mul(2).wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        slot.w[0].store(words[0], Ordering::Relaxed);
    }
}
