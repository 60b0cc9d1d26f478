//! Stepping through a file's trace in the dashboard: the state at any
//! event, rebuilt by the model (the file's inputs up to that event applied
//! to a fresh process in the hub), and what the dashboard shows of where it
//! is ([`TraceStatus`]: the position, the event, its stacks).

use std::collections::BTreeMap;

use crate::hub::Hub;
use vramscope_core::input::Input;
use vramscope_text::format::bytes;

use vramscope_core::snapfile::inputs::{self, DeviceStateOf, Plan, KEY};
use vramscope_core::snapfile::lines::{line, stack_lines};
use vramscope_core::snapfile::{Action, SnapshotFile};

/// Where the dashboard is in a file's trace, and what it shows of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceStatus {
    /// The file, as given.
    pub file: String,
    /// Events applied: the state after the first `at` (`total`: the
    /// file's own state).
    pub at: usize,
    pub total: usize,
    /// The whole trace's first and last input in collector ns, where the
    /// last seek placed them: the timeline's window.
    pub window_ns: (u64, u64),
    /// The last event applied, in words (empty before the first).
    pub event: String,
    /// The stack overlay: titled sections of `file:line name` lines.
    pub stacks: Vec<(String, Vec<String>)>,
}

/// A file's trace, with a hub showing the state at one of its events.
pub struct Stepper {
    file: SnapshotFile,
    name: String,
    at: usize,
    total: usize,
    /// [`TraceStatus::window_ns`].
    window_ns: (u64, u64),
    /// The state before the trace (the trace undone), found once: each
    /// step replays the trace from it.
    start: BTreeMap<u16, DeviceStateOf>,
}

impl Stepper {
    pub fn new(file: SnapshotFile, name: &str) -> Stepper {
        let total = inputs::timeline(&file).len();
        Stepper {
            start: inputs::starting_state(&file),
            file,
            name: name.to_string(),
            at: total,
            total,
            window_ns: (0, 0),
        }
    }

    /// Rebuilds the process of `hub` at event `at` (clamped to the trace):
    /// the process is forgotten and the file's inputs up to that event are
    /// applied again, their times moved so that the last is `now_ns`.
    pub fn seek(&mut self, hub: &Hub, at: usize, now_ns: u64) -> TraceStatus {
        self.at = at.min(self.total);
        let plan = Plan {
            upto: (self.at < self.total).then_some(self.at),
        };
        let events = inputs::timeline(&self.file);
        let end = inputs::end_ns(&events, plan);
        let retime = |x: u64| now_ns.saturating_sub(end.saturating_sub(x));
        // The timeline's window is the whole trace: its end lies after now
        // when stepped back (the later events are not applied).
        let (first, last) = (
            inputs::end_ns(&events, Plan { upto: Some(0) }),
            inputs::end_ns(&events, Plan { upto: None }),
        );
        self.window_ns = (
            retime(first),
            now_ns.saturating_add(last.saturating_sub(end)),
        );
        hub.apply(Input::Forget { key: KEY });
        inputs::feed(
            &self.file,
            &self.name,
            plan,
            &self.start,
            &mut |_, mut input| {
                vramscope_core::recording::retime(&mut input, &retime);
                hub.apply(input);
            },
        );
        self.status()
    }

    /// Where the stepper is, and the stacks of the last event applied and
    /// of the block it names in the file's state.
    pub fn status(&self) -> TraceStatus {
        let f = &self.file;
        let mut status = TraceStatus {
            file: vramscope_text::printable(&self.name),
            at: self.at,
            total: self.total,
            window_ns: self.window_ns,
            ..TraceStatus::default()
        };
        if self.at == 0 {
            status.event = "before the first event".into();
            return status;
        }
        let timeline = inputs::timeline(f);
        let Some(t) = timeline.get(self.at - 1) else {
            return status;
        };
        let e = t.entry;
        status.event = match e.action {
            Action::Oom => format!(
                "oom on device {}: {} requested, {} free",
                t.device,
                bytes(e.size),
                bytes(e.addr)
            ),
            Action::Snapshot => format!("snapshot on device {}", t.device),
            Action::Annotate => format!(
                "annotate 0x{:x} on device {}: {}",
                e.addr,
                t.device,
                e.user_metadata().map_or_else(String::new, line)
            ),
            a => format!(
                "{} {} at 0x{:x} on device {} stream {}",
                a.name(),
                bytes(e.size),
                e.addr,
                t.device,
                e.stream
            ),
        };
        let mut lines = e.meta_lines();
        lines.extend(stack_lines(f, e.stack));
        status
            .stacks
            .push((format!("event {}: {}", self.at, status.event), lines));
        if matches!(e.action, Action::Oom | Action::Snapshot) {
            return status;
        }
        let block = f
            .segments
            .iter()
            .filter(|s| s.device == t.device)
            .find_map(|s| {
                s.blocks
                    .iter()
                    .find(|b| b.address <= e.addr && e.addr < b.address.saturating_add(b.size))
                    .map(|b| (s, b))
            });
        if let Some((s, b)) = block {
            let mut lines = notes(&timeline, t.device, b.address);
            let pool = format!("private pool ({}, {})", s.pool.0, s.pool.1);
            if s.pool != vramscope_wire::event::PoolId(0, 0) && !lines.contains(&pool) {
                lines.insert(0, pool);
            }
            lines.extend(stack_lines(f, b.stack.or(s.stack)));
            status.stacks.push((
                format!(
                    "block 0x{:x} in the file's state: {} {:?}",
                    b.address,
                    bytes(b.size),
                    b.state
                ),
                lines,
            ));
        }
        status
    }
}

/// The most notes shown of one block ([`notes`]).
const MAX_NOTES: usize = 8;

/// What the trace says of the block at `addr` of `device`, besides its
/// stack: its last allocation's user metadata and compile context, and
/// the annotations made after it (`annotate` entries), the last
/// [`MAX_NOTES`] of them.
fn notes(timeline: &[inputs::Timed], device: u16, addr: u64) -> Vec<String> {
    let here = |t: &&inputs::Timed| t.device == device && t.entry.addr == addr;
    let events: Vec<&inputs::Timed> = timeline.iter().filter(here).collect();
    let last_alloc = (events.iter()).rposition(|t| t.entry.action == Action::Alloc);
    let mut out: Vec<String> = Vec::new();
    for t in &events[last_alloc.unwrap_or(0)..] {
        match t.entry.action {
            Action::Alloc => out.extend(t.entry.meta_lines()),
            Action::Annotate => {
                let note = t.entry.user_metadata().map_or_else(String::new, line);
                out.push(format!("annotated: {note}"));
            }
            _ => {}
        }
    }
    let cut = out.len().saturating_sub(MAX_NOTES);
    out.drain(..cut);
    out
}
