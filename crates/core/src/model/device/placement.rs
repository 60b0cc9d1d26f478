//! The placement state of one device: where its ring stands, what is held
//! back and the verdicts on snapshots placed by ring positions (see
//! `placed`).

use super::pending::Pending;
use vramscope_wire::event::{RingPos, RingSpan};

/// The placement state of one device.
#[derive(Debug, Clone, Default)]
pub(crate) struct Placement {
    /// The device's ring (index in the ring table), once known.
    pub(super) ring: Option<u32>,
    /// Where the reader started in each ring (empty: at 0).
    pub(super) starts: Vec<u64>,
    /// Positions below are reflected in the installed state.
    pub(super) floor: Option<u64>,
    /// The process's event log holds this device's positioned events
    /// (`EventLog::positioned`); those numbered below this were used up.
    pub(super) log_from: u64,
    /// The highest position that is missing from the log (let go of for
    /// the bound, or lost on the wire): an anchor at or below it is unusable.
    pub(super) missing_to: Option<u64>,
    /// The highest position seen.
    pub(super) newest: Option<u64>,
    /// Watching began mid-run and no anchor was installed yet.
    pub(super) holding: bool,
    /// The installed snapshot's ambiguous window ends here (its `after`):
    /// events below it may already be reflected.
    pub(super) window_end: Option<u64>,
    /// Every event of the window so far was already reflected (they are a
    /// prefix of the window: once one is not, none after it is).
    pub(super) in_prefix: bool,
    /// Events dropped as already reflected in an installed state.
    pub(crate) reflected: u64,
    /// Snapshots refused as anchors (records after them were missing).
    pub(crate) refused: u64,
    /// Where the first anchor of a reader that began mid-run put the
    /// start of what it watched (see [`DeviceState::anchored_from`](super::state::DeviceState::anchored_from)).
    pub(super) first_anchor: Option<AnchoredFrom>,
    /// A complete snapshot placed past the positions read so far in its
    /// ring, waiting for the ring to reach it ([`DeviceState::deferred_verdict`](super::state::DeviceState::deferred_verdict)).
    pub(super) deferred: Option<Deferred>,
}

/// A snapshot waiting for its ring to reach its positions.
#[derive(Debug, Clone)]
pub(super) struct Deferred {
    pub(super) pending: Pending,
    /// When it ended (its SNAP_END's time).
    pub(super) t: u64,
    pub(super) span: RingSpan,
}

/// What a record of its ring says of a deferred snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The ring reached its positions: install it now.
    Install,
    /// A record below its `before`, written after it: its positions lie
    /// past the ring's head. Refuse it.
    Refute,
}

/// How much later than a snapshot's end a record below its `before` must
/// be timed to prove the positions false (a record below `before` was
/// written before the state was read, so before the snapshot ended; the
/// margin covers a timestamp taken just after a slot was claimed).
pub(super) const PAST_HEAD_MARGIN_NS: u64 = 1_000_000;

/// Where the state of a device watched from mid-run begins: the events
/// from here on are applied on the anchor snapshot; those before it are in
/// the snapshot or were never seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnchoredFrom {
    /// Events of ring `ring` at positions from `position` on (the anchor's
    /// `after`: the first position it surely does not reflect).
    Position { ring: u32, position: u64 },
    /// Events timed after `time_ns` (a producer that gives no positions).
    Time { time_ns: u64 },
}

impl AnchoredFrom {
    /// Whether an event read at `at` (when known) at `time_ns` comes after
    /// the anchor: what a trace that starts from the anchor keeps.
    pub fn keeps(&self, at: Option<RingPos>, time_ns: u64) -> bool {
        match (*self, at) {
            (AnchoredFrom::Position { ring, position }, Some(at)) => {
                at.ring != ring || at.position >= position
            }
            // Without its position an event is placed by time: kept only
            // when it is surely later than any anchor could reflect.
            (AnchoredFrom::Position { .. }, None) => false,
            (AnchoredFrom::Time { time_ns: t }, _) => time_ns > t,
        }
    }
}

impl Placement {
    /// Heap bytes held (the events are in the process's log).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.starts.capacity() * std::mem::size_of::<u64>()
    }

    pub(super) fn missing(&mut self, pos: u64) {
        self.missing_to = Some(self.missing_to.map_or(pos, |m| m.max(pos)));
    }

    /// Whether a snapshot placed at `span` can be installed exactly.
    pub(super) fn usable(&self, span: &RingSpan) -> bool {
        let start = self.starts.get(usize::from(span.ring)).copied();
        self.ring.is_none_or(|r| r == u32::from(span.ring))
            && span.before >= start.unwrap_or(0)
            && span.before <= span.after
            && self.missing_to.is_none_or(|m| span.before > m)
    }
}
