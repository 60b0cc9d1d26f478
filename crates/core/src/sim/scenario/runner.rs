//! The runner: a scenario's operations applied to a [`SimAllocator`] as
//! simulated time advances, with the events, stats samples, step markers,
//! definitions, captured stacks and role lists a real process would send.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::catalog::Scenario;
use super::ops::{Op, SimContext, SimFrame, TimedOp};
use super::scripts::{frag_closing, FRAG_CLOSING, OOM_AVOIDED, OOM_CLOSING};
use crate::sim::allocator::{EventSink, OomError, SimAllocator};
use vramscope_wire::event::{CtxTag, Event, EventKind, Held};

/// Minimum simulated time between two `Stats` events from the runner.
pub(crate) const STATS_INTERVAL_NS: u64 = 10_000_000;

/// Statistics of one training step (from its `Step` marker to the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepStats {
    pub(crate) step: u64,
    /// The lowest `allocated` seen during the step (its floor).
    pub(crate) allocated_min: u64,
    pub(crate) allocated_max: u64,
    pub(crate) reserved_max: u64,
    pub(crate) inactive_split_max: u64,
    pub(crate) allocated_end: u64,
    pub(crate) reserved_end: u64,
    pub(crate) inactive_split_end: u64,
    pub(crate) segments_end: u64,
    /// OOMs during this step.
    pub(crate) ooms: u64,
}

/// What applying one operation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    pub(crate) op: Op,
    pub(crate) time_ns: u64,
    pub(crate) oom: Option<OomError>,
}

/// Applies a scenario's operations to a [`SimAllocator`] as simulated time
/// advances, emitting trace events (plus `Stats` samples and step
/// `Marker`s) and keeping the current caption.
#[derive(Debug, Clone)]
pub struct ScenarioRunner {
    scenario: Scenario,
    alloc: SimAllocator,
    cursor: usize,
    live: HashMap<u32, u64>,
    caption: String,
    last_oom: Option<OomError>,
    last_stats_ns: Option<u64>,
    steps: Vec<StepStats>,
    current: Option<StepStats>,
    /// Contexts defined so far (in the segment: ids are never reused, and
    /// a new run's definitions repeat the same ones).
    defined: Vec<bool>,
    context: u32,
    step_tag: u8,
    /// The current step (0 before the first).
    step_now: u64,
    /// Stack capture asked for (command 5), while it lasts.
    capture: Option<Capture>,
    /// The definitions stack capture made (kept across runs: ids are
    /// never reused within a segment).
    stack_defs: StackDefs,
    /// The last role list (sent again with every snapshot), and the lists
    /// written so far.
    roles: Vec<(u32, u64, Held, u32)>,
    roles_sent: u32,
    /// Whether this run said what it holds outside the caching allocator
    /// (at its first step).
    outside_said: bool,
}

/// The CUDA context and cuBLAS's workspace of the simulated job (what a
/// real one's agent names outside the caching allocator, FORMAT.md 1.3).
pub const SIM_CONTEXT: u64 = 500 << 20;
pub const SIM_CUBLAS: u64 = 32 << 20;
/// Where the simulated cuBLAS workspace lies (far from the segments).
const SIM_CUBLAS_AT: u64 = 0x7e00_0000_0000;

/// `text` as a record's 24-byte library name (0-padded).
fn lib_name(text: &str) -> [u8; 24] {
    let mut name = [0u8; 24];
    let n = text.len().min(24);
    name[..n].copy_from_slice(&text.as_bytes()[..n]);
    name
}

/// What the simulated job holds outside the caching allocator, as its
/// agent says it at the first step: the CUDA context's total and cuBLAS's
/// workspace, on device 0.
fn outside(time_ns: u64, sink: &mut dyn EventSink) {
    use vramscope_wire::event::{Library, Outside, OutsideKind, OutsideOp};
    let records = [
        Outside {
            op: OutsideOp::Total,
            device: 0,
            library: Library::Cuda,
            kind: OutsideKind::Context,
            addr: 0,
            bytes: SIM_CONTEXT,
            name: lib_name("libcuda.so.1"),
        },
        Outside {
            op: OutsideOp::Alloc,
            device: 0,
            library: Library::Cublas,
            kind: OutsideKind::Allocation,
            addr: SIM_CUBLAS_AT,
            bytes: SIM_CUBLAS,
            name: lib_name("libcublas.so.13"),
        },
    ];
    for o in records {
        sink.emit(Event {
            time_ns,
            kind: EventKind::Outside(o),
        });
    }
}

/// Stack capture under way: step boundaries left, frames kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Capture {
    boundaries_left: u64,
    depth: usize,
}

/// Frames kept per stack when the asker leaves the depth to the producer.
pub(crate) const DEFAULT_STACK_DEPTH: usize = 16;

/// The strings, frames, stacks and contexts with stacks that capture
/// defined, and their records (sent again before every snapshot).
#[derive(Debug, Clone, Default)]
struct StackDefs {
    strings: HashMap<&'static str, u32>,
    frames: HashMap<SimFrame, u32>,
    stacks: HashMap<(u32, u32), u32>,
    /// (scenario context, frames kept) → context id.
    contexts: HashMap<(u32, usize), u32>,
    records: Vec<EventKind>,
}

impl StackDefs {
    fn emit(&mut self, kind: EventKind, time_ns: u64, sink: &mut dyn EventSink) {
        sink.emit(Event { time_ns, kind });
        self.records.push(kind);
    }

    /// The id of string `text`, defined first if new (ids after the
    /// scenario's module paths).
    fn string(
        &mut self,
        s: &Scenario,
        text: &'static str,
        t: u64,
        sink: &mut dyn EventSink,
    ) -> u32 {
        if let Some(&id) = self.strings.get(text) {
            return id;
        }
        let id = (s.modules.len() + self.strings.len() + 1) as u32;
        for kind in EventKind::string_chunks(id, text) {
            self.emit(kind, t, sink);
        }
        self.strings.insert(text, id);
        id
    }

    /// The id of the stack `frames` (innermost first), defining what is new
    /// (parents before children, strings before frames).
    fn stack(
        &mut self,
        s: &Scenario,
        frames: &[SimFrame],
        t: u64,
        sink: &mut dyn EventSink,
    ) -> u32 {
        let mut parent = 0;
        for &f in frames.iter().rev() {
            let frame = match self.frames.get(&f) {
                Some(&id) => id,
                None => {
                    let file = self.string(s, f.0, t, sink);
                    let function = self.string(s, f.2, t, sink);
                    let id = self.frames.len() as u32 + 1;
                    self.emit(
                        EventKind::Frame {
                            id,
                            file,
                            function,
                            line: f.1,
                        },
                        t,
                        sink,
                    );
                    self.frames.insert(f, id);
                    id
                }
            };
            parent = match self.stacks.get(&(frame, parent)) {
                Some(&id) => id,
                None => {
                    let id = self.stacks.len() as u32 + 1;
                    self.emit(EventKind::Stack { id, frame, parent }, t, sink);
                    self.stacks.insert((frame, parent), id);
                    id
                }
            };
        }
        parent
    }
}

impl ScenarioRunner {
    pub fn new(scenario: Scenario) -> ScenarioRunner {
        let alloc = SimAllocator::new(scenario.config.clone());
        let caption = scenario.description.to_string();
        ScenarioRunner {
            scenario,
            alloc,
            cursor: 0,
            live: HashMap::new(),
            roles: Vec::new(),
            roles_sent: 0,
            outside_said: false,
            caption,
            last_oom: None,
            last_stats_ns: None,
            steps: Vec::new(),
            current: None,
            defined: Vec::new(),
            context: 0,
            step_tag: 0,
            step_now: 0,
            capture: None,
            stack_defs: StackDefs::default(),
        }
    }

    /// The scenario again from its start (the demo's loop), in the same
    /// segment: the stack definitions made so far and a capture under way
    /// carry over.
    pub fn next_run(self) -> ScenarioRunner {
        let mut r = ScenarioRunner::new(self.scenario);
        r.stack_defs = self.stack_defs;
        r.capture = self.capture;
        r
    }

    /// Command 5: capture stacks from now until `steps` step boundaries
    /// have passed (0 stops a capture), at most `depth` frames each (0: the
    /// default). Returns the steps granted and the step it began in.
    pub fn capture_stacks(
        &mut self,
        steps: u32,
        depth: u16,
        sink: &mut dyn EventSink,
    ) -> (u64, u64) {
        self.capture = (steps > 0).then(|| Capture {
            boundaries_left: u64::from(steps),
            depth: match depth {
                0 => DEFAULT_STACK_DEPTH,
                d => usize::from(d),
            },
        });
        let t = self.alloc.now();
        self.tag(t, sink);
        (u64::from(steps), self.step_now)
    }

    /// Whether stacks are being captured.
    pub fn capturing(&self) -> bool {
        self.capture.is_some()
    }

    #[cfg(test)]
    pub(crate) fn scenario(&self) -> &Scenario {
        &self.scenario
    }
    pub fn allocator(&self) -> &SimAllocator {
        &self.alloc
    }
    /// The allocator, for commands from outside the script (`empty_cache`,
    /// peak reset, snapshots requested by a dashboard).
    pub fn allocator_mut(&mut self) -> &mut SimAllocator {
        &mut self.alloc
    }
    /// The caption of the most recent operation that had one.
    pub fn caption(&self) -> &str {
        &self.caption
    }
    pub fn is_finished(&self) -> bool {
        self.cursor >= self.scenario.ops.len()
    }
    /// Simulated time of the last applied operation.
    pub fn now(&self) -> u64 {
        self.alloc.now()
    }
    #[cfg(test)]
    /// The most recent OOM, if any.
    pub(crate) fn last_oom(&self) -> Option<&OomError> {
        self.last_oom.as_ref()
    }
    #[cfg(test)]
    /// Completed training steps so far.
    pub(crate) fn step_stats(&self) -> &[StepStats] {
        &self.steps
    }
    /// Fraction of the script applied, 0.0 to 1.0.
    pub fn progress(&self) -> f64 {
        if self.scenario.ops.is_empty() {
            1.0
        } else {
            self.cursor as f64 / self.scenario.ops.len() as f64
        }
    }

    /// Applies every operation due at or before `time_ns`; returns how many.
    pub fn advance_to(&mut self, time_ns: u64, sink: &mut dyn EventSink) -> usize {
        let mut n = 0;
        while self
            .scenario
            .ops
            .get(self.cursor)
            .is_some_and(|o| o.time_ns <= time_ns)
        {
            self.step(sink);
            n += 1;
        }
        n
    }

    /// Applies the next operation (None when finished).
    pub(crate) fn step(&mut self, sink: &mut dyn EventSink) -> Option<Applied> {
        let TimedOp {
            time_ns,
            op,
            caption,
        } = self.scenario.ops.get(self.cursor)?.clone();
        self.cursor += 1;
        self.alloc.set_time(time_ns);
        if let Some(c) = caption {
            // A caption about an OOM is only shown when there was one.
            self.caption = if c == OOM_CLOSING && self.alloc.stats().ooms == 0 {
                OOM_AVOIDED.to_string()
            } else if c == FRAG_CLOSING {
                frag_closing(&self.alloc.config().alloc)
            } else {
                c
            };
        }
        let oom = self.apply(&op, time_ns, sink);
        self.observe();
        let due = self
            .last_stats_ns
            .is_none_or(|t| time_ns >= t + STATS_INTERVAL_NS);
        if due || matches!(op, Op::Step(_)) || oom.is_some() || self.is_finished() {
            self.alloc.emit_stats(sink);
            self.last_stats_ns = Some(time_ns);
        }
        if self.is_finished() {
            self.finish_step();
        }
        Some(Applied { op, time_ns, oom })
    }

    /// Applies `op` to the allocator; returns its OOM, if any.
    fn apply(&mut self, op: &Op, time_ns: u64, sink: &mut dyn EventSink) -> Option<OomError> {
        match *op {
            Op::Alloc {
                tensor,
                size,
                stream,
            } => match self.alloc.malloc(size, stream, sink) {
                Ok(p) => {
                    self.live.insert(tensor, p);
                }
                Err(e) => {
                    self.caption = format!("OOM: {e}");
                    self.last_oom = Some(e.clone());
                    return Some(e);
                }
            },
            Op::Free { tensor } => {
                if let Some(p) = self.live.remove(&tensor) {
                    self.alloc.free(p, sink).expect("live tensor");
                }
            }
            Op::EmptyCache => self.alloc.empty_cache(sink),
            Op::Step(n) => {
                if !std::mem::replace(&mut self.outside_said, true) {
                    outside(time_ns, sink);
                }
                self.finish_step();
                self.current = Some(StepStats {
                    step: n,
                    allocated_min: u64::MAX,
                    ..StepStats::default()
                });
                sink.emit(Event {
                    time_ns,
                    kind: EventKind::Marker {
                        value: n,
                        source: Default::default(),
                    },
                });
                // The step hook stores the tag after writing the marker.
                self.step_tag = CtxTag::step_tag_of(n);
                self.step_now = n;
                if let Some(c) = self.capture.as_mut() {
                    c.boundaries_left -= 1;
                    if c.boundaries_left == 0 {
                        self.capture = None;
                    }
                }
                self.tag(time_ns, sink);
            }
            Op::Snapshot => {
                self.snapshot(sink);
            }
            Op::Roles(ref tensors) => {
                self.roles = tensors.clone();
                self.write_roles(time_ns, sink);
            }
            Op::Context(c) => {
                let i = c as usize;
                if (1..=self.scenario.contexts.len()).contains(&i)
                    && !self.defined.get(i - 1).copied().unwrap_or(false)
                {
                    self.define(i - 1, time_ns, sink);
                }
                self.context = c;
                self.tag(time_ns, sink);
            }
        }
        None
    }

    /// Tags the allocations that follow with the current context: while
    /// stacks are captured, its twin with a stack (defined on first use).
    fn tag(&mut self, time_ns: u64, sink: &mut dyn EventSink) {
        let context = match self.capture {
            Some(c) if self.context > 0 => self.stacked(self.context, c.depth, time_ns, sink),
            _ => self.context,
        };
        self.alloc.set_context(CtxTag {
            context,
            step_tag: self.step_tag,
        });
    }

    /// The id of scenario context `c` with its stack cut at `depth` frames:
    /// ids after the scenario's own contexts, defined on first use.
    fn stacked(&mut self, c: u32, depth: usize, time_ns: u64, sink: &mut dyn EventSink) -> u32 {
        let Some(ctx) = self.scenario.contexts.get(c as usize - 1) else {
            return c;
        };
        let depth = depth.min(ctx.stack.len());
        if let Some(&id) = self.stack_defs.contexts.get(&(c, depth)) {
            return id;
        }
        let (module, phase) = (ctx.module, ctx.phase);
        let frames = ctx.stack[..depth].to_vec();
        if !self.defined.get(c as usize - 1).copied().unwrap_or(false) {
            // Its module path's string.
            self.define(c as usize - 1, time_ns, sink);
        }
        let defs = &mut self.stack_defs;
        let stack = defs.stack(&self.scenario, &frames, time_ns, sink);
        let id = (self.scenario.contexts.len() + defs.contexts.len() + 1) as u32;
        defs.emit(
            EventKind::Context {
                id,
                module,
                phase,
                stack,
                step: None,
            },
            time_ns,
            sink,
        );
        defs.contexts.insert((c, depth), id);
        id
    }

    /// Writes the definitions of context `i` (its module's string first).
    fn define(&mut self, i: usize, time_ns: u64, sink: &mut dyn EventSink) {
        let SimContext { module, phase, .. } = self.scenario.contexts[i];
        if let Some(path) = (module as usize)
            .checked_sub(1)
            .and_then(|m| self.scenario.modules.get(m))
        {
            for kind in EventKind::string_chunks(module, path) {
                sink.emit(Event { time_ns, kind });
            }
        }
        sink.emit(Event {
            time_ns,
            kind: EventKind::Context {
                id: i as u32 + 1,
                module,
                phase,
                stack: 0,
                step: None,
            },
        });
        if self.defined.len() <= i {
            self.defined.resize(i + 1, false);
        }
        self.defined[i] = true;
    }

    /// Runs the rest of the script.
    pub fn run_to_end(&mut self, sink: &mut dyn EventSink) {
        while self.step(sink).is_some() {}
    }

    /// Emits a full state snapshot now, after the definitions made so far
    /// (a reader that attached late may have missed them; FORMAT.md,
    /// "Attaching mid-run").
    pub fn snapshot(&mut self, sink: &mut dyn EventSink) -> u32 {
        let t = self.alloc.now();
        for i in 0..self.defined.len() {
            if self.defined[i] {
                self.define(i, t, sink);
            }
        }
        for kind in &self.stack_defs.records {
            sink.emit(Event {
                time_ns: t,
                kind: *kind,
            });
        }
        let id = self.alloc.snapshot(sink);
        // The role list again, after the snapshot's blocks (as the agent).
        self.write_roles(t, sink);
        // What it holds outside the caching allocator, again (a producer
        // sends its totals with every snapshot, FORMAT.md 1.3).
        if self.outside_said {
            outside(t, sink);
        }
        id
    }

    /// Writes the last role list (the tensors still alive) as list
    /// `self.roles_sent + 1`.
    fn write_roles(&mut self, time_ns: u64, sink: &mut dyn EventSink) {
        if self.roles.is_empty() {
            return;
        }
        self.roles_sent += 1;
        let list = self.roles_sent;
        let live: Vec<(u64, u64, Held, u32)> = (self.roles.iter())
            .filter_map(|&(t, bytes, held, module)| {
                self.live.get(&t).map(|&addr| (addr, bytes, held, module))
            })
            .collect();
        let count = live.len() as u64;
        let mut emit = |kind| sink.emit(Event { time_ns, kind });
        emit(EventKind::Roles { list, count });
        for (addr, bytes, held, module) in live {
            emit(EventKind::Role {
                list,
                device: 0,
                addr,
                bytes,
                held,
                module,
            });
        }
        emit(EventKind::RolesEnd { list, count });
    }

    fn observe(&mut self) {
        let st = self.alloc.stats();
        if let Some(c) = self.current.as_mut() {
            c.allocated_min = c.allocated_min.min(st.allocated);
            c.allocated_max = c.allocated_max.max(st.allocated);
            c.reserved_max = c.reserved_max.max(st.reserved);
            c.inactive_split_max = c.inactive_split_max.max(st.inactive_split);
            c.allocated_end = st.allocated;
            c.reserved_end = st.reserved;
            c.inactive_split_end = st.inactive_split;
            c.segments_end = st.segments;
        }
    }

    fn finish_step(&mut self) {
        if let Some(mut c) = self.current.take() {
            let ooms_before: u64 = self.steps.iter().map(|s| s.ooms).sum();
            c.ooms = self.alloc.stats().ooms - ooms_before;
            self.steps.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::allocator::NullSink;

    #[test]
    fn runner_emits_markers_stats_and_captions() {
        let mut r = ScenarioRunner::new(Scenario::by_name("healthy").unwrap());
        let mut ev = Vec::new();
        let t0 = r.scenario().ops[0].time_ns;
        let first = r.advance_to(t0, &mut ev);
        // The opening snapshot, and entering the first layer's module.
        assert_eq!(first, 2);
        assert_eq!(r.scenario().ops[1].op, Op::Context(1));
        assert!(matches!(ev[0].kind, EventKind::SnapshotBegin { .. }));
        let n = r.advance_to(2_000_000_000, &mut ev);
        assert!(n > 10 && !r.is_finished());
        assert!(r.now() <= 2_000_000_000);
        assert!(r.caption().starts_with("step "), "{}", r.caption());
        assert!(ev
            .iter()
            .any(|e| matches!(e.kind, EventKind::Marker { value: 1, .. })));
        assert!(ev.iter().any(|e| matches!(e.kind, EventKind::Stats { .. })));
        assert!(ev.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        r.run_to_end(&mut NullSink);
        assert!(r.is_finished());
        assert!((r.progress() - 1.0).abs() < 1e-12);
    }

    /// Issue 47: each run names, at its first step and only then, what the
    /// job holds outside the caching allocator: the CUDA context (a total)
    /// and cuBLAS's workspace (an allocation), on device 0.
    #[test]
    fn each_run_names_its_context_and_cublas_at_its_first_step() {
        use vramscope_wire::event::{Library, OutsideKind, OutsideOp};
        let outside = |ev: &[Event]| -> Vec<(OutsideOp, Library, OutsideKind, u64)> {
            (ev.iter())
                .filter_map(|e| match e.kind {
                    EventKind::Outside(o) => Some((o.op, o.library, o.kind, o.bytes)),
                    _ => None,
                })
                .collect()
        };
        let mut r = ScenarioRunner::new(Scenario::by_name("healthy").unwrap());
        let mut ev: Vec<Event> = Vec::new();
        r.run_to_end(&mut ev);
        let want = [
            (
                OutsideOp::Total,
                Library::Cuda,
                OutsideKind::Context,
                SIM_CONTEXT,
            ),
            (
                OutsideOp::Alloc,
                Library::Cublas,
                OutsideKind::Allocation,
                SIM_CUBLAS,
            ),
        ];
        // Before the first marker, then again with each snapshot after it
        // (a producer sends its totals with every snapshot).
        let at = ev
            .iter()
            .position(|e| matches!(e.kind, EventKind::Outside(_)));
        let marker = ev
            .iter()
            .position(|e| matches!(e.kind, EventKind::Marker { .. }));
        assert!(at < marker, "{at:?} {marker:?}");
        let snapshots = (ev[marker.unwrap()..].iter())
            .filter(|e| matches!(e.kind, EventKind::SnapshotBegin { .. }))
            .count();
        let said = outside(&ev);
        assert_eq!(said.len(), 2 * (1 + snapshots), "{said:?}");
        assert!(said.chunks(2).all(|c| c == want), "{said:?}");
        let EventKind::Outside(cublas) = ev[at.unwrap() + 1].kind else {
            panic!("{:?}", ev[at.unwrap() + 1]);
        };
        assert_eq!(&cublas.name[..16], b"libcublas.so.13\0");
        // The next run says it again.
        let mut r = r.next_run();
        let mut again: Vec<Event> = Vec::new();
        r.run_to_end(&mut again);
        assert_eq!(outside(&again)[..2], want);
    }

    /// Command 5: the contexts of the next steps carry stacks (defined
    /// string, frame, stack, context in that order), then capture ends by
    /// itself and the plain contexts come back; a new run keeps the ids.
    #[test]
    fn captured_stacks_last_the_steps_asked_for() {
        let s = Scenario::by_name("leak").unwrap();
        let plain = s.contexts.len() as u32;
        let mut r = ScenarioRunner::new(s);
        let mut ev: Vec<Event> = Vec::new();
        // Into step 2, then capture for 2 step boundaries.
        while r.step_now < 2 {
            r.step(&mut ev);
        }
        assert_eq!(r.capture_stacks(2, 0, &mut ev), (2, 2));
        let from = ev.len();
        while r.step_now < 5 {
            r.step(&mut ev);
        }
        let tagged: Vec<(u64, u32)> = {
            let mut step = 2;
            let mut out = Vec::new();
            for e in &ev[from..] {
                match e.kind {
                    EventKind::Marker { value, .. } => step = value,
                    EventKind::Alloc { place, .. } if place.ctx.context != 0 => {
                        out.push((step, place.ctx.context))
                    }
                    _ => {}
                }
            }
            out
        };
        // Steps 2 and 3 (until step 4 began): contexts with stacks.
        assert!(tagged
            .iter()
            .filter(|(s, _)| *s < 4)
            .all(|(_, c)| *c > plain));
        assert!(tagged.iter().any(|(s, _)| *s == 3));
        assert!(tagged
            .iter()
            .filter(|(s, _)| *s >= 4)
            .all(|(_, c)| *c <= plain));
        assert!(!r.capturing());
        // Every stacked context's stack resolves through records written
        // before it: frames name train.py / model.py.
        let mut defs = crate::model::attrib::Definitions::default();
        let b = crate::model::Bounds::default();
        for e in &ev {
            defs.apply(&b, &e.kind);
        }
        let (_, c) = tagged[0];
        let v = defs.context_view(c);
        assert_eq!(v.module, "model.layers.0");
        assert_eq!(
            v.stack,
            [
                "model.py:31 forward",
                "train.py:57 training_step",
                "train.py:102 main"
            ]
        );
        // Depth 1: the innermost frame only, under a new id.
        let mut r2 = r.next_run();
        let ids = r2.stack_defs.contexts.len();
        r2.capture_stacks(1, 1, &mut ev);
        r2.run_to_end(&mut ev);
        assert!(r2.stack_defs.contexts.len() > ids);
        assert!(r2.stack_defs.contexts.keys().any(|(_, d)| *d == 1));
    }
}
