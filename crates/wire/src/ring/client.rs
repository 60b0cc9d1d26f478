//! One way to a process: a command to the producer of one segment, and its
//! answer. The segment is opened as every reader opens it
//! ([`SegmentReader`]: the hygiene checks and the header's validation),
//! mapped once, and the command posted on its control block
//! ([`control`](super::control)).
//!
//! Who uses it, and how each finds the segment:
//!
//! - the dashboard: the segment its snapshot shows for the process, with the
//!   process's pid and start time ([`Expect`]), so that a path taken over by
//!   a newer process is refused ([`command`]);
//! - the subcommands (`empty-cache`, `stacks`): the segment directory,
//!   searched for the producer a pid names ([`Client::find`]);
//! - the collector: the segment of a process it reads, for the state
//!   snapshots the model wants ([`command`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::control::{Command, Outcome};
use super::discover::{self, Found, Located};
use super::error::RingError;
use super::layout::STATE_CLOSED;
use super::reader::{SegmentReader, Start};

/// The producer a command is meant for, as the segment's header names it:
/// its pid in its own namespace and its start time (the model's process key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub pid: u32,
    pub start_time: u64,
}

/// A segment opened to send commands to its producer.
pub struct Client {
    reader: SegmentReader,
}

impl Client {
    /// Opens and validates the segment at `path` (one mapping). With
    /// `expect`, a segment whose header names another producer is refused:
    /// the process it was shown for is gone and the path is another's now.
    pub(crate) fn open(path: &Path, expect: Option<Expect>) -> Result<Client, RingError> {
        let reader = SegmentReader::open_at(path, Start::Now)?;
        let h = reader.header();
        if let Some(e) = expect.filter(|e| (e.pid, e.start_time) != (h.pid, h.start_time)) {
            return Err(RingError::refused(
                path,
                format!(
                    "it is now the segment of pid {} (start time {}), not of pid {} (start time {}): that process is gone",
                    h.pid, h.start_time, e.pid, e.start_time
                ),
            ));
        }
        Ok(Client { reader })
    }

    /// The segment, in `dir` or in the segment directory of a container
    /// ([`discover::container_dirs`]), of the running producer that this
    /// machine calls `pid`, or that calls itself `pid` in its own pid
    /// namespace. A segment is attributed by its header, never by its name
    /// (FORMAT.md): the segments named for `pid` are only looked at first,
    /// so the one wanted is usually the only one mapped. Only a producer
    /// that runs and maps its segment is taken. None when there is none.
    pub fn find(dir: &Path, pid: u32) -> Result<Option<Client>, RingError> {
        let (found, _) = discover::list(dir)?;
        if let Some(c) = find_in(found, pid) {
            return Ok(Some(c));
        }
        for d in discover::container_dirs(dir) {
            if let Ok((found, _)) = discover::list_in(Arc::new(d)) {
                if let Some(c) = find_in(found, pid) {
                    return Ok(Some(c));
                }
            }
        }
        Ok(None)
    }

    #[cfg(test)]
    /// The segment's path.
    pub(crate) fn path(&self) -> &Path {
        self.reader.path()
    }

    /// Posts `command` and waits up to `timeout` for the producer's answer.
    pub fn send(&self, command: Command, timeout: Duration) -> Result<Outcome, RingError> {
        self.reader.command(command, timeout)
    }
}

/// Sends `command` to the producer of the segment at `path` (meant for
/// `expect`, when given) and waits up to `timeout` for its answer.
pub fn command(
    path: &Path,
    expect: Option<Expect>,
    command: Command,
    timeout: Duration,
) -> Result<Outcome, RingError> {
    Client::open(path, expect)?.send(command, timeout)
}

/// [`Client::find`] among the segments of one directory.
fn find_in(mut found: Vec<Found>, pid: u32) -> Option<Client> {
    // What the process `pid` calls itself, when it runs in a pid namespace
    // of its own (the last entry of its `NSpid` line).
    let own = discover::proc_ns_pids(pid)
        .and_then(|v| v.last().copied())
        .unwrap_or(pid);
    found.sort_by_key(|f| f.name.pid != pid && f.name.pid != own);
    found.into_iter().find_map(|f| {
        let reader = SegmentReader::open_in(&f.dir, &f.file, Start::Now).ok()?;
        let h = reader.header();
        if (h.pid != pid && h.pid != own) || reader.state() == STATE_CLOSED {
            return None;
        }
        let Located::Here(host) = discover::locate_producer(h.pid, h.start_time, reader.file())
        else {
            return None;
        };
        let maps = discover::maps_file(host, reader.file()) == Some(true);
        ((host == pid || h.pid == pid) && maps).then_some(Client { reader })
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::super::control::Status;
    use super::super::layout::Producer;
    use super::super::writer::{SegmentConfig, SegmentWriter};
    use super::*;

    /// How many mappings of the file at `path` this process holds.
    fn mappings_of(path: &Path) -> usize {
        let ino = std::fs::metadata(path).unwrap().ino().to_string();
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.split_whitespace().nth(4) == Some(ino.as_str()))
            .count()
    }

    /// A copy of `seg` named for, and naming, `pid` (a producer that is gone).
    fn copy_for(seg: &SegmentWriter, dir: &Path, pid: u32) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let mut bytes = std::fs::read(seg.path()).unwrap();
        let off = super::super::layout::OFF_PID;
        bytes[off..off + 4].copy_from_slice(&pid.to_le_bytes());
        let name = discover::segment_name(discover::current_uid(), pid, None).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    /// Among 40 segments of producers that are gone, the one of this
    /// process is found by its pid, mapped once (the others are not
    /// mapped at all), and answers; a pid with no segment finds none.
    #[test]
    fn find_maps_only_the_segment_of_the_pid() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 16);
        cfg.tag = Some("mine".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        let others: Vec<_> = (0..40)
            .map(|i| copy_for(&seg, dir.path(), 999_999_000 + i))
            .collect();
        let before = mappings_of(seg.path());
        let me = std::process::id();
        let client = Client::find(dir.path(), me).unwrap().expect("found");
        assert_eq!(client.path(), seg.path());
        assert_eq!(mappings_of(seg.path()), before + 1);
        assert!(others.iter().all(|p| mappings_of(p) == 0));
        std::thread::scope(|s| {
            s.spawn(|| {
                let server = seg.command_server();
                for _ in 0..2000 {
                    if let Some(req) = server.poll() {
                        server.answer(req, Status::Ok, 5, 0);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            let out = client.send(Command::Ping { value: 5 }, Duration::from_secs(5));
            assert!(
                matches!(
                    out,
                    Ok(Outcome {
                        status: Status::Ok,
                        result0: 5,
                        ..
                    })
                ),
                "{out:?}"
            );
        });
        drop(client);
        assert_eq!(mappings_of(seg.path()), before);
        // A pid whose only segment is one of a producer that is gone.
        assert!(Client::find(dir.path(), 999_999_007).unwrap().is_none());
    }

    /// A segment whose header names another producer than the one expected
    /// is refused, naming both, before anything is posted.
    #[test]
    fn a_segment_of_another_producer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let seg =
            SegmentWriter::create(&SegmentConfig::new(dir.path(), Producer::Test, 1, 16)).unwrap();
        let h = seg.header();
        let other = Expect {
            pid: h.pid,
            start_time: h.start_time + 1,
        };
        let err = command(
            seg.path(),
            Some(other),
            Command::Ping { value: 1 },
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(matches!(err, RingError::Refused { .. }), "{err}");
        assert!(err
            .to_string()
            .contains(&format!("start time {}", h.start_time + 1)));
    }
}
