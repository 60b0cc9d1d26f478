//! Stepping through a file's trace in the dashboard: the state at any
//! event, rebuilt by the model (the file's inputs up to that event applied
//! to a fresh process in the hub), and what the dashboard shows of where it
//! is ([`TraceStatus`]: the position, the event, its stacks).

use crate::collect::Hub;
use crate::input::Input;
use crate::ui::format::bytes;

use super::inputs::{self, Plan, KEY};
use super::{Action, SnapshotFile};

/// Where the dashboard is in a file's trace, and what it shows of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceStatus {
    /// The file, as given.
    pub file: String,
    /// Events applied: the state after the first `at` (`total`: the
    /// file's own state).
    pub at: usize,
    pub total: usize,
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
}

impl Stepper {
    pub fn new(file: SnapshotFile, name: &str) -> Stepper {
        let total = inputs::timeline(&file).len();
        Stepper {
            file,
            name: name.to_string(),
            at: total,
            total,
        }
    }

    pub fn file(&self) -> &SnapshotFile {
        &self.file
    }

    /// Rebuilds the process of `hub` at event `at` (clamped to the trace):
    /// the process is forgotten and the file's inputs up to that event are
    /// applied again, their times moved so that the last is `now_ns`.
    pub fn seek(&mut self, hub: &Hub, at: usize, now_ns: u64) -> TraceStatus {
        self.at = at.min(self.total);
        let plan = Plan {
            upto: (self.at < self.total).then_some(self.at),
        };
        let mut fed = inputs::inputs(&self.file, &self.name, plan);
        let end = fed.last().map_or(0, |(t, _)| *t);
        hub.apply(Input::Forget { key: KEY });
        for (_, input) in &mut fed {
            crate::recording::retime(input, &|x| now_ns.saturating_sub(end.saturating_sub(x)));
        }
        for (_, input) in fed {
            hub.apply(input);
        }
        self.status()
    }

    /// Where the stepper is, and the stacks of the last event applied and
    /// of the block it names in the file's state.
    pub fn status(&self) -> TraceStatus {
        let f = &self.file;
        let mut status = TraceStatus {
            file: crate::ring::layout::printable(&self.name),
            at: self.at,
            total: self.total,
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
            a => format!(
                "{} {} at 0x{:x} on device {} stream {}",
                a.name(),
                bytes(e.size),
                e.addr,
                t.device,
                e.stream
            ),
        };
        status.stacks.push((
            format!("event {}: {}", self.at, status.event),
            stack_lines(f, e.stack),
        ));
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
            status.stacks.push((
                format!(
                    "block 0x{:x} in the file's state: {} {:?}",
                    b.address,
                    bytes(b.size),
                    b.state
                ),
                stack_lines(f, b.stack.or(s.stack)),
            ));
        }
        status
    }
}

/// A stack as `file:line name` lines, innermost first.
pub fn stack_lines(file: &SnapshotFile, stack: Option<u32>) -> Vec<String> {
    stack
        .map(|s| {
            file.stack_frames(s)
                .map(|f| format!("{}:{} {}", f.filename, f.line, f.name))
                .collect()
        })
        .unwrap_or_default()
}
