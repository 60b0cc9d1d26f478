//! The live advisor: [`super::advise`] fed one event at a time, as a
//! collector reads a running job.
//!
//! - **Warm-up.** The first requests are held (at most
//!   [`WARM_UP_REQUESTS`], or until [`WARM_UP_STEPS`] step marks have
//!   passed) so that the candidates can be chosen from the job's own
//!   request sizes, as `advise RECORDING` chooses them; then every
//!   candidate replays them and follows the stream.
//! - **One placement.** Each candidate runs in one replay, segments placed
//!   in the driver's order ([`super::placement`]); the six placements
//!   beside it, which give `advise RECORDING` its ranges, would cost seven
//!   times as much on a live job.
//! - **From the start, or from now.** A job watched from its first
//!   allocation is replayed exactly: its own setting with the addresses its
//!   segments really had, checked against the statistics samples it sends.
//!   A job watched from mid-run starts from the tensors it holds then
//!   ([`Live::held`]), placed afresh under every setting, its own included:
//!   the figures compare the steps from then on, and the own replay cannot
//!   be checked against the job's (its cache before then is not known).
//!
//! - **A new run** (MARKER source 5: the job starts over, as the demo's
//!   looping scenario does) starts the advice again: the candidates are
//!   chosen afresh from the new run's requests, every figure counts from
//!   there, and the tensors the job may still hold are its start, as for a
//!   job watched from mid-run. A tensor the job no longer holds leaves the
//!   replay, its free seen or not: a free, an allocation at its address,
//!   or a statistics sample saying the job holds nothing (a new process's
//!   allocator, the demo's new run). A run that begins with an empty
//!   allocator (the sample says nothing reserved either) is replayed
//!   exactly, as from a job's start.
//!
//! Pure: no clock, no I/O. The collector decides how much of the stream it
//! can afford to give it and says when it stopped ([`Live::stop`]).

use serde::Serialize;

use super::advise::{self, Advice, Candidate, Job, OomFate, Outcome, OwnCheck};
use super::ahead::{Steps, StepsAhead};
use super::allocator::SimConfig;
use super::conf::AllocConf;
use super::fit_live::{self, LiveFit};
use super::from_events::{Found, Stream};
use super::samples;
use super::spread::SpreadReplay;
use super::trace::Request;
use crate::model::device::HeldSegment;
use vramscope_wire::event::{Event, EventKind, MarkSource};

/// The most requests held before the candidates are chosen.
pub(crate) const WARM_UP_REQUESTS: usize = 1 << 16;
/// Step marks after which the candidates are chosen (if the warm-up's
/// requests are not all used by then).
pub(crate) const WARM_UP_STEPS: u64 = 2;
/// The most OOMs of the job whose fate each candidate keeps (more are
/// counted, not listed).
pub(crate) const MAX_FATES: usize = 256;

/// The job's own setting, as the collector knows it.
#[derive(Debug, Clone)]
pub struct Setting {
    /// `PYTORCH_CUDA_ALLOC_CONF` ("" for the defaults).
    pub conf: String,
    /// Device memory in bytes (NVML's figure; a limit marker that states
    /// the whole device replaces it).
    pub capacity: u64,
    pub torch: Option<(u32, u32)>,
}

/// How much of the job the advice covers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Coverage {
    /// Requests replayed (under every candidate).
    pub requests: u64,
    /// Step marks among them; the first and last step's number.
    pub steps: u64,
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    /// The job was watched from its first allocation.
    pub from_start: bool,
    /// The device advised.
    pub device: Option<u16>,
    /// Watched from mid-run: the tensors held when the advisor began, and
    /// their bytes.
    pub held: u64,
    pub held_bytes: u64,
    /// Frees of tensors the advisor never saw allocated (a replay keeps
    /// nothing for them; a count above 0 means its figures miss some).
    pub unknown_frees: u64,
    /// Tensors the job no longer held whose free the advisor never saw
    /// (an allocation came at the address, or a sample said the job held
    /// nothing): freed in the replay there.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unseen_frees: u64,
    /// The run the advice covers, from its start (MARKER source 5: the
    /// number the producer gave it), when the job started over while
    /// advised; None: the job's first run, or the run it was in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<u64>,
    /// Why the advisor stopped following the job, if it did: the advice
    /// covers the requests before that.
    pub stopped: Option<String>,
    /// What else the reader should know (the job's setting not read, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The live advice: the advice so far (None during the warm-up) and what
/// it covers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveAdvice {
    pub coverage: Coverage,
    pub advice: Option<Advice>,
    /// The job's own setting as the advisor took it.
    pub conf: String,
    /// The out-of-memory forecast by simulation, at the last step it was
    /// made (`sim::ahead`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ahead: Option<StepsAhead>,
    /// The job at other multiples of its batch, from the same steps
    /// (`sim::fit_live`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<LiveFit>,
}

impl LiveAdvice {
    /// The recommendation and what it saves of the job's own peak
    /// reserved, in bytes: negative where it trades memory for fewer
    /// out-of-memory errors.
    pub fn best(&self) -> Option<(&Outcome, i64)> {
        let a = self.advice.as_ref()?;
        let best = a.recommendation()?;
        let own = a.outcomes.iter().find(|o| o.candidate.own)?;
        let saving = own.totals.reserved_peak.hi as i64 - best.totals.reserved_peak.hi as i64;
        Some((best, saving))
    }
}

struct Run {
    candidate: Candidate,
    replay: SpreadReplay,
    /// Begins where the job's allocator was when watching began (its
    /// segments installed): the held tensors are adopted, not allocated.
    installed: bool,
    fates: Vec<(usize, OomFate)>,
}

/// One process's live advisor.
pub struct Live {
    setting: Setting,
    alloc: AllocConf,
    /// Memory limits stated by the job, per device: (bytes, whole device).
    limits: Vec<(u16, u64, bool)>,
    /// Created at the first allocator event (its device is advised).
    stream: Option<Stream>,
    /// The allocations of the tensors held when watching began (mid-run),
    /// in address order: replayed first under every candidate. (The
    /// stream knows their addresses from the start, so that a free of one
    /// during the warm-up finds it.)
    start: Vec<Request>,
    /// Where each of `start`'s tensors is held.
    start_addrs: Vec<u64>,
    /// The job's segments when watching began (mid-run), for the replay
    /// of its own setting to begin exactly there.
    segments: Vec<HeldSegment>,
    /// The requests and samples of the warm-up, in order (None once the
    /// candidates run).
    warm: Option<Vec<Found>>,
    runs: Vec<Run>,
    own: OwnCheck,
    coverage: Coverage,
    step_source: Option<MarkSource>,
    graph_pools: bool,
    expandable: bool,
    found: Vec<Found>,
    /// Each live tensor's request (id → size, stream): what a new run
    /// carries over.
    tensors: std::collections::HashMap<u64, (u64, u64)>,
    /// The last two steps' requests, and the forecast made from them
    /// (`sim::ahead`).
    steps: Steps,
    ahead: Option<StepsAhead>,
    /// "Will it fit" at other batches, made with the forecast.
    fit: Option<LiveFit>,
    /// The forecast's steps are the first optimizer's.
    steps_by_optimizer: bool,
}

impl Live {
    /// An advisor for a job watched from its first allocation.
    pub fn from_start(setting: Setting) -> Result<Live, String> {
        Live::new(setting, true)
    }

    /// An advisor for a job watched from now, holding `held` tensors
    /// (address, size, stream) on `device`.
    pub fn held(setting: Setting, device: u16, held: Vec<(u64, u64, u64)>) -> Result<Live, String> {
        let (n, bytes) = (held.len() as u64, held.iter().map(|h| h.1).sum());
        let mut l = Live::new(setting, false)?;
        let mut stream = Stream::new(device);
        let mut held = held;
        held.sort_unstable();
        l.start_addrs = held.iter().map(|h| h.0).collect();
        l.start = held
            .into_iter()
            .map(|(addr, size, s)| stream.held(addr, size, s))
            .collect();
        l.note_requests(&l.start.clone());
        l.stream = Some(stream);
        l.coverage.device = Some(device);
        l.coverage.held = n;
        l.coverage.held_bytes = bytes;
        Ok(l)
    }

    /// The job's segments when watching began, as its block map shows
    /// them: the replay of its own setting begins there, exactly, instead
    /// of placing the held tensors afresh (where one cannot be installed,
    /// it does so still).
    pub fn with_segments(mut self, segments: Vec<HeldSegment>) -> Live {
        self.segments = segments;
        self
    }

    fn new(setting: Setting, from_start: bool) -> Result<Live, String> {
        let alloc = AllocConf::parse(&setting.conf)
            .map_err(|e| format!("PYTORCH_CUDA_ALLOC_CONF={:?}: {e}", setting.conf))?;
        Ok(Live::blank(setting, alloc, from_start))
    }

    fn blank(setting: Setting, alloc: AllocConf, from_start: bool) -> Live {
        Live {
            setting,
            alloc,
            limits: Vec::new(),
            stream: None,
            start: Vec::new(),
            start_addrs: Vec::new(),
            segments: Vec::new(),
            warm: Some(Vec::new()),
            runs: Vec::new(),
            own: OwnCheck::default(),
            coverage: Coverage {
                from_start,
                ..Coverage::default()
            },
            step_source: None,
            graph_pools: false,
            expandable: false,
            found: Vec::new(),
            tensors: std::collections::HashMap::new(),
            steps: Steps::default(),
            ahead: None,
            fit: None,
            steps_by_optimizer: false,
        }
    }

    /// The job starts over (run `number`): the advice starts again, from
    /// the tensors it may still hold (module doc).
    fn new_run(&mut self, number: u64) {
        let mut carried: Vec<(u64, u64, u64)> = (self.stream.iter())
            .flat_map(Stream::live_tensors)
            .filter_map(|(addr, id)| {
                let (size, stream) = *self.tensors.get(&id)?;
                Some((addr, size, stream))
            })
            .collect();
        carried.sort_unstable();
        let mut next = Live::blank(self.setting.clone(), self.alloc.clone(), false);
        next.limits = std::mem::take(&mut self.limits);
        next.graph_pools = self.graph_pools;
        next.expandable = self.expandable;
        let c = &mut next.coverage;
        c.note = self.coverage.note.take();
        c.run = Some(number);
        c.device = self.coverage.device;
        c.held = carried.len() as u64;
        c.held_bytes = carried.iter().fold(0u64, |a, t| a.saturating_add(t.1));
        if let Some(device) = c.device {
            let mut stream = Stream::new(device);
            next.start = carried
                .into_iter()
                .map(|(addr, size, s)| stream.held(addr, size, s))
                .collect();
            next.note_requests(&next.start.clone());
            next.stream = Some(stream);
        }
        *self = next;
    }

    /// A sample of the device says the job holds no tensor: every one the
    /// advisor still holds is gone. Before any request of the advice,
    /// they are not its start after all (and with nothing reserved
    /// either, the allocator starts empty: replayed exactly, as from a
    /// job's start); after, they are freed in the replay.
    fn nothing_held(&mut self, s: &vramscope_wire::event::Stats) {
        if s.allocated != 0 {
            return;
        }
        let ids = match &mut self.stream {
            Some(stream) => stream.forget_live(),
            None => Vec::new(),
        };
        let before_any = self.warm.is_some() && self.coverage.requests == 0;
        if before_any {
            self.start.clear();
            self.tensors.clear();
            self.coverage.held = 0;
            self.coverage.held_bytes = 0;
            if s.reserved == 0 && s.segments == 0 {
                self.coverage.from_start = true;
            }
            return;
        }
        for id in ids {
            self.unseen(id);
        }
    }

    /// Tensor `id` is gone, its free not seen: freed in the replay.
    fn unseen(&mut self, id: u64) {
        self.coverage.unseen_frees += 1;
        let request = Request::Free { id };
        self.steps.request(&request);
        self.note_requests(std::slice::from_ref(&request));
        match &mut self.warm {
            Some(w) => w.push(Found::Request {
                request,
                oom: false,
            }),
            None => self.replay(&request, false),
        }
    }

    /// Keeps each live tensor's size and stream (for a new run).
    fn note_requests(&mut self, requests: &[Request]) {
        for r in requests {
            match *r {
                Request::Alloc {
                    id, size, stream, ..
                } => {
                    self.tensors.insert(id, (size, stream));
                }
                Request::Free { id } => {
                    self.tensors.remove(&id);
                }
                _ => {}
            }
        }
    }

    /// The advisor stops following the job: the advice covers what it saw.
    pub fn stop(&mut self, why: impl Into<String>) {
        if self.coverage.stopped.is_none() {
            self.coverage.stopped = Some(why.into());
        }
        if self.warm.is_some() {
            self.start_candidates();
        }
    }

    /// Something the reader of the advice should know.
    pub fn note(&mut self, note: impl Into<String>) {
        self.coverage.note = Some(note.into());
    }

    pub(crate) fn stopped(&self) -> bool {
        self.coverage.stopped.is_some()
    }

    /// Reads one of the job's events.
    pub fn feed(&mut self, e: &Event) {
        if self.stopped() {
            return;
        }
        if self.stream.is_none() {
            if let Some(device) = allocator_device(&e.kind) {
                self.stream = Some(Stream::new(device));
                self.coverage.device = Some(device);
            }
        }
        let mut found = std::mem::take(&mut self.found);
        match &mut self.stream {
            Some(s) => s.feed(e, &mut found),
            None => {
                if let EventKind::Marker { source, value } = e.kind {
                    found.push(Found::Mark { source, value });
                }
            }
        }
        for f in found.drain(..) {
            self.take(f);
        }
        self.found = found;
    }

    fn take(&mut self, f: Found) {
        match f {
            Found::Request { request, oom } => {
                self.note_requests(std::slice::from_ref(&request));
                self.steps.request(&request);
                self.coverage.requests += 1;
                match &mut self.warm {
                    Some(w) => {
                        w.push(Found::Request { request, oom });
                        if self.coverage.requests >= WARM_UP_REQUESTS as u64 {
                            self.start_candidates();
                        }
                    }
                    None => self.replay(&request, oom),
                }
            }
            Found::Unseen { id } => self.unseen(id),
            Found::Sample(s) if self.warm.is_some() => {
                self.nothing_held(&s);
                if let Some(w) = &mut self.warm {
                    w.push(Found::Sample(s));
                    // Samples count against the warm-up's bound too.
                    if w.len() >= 2 * WARM_UP_REQUESTS {
                        self.start_candidates();
                    }
                }
            }
            Found::Mark { source, value } => self.mark(source, value),
            Found::Sample(s) => {
                self.nothing_held(&s);
                self.check(&s);
            }
            Found::Expandable => self.expandable = true,
            Found::GraphPool => self.graph_pools = true,
        }
    }

    /// A sample the job sent, against its own replay (from its start only).
    fn check(&mut self, s: &vramscope_wire::event::Stats) {
        let own = self.runs.iter().find(|r| r.candidate.own);
        if let Some(run) = own.filter(|_| self.coverage.from_start) {
            let sim = run.replay.stats();
            let diffs = samples::differences(&samples::TIME_FIGURES, &sim, s);
            self.own.see(&diffs, s);
        }
    }

    fn mark(&mut self, source: MarkSource, value: u64) {
        match source {
            MarkSource::MemoryLimit {
                device,
                whole_device,
            } => {
                self.limits.retain(|l| l.0 != device);
                self.limits.push((device, value, whole_device));
            }
            MarkSource::Run => self.new_run(value),
            MarkSource::Other(_) => {}
            s => {
                self.forecast_boundary(s, value);
                // Steps are counted by the first source that marks them
                // (a job with its own marks and an optimizer's has both).
                if *self.step_source.get_or_insert(s) != s {
                    return;
                }
                let c = &mut self.coverage;
                c.steps += 1;
                c.first_step.get_or_insert(value);
                c.last_step = Some(value);
                if self.warm.is_some() && c.steps >= WARM_UP_STEPS {
                    self.start_candidates();
                }
            }
        }
    }

    /// A step mark, for the forecast: its steps end at the first
    /// optimizer's steps when the job has them (marked as each step ends,
    /// numbered as the job counts them), else at the marks that count the
    /// advice's steps.
    fn forecast_boundary(&mut self, source: MarkSource, value: u64) {
        let optimizer = matches!(source, MarkSource::OptimizerStep { optimizer } if optimizer <= 1);
        if optimizer && !self.steps_by_optimizer {
            self.steps_by_optimizer = true;
            self.steps = Steps::default();
        }
        let counts = if self.steps_by_optimizer {
            optimizer
        } else {
            self.step_source.is_none_or(|s| s == source)
        };
        if counts {
            self.steps.boundary();
            self.forecast(value);
        }
    }

    /// The forecast by simulation at the step `at_step` just ended, from
    /// the job's own replay, when it is due.
    fn forecast(&mut self, at_step: u64) {
        let Some(own) = self.runs.iter().find(|r| r.candidate.own) else {
            return;
        };
        let cfg = self.config();
        let (limit, fraction) = match cfg.memory_fraction {
            Some(f) => ((cfg.capacity as f64 * f) as u64, true),
            None => (cfg.capacity, false),
        };
        let now = own.replay.main();
        let Some(a) = self.steps.forecast(now, at_step, limit, fraction) else {
            return;
        };
        self.ahead = Some(a);
        // "Will it fit" at other batches, from the same steps, when due
        // with the forecast (its work paid back as the forecast's is).
        if let Some((prev, last)) = self.steps.last_two() {
            let kept: std::collections::HashSet<u64> =
                self.tensors.values().map(|&(size, _)| size).collect();
            let f = fit_live::fit(now, prev, last, &kept, at_step, (limit, fraction));
            self.steps.charge(f.requests);
            self.fit = Some(f);
        }
    }

    /// The job's setting on the advised device: its options, and the
    /// limit it stated.
    fn config(&self) -> SimConfig {
        let device = self.coverage.device.unwrap_or(0);
        let mut cfg = SimConfig {
            device,
            capacity: self.setting.capacity,
            alloc: self.alloc.clone(),
            memory_fraction: None,
        };
        if let Some(&(_, limit, whole)) = self.limits.iter().find(|l| l.0 == device) {
            if whole {
                cfg.capacity = limit;
            } else if cfg.capacity > 0 {
                cfg.memory_fraction = Some((limit as f64 / cfg.capacity as f64).min(1.0));
            }
        }
        cfg
    }

    /// Chooses the candidates from the warm-up's requests and replays
    /// them under each.
    fn start_candidates(&mut self) {
        let Some(warm) = self.warm.take() else {
            return;
        };
        let cfg = self.config();
        let mut conf = self.setting.conf.clone();
        if self.expandable && !cfg.alloc.expandable_segments {
            // The job's allocator mapped pages: it runs with expandable
            // segments whatever the environment said.
            conf = advise::with_options(&conf, &[("expandable_segments", "True".into())]);
        }
        let alloc = AllocConf::parse(&conf).unwrap_or_else(|_| cfg.alloc.clone());
        let cfg = SimConfig { alloc, ..cfg };
        let start = std::mem::take(&mut self.start);
        let requests = warm.iter().filter_map(|f| match f {
            Found::Request { request, .. } => Some(request),
            _ => None,
        });
        let job = Job {
            requests: start.iter().chain(requests).cloned().collect(),
            conf: conf.clone(),
            cfg: cfg.clone(),
            torch: self.setting.torch,
            graph_pools: self.graph_pools,
            ooms: Vec::new(),
            placed: Vec::new(),
            recorded: Vec::new(),
        };
        self.own.job_ooms = 0;
        self.runs = advise::candidates(&job)
            .into_iter()
            .map(|c| {
                let ccfg = SimConfig {
                    alloc: c.parsed.clone(),
                    ..cfg.clone()
                };
                let installed = (c.own && !self.coverage.from_start && !self.segments.is_empty())
                    .then(|| SpreadReplay::installed(&ccfg, &self.segments))
                    .flatten();
                let (replay, installed) = match installed {
                    Some(r) => (r, true),
                    None if c.own && self.coverage.from_start => {
                        (SpreadReplay::exact(&ccfg), false)
                    }
                    None => (SpreadReplay::driver_only(&ccfg), false),
                };
                Run {
                    candidate: c,
                    replay,
                    installed,
                    fates: Vec::new(),
                }
            })
            .collect();
        self.setting.conf = conf;
        for (i, r) in start.iter().enumerate() {
            let at = self.start_addrs.get(i).copied();
            for run in &mut self.runs {
                match (r, at) {
                    // Where the map showed it allocated: adopted.
                    (Request::Alloc { id, .. }, Some(addr))
                        if run.installed && run.replay.adopt(*id, addr) => {}
                    _ => {
                        run.replay.step(r);
                    }
                }
            }
        }
        for f in warm {
            match f {
                Found::Request { request, oom } => self.replay(&request, oom),
                Found::Sample(s) => self.check(&s),
                _ => {}
            }
        }
    }

    /// One request under every candidate.
    fn replay(&mut self, req: &Request, oom: bool) {
        let at = self.runs.first().map_or(0, |r| r.replay.steps);
        if oom {
            self.own.job_ooms += 1;
        }
        for run in &mut self.runs {
            let (rep, _) = run.replay.step(req);
            if run.candidate.own {
                self.own.replay_ooms = rep.ooms;
            }
            if oom && run.fates.len() < MAX_FATES {
                let fate = if rep.oom.is_some() {
                    OomFate::Fails
                } else {
                    OomFate::Avoided
                };
                run.fates.push((at, fate));
            }
        }
    }

    /// The advice so far.
    pub fn advice(&self) -> LiveAdvice {
        let mut coverage = self.coverage.clone();
        coverage.unknown_frees = self.stream.as_ref().map_or(0, Stream::unknown_frees);
        let advice = (!self.runs.is_empty()).then(|| {
            let mut outcomes: Vec<Outcome> = self
                .runs
                .iter()
                .filter_map(|r| {
                    Some(Outcome {
                        candidate: r.candidate.clone(),
                        totals: r.replay.totals()?,
                        tied_steps: 0,
                        job_ooms: r.fates.clone(),
                        peak_change: 0,
                    })
                })
                .collect();
            let best = advise::rank(&mut outcomes);
            let cfg = self.config();
            Advice {
                requests: self.coverage.requests as usize,
                capacity: cfg.capacity,
                memory_fraction: cfg.memory_fraction,
                own: self.own.clone(),
                outcomes,
                best,
            }
        });
        LiveAdvice {
            coverage,
            advice: advice.filter(|a| !a.outcomes.is_empty()),
            conf: self.setting.conf.clone(),
            ahead: self.ahead.clone(),
            fit: self.fit.clone(),
        }
    }
}

/// The device an allocator event is on (None for other events).
fn allocator_device(k: &EventKind) -> Option<u16> {
    match k {
        EventKind::Alloc { place, .. }
        | EventKind::Oom { place, .. }
        | EventKind::SegmentAlloc { place, .. }
        | EventKind::SegmentMap { place, .. } => Some(place.device),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::allocator::SimAllocator;

    fn setting() -> Setting {
        Setting {
            conf: String::new(),
            capacity: 8 << 30,
            torch: Some((2, 11)),
        }
    }

    fn mark(step: u64) -> Event {
        Event {
            time_ns: 0,
            kind: EventKind::Marker {
                source: MarkSource::User,
                value: step,
            },
        }
    }

    /// A job of `steps` steps from the simulator: each step allocates
    /// activations of changing sizes and frees them, over parameters held
    /// throughout; a statistics sample at every step's end. The events;
    /// the tensors live (address, size) and the number of events written
    /// when step `at` is half done; and the job's peaks (reserved,
    /// allocated).
    #[allow(clippy::type_complexity)]
    fn job(steps: u64, at: u64) -> (Vec<Event>, (Vec<(u64, u64)>, usize), (u64, u64)) {
        let cfg = SimConfig {
            capacity: 8 << 30,
            ..SimConfig::default()
        };
        let mut a = SimAllocator::new(cfg);
        let mut ev: Vec<Event> = Vec::new();
        let mut live = std::collections::BTreeMap::new();
        for i in 0..20u64 {
            let size = ((i % 5) + 1) << 21;
            live.insert(a.malloc(size, 0, &mut ev).unwrap(), size);
        }
        let mut cut = (Vec::new(), 0);
        for step in 1..=steps {
            let mut acts = Vec::new();
            for j in 0..30u64 {
                let size = ((step * 31 + j * 17) % 40 + 1) << 20;
                let p = a.malloc(size, 0, &mut ev).unwrap();
                live.insert(p, size);
                acts.push(p);
                if j % 3 == 2 {
                    let p = acts.remove(0);
                    live.remove(&p);
                    a.free(p, &mut ev).unwrap();
                }
                if step == at && j == 15 {
                    cut = (live.iter().map(|(p, s)| (*p, *s)).collect(), ev.len());
                }
            }
            for p in acts {
                live.remove(&p);
                a.free(p, &mut ev).unwrap();
            }
            a.emit_stats(&mut ev);
            ev.push(mark(step));
        }
        let st = a.stats();
        (ev, cut, (st.reserved_peak, st.allocated_peak))
    }

    #[test]
    fn a_job_watched_from_its_start_is_replayed_exactly() {
        let (ev, _, (peak, _)) = job(12, 0);
        let mut live = Live::from_start(setting()).unwrap();
        for e in &ev {
            live.feed(e);
        }
        let a = live.advice();
        assert!(a.coverage.from_start && a.coverage.stopped.is_none());
        assert_eq!(a.coverage.steps, 12);
        let advice = a.advice.expect("candidates chosen after two steps");
        assert_eq!(advice.own.compared, 12, "{:?}", advice.own);
        assert!(advice.own.reproduces(), "{:?}", advice.own);
        let own = advice.outcomes.iter().find(|o| o.candidate.own).unwrap();
        assert_eq!(own.totals.reserved_peak.hi, peak);
        assert!(advice.outcomes.len() >= 5);
        assert!(advice
            .outcomes
            .iter()
            .any(|o| o.candidate.conf == "expandable_segments:True"));
    }

    #[test]
    fn a_job_watched_from_mid_run_starts_from_the_tensors_it_holds() {
        // Cut in the middle of step 6: activations are live then, and
        // freed during the advisor's warm-up.
        let (ev, (held, at), (_, allocated_peak)) = job(12, 6);
        let held_bytes: u64 = held.iter().map(|h| h.1).sum();
        let mut live =
            Live::held(setting(), 0, held.iter().map(|&(p, s)| (p, s, 0)).collect()).unwrap();
        for e in &ev[at..] {
            live.feed(e);
        }
        let a = live.advice();
        assert!(!a.coverage.from_start);
        assert_eq!(
            (a.coverage.held, a.coverage.held_bytes),
            (held.len() as u64, held_bytes)
        );
        assert_eq!(
            (a.coverage.first_step, a.coverage.last_step),
            (Some(6), Some(12))
        );
        // Every free found its tensor: the held ones included, those
        // freed while the candidates were being chosen too.
        assert_eq!(a.coverage.unknown_frees, 0);
        let advice = a.advice.unwrap();
        // Its cache before then is not known: the own replay is not checked.
        assert_eq!(advice.own.compared, 0);
        for o in &advice.outcomes {
            // Under its own rounding, no more bytes allocated than the job
            // ever had at once.
            if o.candidate.own {
                assert!(o.totals.allocated_peak.hi <= allocated_peak, "{o:?}");
            }
            assert!(o.totals.reserved_peak.hi >= held_bytes, "{o:?}");
            assert_eq!(o.totals.ooms.hi, 0, "{o:?}");
        }
    }

    #[test]
    fn stopping_during_the_warm_up_advises_on_what_was_seen() {
        let (ev, _, _) = job(1, 0);
        let mut live = Live::from_start(setting()).unwrap();
        let before_mark = ev
            .iter()
            .position(|e| matches!(e.kind, EventKind::Marker { .. }))
            .unwrap();
        for e in &ev[..before_mark] {
            live.feed(e);
        }
        assert!(live.advice().advice.is_none(), "still warming up");
        live.stop("told to");
        let a = live.advice();
        assert_eq!(a.coverage.stopped.as_deref(), Some("told to"));
        assert!(a.advice.is_some());
        // Nothing more is taken once stopped.
        let n = a.coverage.requests;
        for e in &ev {
            live.feed(e);
        }
        assert_eq!(live.advice().coverage.requests, n);
    }

    #[test]
    fn a_setting_the_advisor_does_not_know_is_refused_with_its_text() {
        let e = Live::from_start(Setting {
            conf: "max_split_size_mb:banana".into(),
            ..setting()
        })
        .err()
        .unwrap();
        assert!(e.contains("max_split_size_mb:banana"), "{e}");
    }

    /// Issue 44, item 7: `advise PID` begun as a run of `demo leak`
    /// ended started from the run's 320 tensors (5.31 GiB) and kept them
    /// for ever: the new run's replay peaked at 8.77 GiB, and the advice
    /// was for memory the job had let go of. The demo starts a new run as
    /// a new process would (MARKER source 5, then its fresh allocator's
    /// empty snapshot and statistics). Now a new run resets the advice,
    /// the tensors the job no longer holds leave the replay, and the run
    /// is advised exactly as an advisor watching it from its start does.
    #[test]
    fn item7_a_new_run_resets_the_live_advisor() {
        use crate::model::{Model, ModelConfig, ProcessKey};
        use crate::sim::scenario::{Scenario, ScenarioRunner};
        // Two runs of the demo's leak scenario, the run between them as
        // `vramscope demo` makes it.
        let mut runner = ScenarioRunner::new(Scenario::by_name("leak").unwrap());
        let mut ev: Vec<Event> = Vec::new();
        runner.run_to_end(&mut ev);
        let ended = ev.len();
        runner.allocator_mut().empty_cache(&mut ev);
        runner = runner.next_run();
        ev.push(Event {
            time_ns: 0,
            kind: EventKind::Marker {
                value: 2,
                source: MarkSource::Run,
            },
        });
        let second = ev.len();
        runner.run_to_end(&mut ev);
        let run2_peak = runner.allocator().stats().reserved_peak;
        // The advisor begins as run 1 ends, from what the model holds.
        let key = ProcessKey {
            pid: 1,
            start_time: 1,
        };
        let mut m = Model::new(ModelConfig::default());
        m.apply_all(key, ev[..ended].iter());
        let (device, held, segments) = m.process(key).unwrap().advisor_start().unwrap().unwrap();
        assert_eq!(held.len(), 320);
        let mut live = Live::held(setting(), device, held)
            .unwrap()
            .with_segments(segments);
        for e in &ev[ended..] {
            live.feed(e);
        }
        let a = live.advice();
        // Run 2, from its allocator's start: nothing carried over.
        assert_eq!(a.coverage.run, Some(2));
        assert!(a.coverage.from_start, "{:?}", a.coverage);
        assert_eq!((a.coverage.held, a.coverage.unknown_frees), (0, 0));
        let advice = a.advice.clone().unwrap();
        let own = advice.outcomes.iter().find(|o| o.candidate.own).unwrap();
        assert!(
            own.totals.reserved_peak.hi <= run2_peak,
            "own replay's peak {} above the job's {run2_peak}",
            own.totals.reserved_peak.hi
        );
        assert!(advice.own.reproduces(), "{:?}", advice.own);
        // What an advisor watching run 2 from its start says.
        let mut fresh = Live::from_start(setting()).unwrap();
        for e in &ev[second..] {
            fresh.feed(e);
        }
        let f = fresh.advice().advice.unwrap();
        let totals = |a: &Advice| -> Vec<(String, u64, u64)> {
            (a.outcomes.iter())
                .map(|o| {
                    let t = &o.totals;
                    (
                        o.candidate.conf.clone(),
                        t.reserved_peak.hi,
                        t.allocated_peak.hi,
                    )
                })
                .collect()
        };
        assert_eq!(totals(&advice), totals(&f));
        assert_eq!(advice.best, f.best);
    }
}
