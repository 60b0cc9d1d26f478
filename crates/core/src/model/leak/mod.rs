//! Leak detection a user can act on.
//!
//! 1. **Steps.** A training loop repeats. Step boundaries come, in order of
//!    precedence, from the process's own `vramscope.mark()` markers, from
//!    PyTorch's optimizer step hook (the agent writes one marker per
//!    `optimizer.step()` of the first optimizer), or from the period of the
//!    allocation pattern (see [`super::period`]). A source that appears
//!    later wins and the count starts over with it. Each step's *floor* is
//!    the lowest allocated total during it: what stays allocated between
//!    steps (weights, optimizer state, and leaks).
//! 2. **Floor trend.** Over the last `window_steps` floors the detector takes
//!    the Theil–Sen slope (median of pairwise slopes, robust to outliers)
//!    and Kendall's τ (how consistently floors rise). A process is flagged
//!    when at least `min_steps` steps were seen, τ ≥ `min_trend`, the slope
//!    is positive and the growth over the window is at least
//!    `min_growth_bytes`. A steady loop, noisy or not, has τ near 0 and is
//!    not flagged. The first step at which a run was flagged is kept.
//! 3. **Culprits.** Live tensor counts per requested size are recorded at
//!    every step boundary (last 32 boundaries); sizes whose live counts rise
//!    with the same robust tests are named, most growth first, with the step
//!    they were first allocated at and the age of their oldest live one.
//! 4. **Origins.** When a leak is flagged and the producer tags its
//!    allocations (FORMAT 1.1 contexts), the live blocks are grouped by
//!    module and captured stack: a group whose blocks born in most of the
//!    last steps are still alive is named, most bytes per step first (see
//!    [`growing_origins`]).
//! 5. **Runs.** A job that starts over (the demo's loop, `new_run()`) sends a
//!    run marker: the verdict so far is kept with its run and the detector
//!    starts again.
//!
//! The detector ([`LeakDetector`]) is here; [`report`] holds the verdict's
//! types, [`origins`] names the modules a leak comes from (item 4), and
//! [`stats`] the robust statistics the trends are judged by.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

pub use super::config::LeakConfig;
use super::device::Block;
use super::period::{Found, PeriodFinder};
use super::rules;
use vramscope_wire::event::{BlockState, MarkSource};

mod origins;
mod report;
mod stats;

pub(crate) use origins::growing_origins;
pub use origins::LeakOrigin;
pub use report::{LeakReport, LeakSize, RunVerdict, StepSource, SurvivorTest};
use stats::{kendall_tau, sign, theil_sen};

/// Boundaries of live-count history kept per size.
pub(crate) const SIZE_HISTORY: usize = 32;
/// Distinct sizes tracked by default (`Bounds::leak_sizes`).
const MAX_SIZES: usize = 4096;

/// Earlier runs remembered.
const RUNS_KEPT: usize = 16;

/// The first steps of a run whose floors may be warm-up (see
/// `LeakDetector::floor_trend`).
const WARM_UP: u64 = 4;

/// A multiplicative hasher for `u64` keys (sizes are not attacker-chosen
/// in a way that matters: the map is bounded).
#[derive(Default, Clone, Copy)]
pub(crate) struct SizeHasher(u64);

impl Hasher for SizeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

#[derive(Debug, Clone)]
struct SizeEntry {
    live: u64,
    /// Live count at boundary `b`, at index `b % SIZE_HISTORY`.
    hist: [u32; SIZE_HISTORY],
    /// The step at which the size was first allocated.
    first_step: u64,
}

/// Online state of the leak heuristic for one process.
#[derive(Debug, Clone)]
pub struct LeakDetector {
    cfg: LeakConfig,
    source: StepSource,
    /// With optimizer steps: the optimizer whose steps count.
    optimizer: Option<u32>,
    period: PeriodFinder,
    /// An allocation of this size was just seen (its total comes next).
    pending_alloc: Option<u64>,
    steps: u64,
    current: u64,
    /// The lowest total since the last boundary.
    step_min: Option<u64>,
    floors: VecDeque<u64>,
    /// Σ sign(later − earlier) over the pairs of `floors` (Kendall's S).
    rises: i64,
    sizes: HashMap<u64, SizeEntry, BuildHasherDefault<SizeHasher>>,
    /// Distinct sizes tracked at most.
    max_sizes: usize,
    /// Allocations of a size not tracked because `max_sizes` were.
    dropped: u64,
    /// The latest time seen, the time of this run's first step, and when
    /// (at which step) it was first flagged.
    now_ns: u64,
    first_step_ns: Option<u64>,
    first_flag: Option<(u64, u64)>,
    run: u64,
    earlier_runs: VecDeque<RunVerdict>,
    /// Steps counted before the last restart (earlier runs, or a step
    /// source given up): with `steps`, every step seen.
    steps_before: u64,
    /// Whether this run's first marker of the counted source has come. A
    /// marker begins a step, so the first one opens the first step and
    /// closes none (before it: the job's setup, no step). The first run
    /// got this from its source's first marker restarting the count; a
    /// later run keeps its source, and so needs it said (else it counted
    /// its setup as a step: 16 steps where the first run had 15).
    started: bool,
    /// When this run's latest steps began (at most
    /// [`SURVIVOR_WINDOW`] + [`SURVIVOR_SKIP`] + 1): the survivor test
    /// dates live blocks by them.
    step_starts: VecDeque<u64>,
    /// The survivor test at the latest step boundary.
    survivors: SurvivorTest,
}

/// Steps the survivor test looks at: the [`SURVIVOR_WINDOW`] finished
/// steps before the latest [`SURVIVOR_SKIP`].
pub(crate) const SURVIVOR_WINDOW: u64 = 48;
/// The latest finished steps the survivor test leaves out: what a step
/// hands to the next (its loss, the next batch, a step's logits kept for
/// logging) lives a step or two.
pub(crate) const SURVIVOR_SKIP: u64 = 4;

impl LeakDetector {
    pub(crate) fn new(cfg: LeakConfig) -> Self {
        Self {
            floors: VecDeque::with_capacity(cfg.window_steps.min(4096)),
            cfg,
            source: StepSource::None,
            optimizer: None,
            period: PeriodFinder::default(),
            pending_alloc: None,
            steps: 0,
            current: 0,
            step_min: None,
            rises: 0,
            sizes: HashMap::default(),
            max_sizes: MAX_SIZES,
            dropped: 0,
            now_ns: 0,
            first_step_ns: None,
            first_flag: None,
            run: 1,
            earlier_runs: VecDeque::new(),
            steps_before: 0,
            started: false,
            step_starts: VecDeque::new(),
            survivors: SurvivorTest::default(),
        }
    }

    /// Track at most `max` distinct sizes (`Bounds::leak_sizes`): a new
    /// size beyond is not tracked (and counted); idle sizes are pruned at
    /// step boundaries.
    pub(crate) fn with_max_sizes(mut self, max: usize) -> Self {
        self.max_sizes = max.max(1);
        self
    }

    /// Allocations whose size could not be tracked (the size bound).
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Distinct sizes tracked now.
    pub fn tracked_sizes(&self) -> usize {
        self.sizes.len()
    }

    /// Nanoseconds per step over this run's steps so far (None before two).
    pub(crate) fn step_period_ns(&self) -> Option<f64> {
        let first = self.first_step_ns?;
        (self.steps >= 2 && self.now_ns > first)
            .then(|| (self.now_ns - first) as f64 / (self.steps - 1) as f64)
    }

    /// Steps counted in this run.
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }
    /// The thresholds a verdict is judged against.
    pub(crate) fn config(&self) -> &LeakConfig {
        &self.cfg
    }

    #[cfg(test)]
    pub(crate) fn source(&self) -> StepSource {
        self.source
    }
    #[cfg(test)]
    /// The recorded floors, oldest first.
    pub(crate) fn floors(&self) -> impl Iterator<Item = u64> + '_ {
        self.floors.iter().copied()
    }

    /// A tensor of `requested` bytes came to life.
    #[inline]
    pub(crate) fn on_alloc(&mut self, requested: u64) {
        self.pending_alloc = Some(requested);
        let full = self.sizes.len() >= self.max_sizes;
        if let Some(e) = self.sizes.get_mut(&requested) {
            e.live = e.live.saturating_add(1);
        } else if full {
            self.dropped = self.dropped.saturating_add(1);
        } else {
            self.sizes.insert(
                requested,
                SizeEntry {
                    live: 1,
                    hist: [0; SIZE_HISTORY],
                    first_step: self.steps,
                },
            );
        }
    }

    /// A tensor of `requested` bytes was released.
    #[inline]
    pub(crate) fn on_release(&mut self, requested: u64) {
        if let Some(e) = self.sizes.get_mut(&requested) {
            e.live = e.live.saturating_sub(1);
        }
    }

    /// Replace live counts by a recount (after a snapshot).
    pub(crate) fn recount<'a>(&mut self, allocated: impl Iterator<Item = &'a Block>) {
        for e in self.sizes.values_mut() {
            e.live = 0;
        }
        // A recount is no new allocation: sizes it cannot track are not
        // counted as dropped again, nor fed to the period finder.
        let dropped = self.dropped;
        for b in allocated.filter(|b| b.state == BlockState::Allocated) {
            self.on_alloc(b.requested);
        }
        self.pending_alloc = None;
        self.dropped = dropped;
    }

    /// The process's allocated total changed to `value` at `t`.
    #[inline]
    pub(crate) fn on_value(&mut self, value: u64, t: u64) {
        self.current = value;
        self.now_ns = self.now_ns.max(t);
        self.step_min = Some(self.step_min.map_or(value, |m| m.min(value)));
        if self.source > StepSource::AllocationPeriod {
            // Markers or optimizer steps give the steps, for the rest of
            // the process's life (a source never gives way to a worse one):
            // the period finder's answer would be discarded.
            self.pending_alloc = None;
            return;
        }
        self.find_period(value);
    }

    /// The period finder's part of [`Self::on_value`].
    fn find_period(&mut self, value: u64) {
        let found = match self.pending_alloc.take() {
            Some(size) => self.period.on_alloc(size, value),
            None => {
                self.period.on_value(value);
                return;
            }
        };
        match found {
            Found::Steps(steps) => {
                for s in steps {
                    self.source = StepSource::AllocationPeriod;
                    self.boundary(s.floor);
                }
            }
            Found::Recount(steps) => {
                self.restart(StepSource::AllocationPeriod);
                for s in steps {
                    self.boundary(s.floor);
                }
                self.step_min = Some(value);
            }
        }
    }

    /// A step boundary (MARKER) from `source`, at `t`.
    pub(crate) fn on_marker(&mut self, source: MarkSource, t: u64) {
        self.now_ns = self.now_ns.max(t);
        let from = match source {
            MarkSource::Unknown | MarkSource::User => StepSource::Markers,
            MarkSource::OptimizerStep { optimizer } => {
                // Only the first optimizer's steps count (a GAN's second
                // optimizer would double them).
                let n = optimizer.max(1);
                match self.optimizer {
                    Some(o) if n > o => return,
                    Some(o) if n == o => {}
                    _ => {
                        self.optimizer = Some(n);
                        if self.source == StepSource::OptimizerSteps {
                            self.restart(StepSource::OptimizerSteps);
                            return;
                        }
                    }
                }
                StepSource::OptimizerSteps
            }
            MarkSource::Run => return self.new_run(),
            MarkSource::Inferred | MarkSource::Other(_) | MarkSource::MemoryLimit { .. } => return,
        };
        if from < self.source {
            return;
        }
        if from > self.source {
            // A better source wins: start over with it.
            self.restart(from);
            return;
        }
        if !self.started {
            // The run's first step begins (see `started`).
            self.started = true;
            self.step_min = Some(self.current);
            return;
        }
        let floor = self.step_min.unwrap_or(self.current);
        self.boundary(floor);
    }

    /// Count steps again from `source` (a better one appeared, or the
    /// period changed): floors, the step count and this run's flag go.
    fn restart(&mut self, source: StepSource) {
        self.source = source;
        if source > StepSource::AllocationPeriod {
            // No period finding from now on (see `on_value`): free its window.
            self.period = PeriodFinder::default();
        }
        self.floors.clear();
        self.rises = 0;
        self.steps_before = self.steps_before.saturating_add(self.steps);
        self.steps = 0;
        // Called at a marker of the new source, which begins a step.
        self.started = true;
        self.step_min = Some(self.current);
        self.first_step_ns = None;
        self.first_flag = None;
        self.step_starts.clear();
        self.survivors = SurvivorTest::default();
        for e in self.sizes.values_mut() {
            e.hist = [0; SIZE_HISTORY];
            e.first_step = 0;
        }
    }

    /// Run `number` of the job begins (MARKER source 5; 0: not given, the
    /// next number): [`Self::new_run`], numbered as the producer numbers
    /// it, so a reader that began watching mid-job names the run as the
    /// producer's own screen does.
    pub(crate) fn on_run(&mut self, number: u64, t: u64) {
        self.now_ns = self.now_ns.max(t);
        self.new_run();
        if number > 0 {
            self.run = number;
        }
    }

    /// The job starts over: keep this run's verdict, start counting again.
    /// A run of which no step was counted (watching began near its end,
    /// after its last marker) has no verdict to keep: it is numbered, not
    /// listed.
    fn new_run(&mut self) {
        if self.steps > 0 {
            if self.earlier_runs.len() >= RUNS_KEPT {
                self.earlier_runs.pop_front();
            }
            self.earlier_runs.push_back(RunVerdict {
                run: self.run,
                steps: self.steps,
                flagged_at_step: self.first_flag.map(|(s, _)| s),
            });
        }
        self.run += 1;
        let source = self.source;
        self.restart(source);
        self.started = false;
        self.period = PeriodFinder::default();
        if source == StepSource::AllocationPeriod {
            self.source = StepSource::None;
        }
        self.sizes.clear();
    }

    fn boundary(&mut self, floor: u64) {
        if self.floors.len() >= self.cfg.window_steps.max(2) {
            if let Some(old) = self.floors.pop_front() {
                self.rises -= self.floors.iter().map(|&f| sign(f, old)).sum::<i64>();
            }
        }
        self.rises += self.floors.iter().map(|&f| sign(floor, f)).sum::<i64>();
        self.floors.push_back(floor);
        let slot = (self.steps % SIZE_HISTORY as u64) as usize;
        if self.sizes.len() >= self.max_sizes {
            self.sizes
                .retain(|_, e| e.live > 0 || e.hist.iter().any(|&h| h > 0));
        }
        for e in self.sizes.values_mut() {
            e.hist[slot] = u32::try_from(e.live).unwrap_or(u32::MAX);
        }
        self.steps += 1;
        self.step_min = Some(self.current);
        self.first_step_ns.get_or_insert(self.now_ns);
        if self.step_starts.len() as u64 > SURVIVOR_WINDOW + SURVIVOR_SKIP {
            self.step_starts.pop_front();
        }
        self.step_starts.push_back(self.now_ns);
        if self.first_flag.is_none() && self.may_flag() && self.floor_trend(false).flagged {
            self.first_flag = Some((self.steps, self.now_ns));
        }
    }

    /// The step of this run (1 the first) that was under way at time `t`,
    /// dated by the step starts the survivor test keeps (None before the
    /// oldest of them): how blocks are given a step where no step tag
    /// says it (steps found from the allocation period, inference loops).
    pub(crate) fn step_at(&self, t: u64) -> Option<u64> {
        let starts = &self.step_starts;
        if starts.front().is_none_or(|&s| t < s) {
            return None;
        }
        let first = (self.steps + 2).saturating_sub(starts.len() as u64);
        Some(first + starts.partition_point(|&s| s <= t) as u64 - 1)
    }

    /// The step under way (this run's counted steps and one).
    pub(crate) fn step_now(&self) -> u64 {
        self.steps + 1
    }

    /// The steps counted so far in this run (changes at each boundary).
    pub(crate) fn boundaries(&self) -> (u64, u64) {
        (self.run, self.steps)
    }

    /// The survivor test at the boundary just counted, given the birth
    /// times and sizes of the live allocated blocks.
    pub(crate) fn note_survivors(&mut self, born: impl Iterator<Item = (u64, u64)>) {
        // Step k of this run (1 the first) began at starts[k - first]: the
        // latest start is the one of step `steps + 1`, under way. The steps
        // looked at are the finished ones before the latest
        // SURVIVOR_SKIP, after the warm-up.
        let starts = &self.step_starts;
        let n = starts.len() as u64;
        if n == 0 {
            return;
        }
        let first = (self.steps + 2).saturating_sub(n); // the step starts[0] began
        let lo = first.max(WARM_UP + 1);
        let hi = (self.steps + 1).saturating_sub(SURVIVOR_SKIP); // steps < hi
        let window = hi.saturating_sub(lo).min(SURVIVOR_WINDOW);
        let lo = hi - window;
        let mut with = vec![0u64; window as usize];
        if window > 0 {
            let from = starts[(lo - first) as usize];
            for (t, bytes) in born.filter(|&(t, _)| t >= from) {
                // The step whose start is the latest at or before `t`.
                let k = first + starts.partition_point(|&s| s <= t) as u64 - 1;
                if (lo..hi).contains(&k) {
                    let b = &mut with[(k - lo) as usize];
                    *b = b.saturating_add(bytes);
                }
            }
        }
        let steps_with = with.iter().filter(|&&b| b > 0).count() as u64;
        self.survivors = SurvivorTest {
            window_steps: window,
            steps_with_survivors: steps_with,
            bytes: with.iter().fold(0u64, |a, &b| a.saturating_add(b)),
            flagged: window == SURVIVOR_WINDOW && steps_with * 4 >= window * 3,
        };
        if self.survivors.flagged && self.first_flag.is_none() {
            self.first_flag = Some((self.steps, self.now_ns));
        }
    }

    /// A cheap necessary condition for the floor test (at every step,
    /// before the full test): once the window no longer holds warm-up
    /// floors, Kendall's τ of the window is `rises` over its pairs, kept
    /// as floors come and go.
    fn may_flag(&self) -> bool {
        let n = self.floors.len() as i64;
        let first = self.steps - self.floors.len() as u64;
        first < WARM_UP
            || (n >= 2 && self.rises as f64 / (n * (n - 1) / 2) as f64 >= self.cfg.min_trend)
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.floors.capacity() * 8
            + self.sizes.capacity() * (std::mem::size_of::<(u64, SizeEntry)>() + 1)
            + self.period.memory_bytes()
    }

    /// The floor test over the analysed window. A floor of the run's first
    /// [`WARM_UP`] steps that a later floor of the window undercuts by more
    /// than the growth that would be flagged was transient (DDP's first
    /// gradient buckets, a compile's buffers, a first step's workspace):
    /// it is left out, so a warm-up neither hides a leak after it nor
    /// counts as one. Every other floor counts as it is.
    fn floor_trend(&self, full: bool) -> FloorTrend {
        let first = self.steps - self.floors.len() as u64;
        let mut later_low = u64::MAX;
        let mut floors: Vec<f64> = Vec::with_capacity(self.floors.len());
        for (i, &f) in self.floors.iter().enumerate().rev() {
            let warm = first + (i as u64) < WARM_UP;
            if !(warm && f > later_low.saturating_add(self.cfg.min_growth_bytes)) {
                floors.push(f as f64);
            }
            later_low = later_low.min(f);
        }
        floors.reverse();
        let n = floors.len();
        let tau = if n >= 2 { kendall_tau(&floors) } else { 0.0 };
        // The slope (a median of n² slopes) only where it can change the
        // answer, unless the figures are wanted.
        let may_flag = n >= self.cfg.min_steps.max(2) && tau >= self.cfg.min_trend;
        let slope = if n >= 2 && (full || may_flag) {
            theil_sen(&floors)
        } else {
            0.0
        };
        let growth = slope * (n.saturating_sub(1)) as f64;
        let flagged = may_flag && slope > 0.0 && growth >= self.cfg.min_growth_bytes as f64;
        FloorTrend {
            n,
            slope,
            tau,
            growth,
            flagged,
        }
    }

    /// The verdict. `blocks` are the process's blocks (for ages), `now_ns`
    /// the caller's clock in the writer's time base.
    pub(crate) fn report<'a>(
        &self,
        now_ns: u64,
        blocks: impl Iterator<Item = &'a Block>,
    ) -> LeakReport {
        let FloorTrend {
            n,
            slope,
            tau,
            growth,
            flagged,
        } = self.floor_trend(true);

        // Sizes whose live counts rise across the recorded boundaries.
        let h = (self.steps as usize).min(SIZE_HISTORY);
        let mut top = Vec::new();
        if h >= self.cfg.min_steps.clamp(2, SIZE_HISTORY) {
            let first = self.steps - h as u64;
            let mut ys = vec![0f64; h];
            for (&size, e) in &self.sizes {
                let at = |b: u64| e.hist[(b % SIZE_HISTORY as u64) as usize];
                if at(self.steps - 1) <= at(first) {
                    continue;
                }
                for (i, y) in ys.iter_mut().enumerate() {
                    *y = f64::from(at(first + i as u64));
                }
                let s = theil_sen(&ys);
                if s <= 0.0 || kendall_tau(&ys) < self.cfg.min_trend {
                    continue;
                }
                top.push(LeakSize {
                    requested: size,
                    block_size: rules::round_size(size),
                    live: e.live,
                    live_growth_per_step: s,
                    live_growth: i64::from(at(self.steps - 1)) - i64::from(at(first)),
                    oldest_age_ns: None,
                    first_step: e.first_step,
                });
            }
        }
        top.sort_by(|a, b| {
            let ka = a.live_growth_per_step * a.block_size as f64;
            let kb = b.live_growth_per_step * b.block_size as f64;
            b.live_growth_per_step
                .total_cmp(&a.live_growth_per_step)
                .then(kb.total_cmp(&ka))
        });
        top.truncate(self.cfg.top_sizes);
        if !top.is_empty() {
            let mut oldest: Vec<Option<u64>> = vec![None; top.len()];
            for b in blocks.filter(|b| b.state == BlockState::Allocated) {
                if let Some(i) = top.iter().position(|s| s.requested == b.requested) {
                    oldest[i] = Some(oldest[i].map_or(b.since_ns, |o| o.min(b.since_ns)));
                }
            }
            for (s, o) in top.iter_mut().zip(oldest) {
                s.oldest_age_ns = o.map(|t| now_ns.saturating_sub(t));
            }
        }
        LeakReport {
            flagged: flagged || self.survivors.flagged,
            survivors: self.survivors,
            source: self.source,
            steps_observed: self.steps,
            steps_total: self.steps_before.saturating_add(self.steps),
            window_steps: n,
            floor_slope_bytes_per_step: slope,
            floor_growth_bytes: growth,
            trend: tau,
            last_floor: self.floors.back().copied(),
            top_sizes: top,
            step_confidence: match self.source {
                StepSource::None => 0.0,
                StepSource::AllocationPeriod => self.period.period().map_or(0.0, |p| p.confidence),
                _ => 1.0,
            },
            period_allocations: (self.source == StepSource::AllocationPeriod)
                .then(|| self.period.period().map(|p| p.allocations))
                .flatten(),
            flagged_at_step: self.first_flag.map(|(s, _)| s),
            flagged_after_ns: self
                .first_flag
                .and_then(|(_, t)| self.first_step_ns.map(|first| t.saturating_sub(first))),
            run: self.run,
            earlier_runs: self.earlier_runs.iter().cloned().collect(),
            origins: Vec::new(),
            more_origins: 0,
        }
    }
}

/// The floor test's figures.
struct FloorTrend {
    n: usize,
    slope: f64,
    tau: f64,
    growth: f64,
    flagged: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_take_over() {
        let mut d = LeakDetector::new(LeakConfig::default());
        d.on_value(5, 0);
        d.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, 0);
        assert_eq!(d.source(), StepSource::OptimizerSteps);
        d.on_marker(MarkSource::User, 0);
        for step in 0..4u64 {
            d.on_value(100 + step, 0);
            d.on_value(10 + step, 0);
            d.on_value(100, 0);
            d.on_marker(MarkSource::User, 0);
            // A second optimizer's steps do not count, nor do the first's
            // once markers are there.
            d.on_marker(MarkSource::OptimizerStep { optimizer: 2 }, 0);
            d.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, 0);
        }
        assert_eq!(d.source(), StepSource::Markers);
        assert_eq!(d.floors().collect::<Vec<_>>(), vec![5, 11, 12, 13]);
    }

    /// Floors as one rank of a DDP job showed them (H100 recording): two
    /// high warm-up floors (gradient buckets before DDP rebuilds them),
    /// then `leak` more every step. Returns the step it was first flagged at.
    fn warm_up_then(leak: u64, steps: u64, noise: u64) -> Option<u64> {
        let mut d = LeakDetector::new(LeakConfig::default());
        let mut x = 12345u64;
        let warm = [153_321_984u64, 177_124_864, 178_177_536];
        for step in 0..steps {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let jitter = if noise > 0 { (x >> 33) % noise } else { 0 };
            let floor = match warm.get(step as usize) {
                Some(&w) => w,
                None => 158_978_560 + (step - 3) * leak + jitter,
            };
            d.on_value(floor + (50 << 20), step);
            d.on_value(floor, step);
            d.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, step);
        }
        d.report(steps, std::iter::empty()).flagged_at_step
    }

    #[test]
    fn a_warm_up_neither_hides_a_leak_nor_makes_one() {
        // A 1 MiB/step leak after DDP's warm-up: flagged within 10 steps.
        assert!(warm_up_then(1 << 20, 120, 0).is_some_and(|s| s <= 10));
        // 256 KiB/step: within 10 steps too (exact floors).
        assert!(warm_up_then(256 << 10, 300, 0).is_some_and(|s| s <= 10));
        // No leak after the warm-up, exact or with 2 MiB of noise in the
        // floors: never flagged in 500 steps.
        assert_eq!(warm_up_then(0, 500, 0), None);
        assert_eq!(warm_up_then(0, 500, 2 << 20), None);
    }

    /// The running Kendall S equals the sum over the window's pairs, as the
    /// window fills, slides and starts over.
    #[test]
    fn the_running_trend_sum_matches_the_pairs() {
        let mut d = LeakDetector::new(LeakConfig::default());
        let mut x = 7u64;
        for step in 0..300u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            d.on_value(1000 + (x >> 60) + step / 3, step);
            d.on_marker(MarkSource::User, step);
            if step == 150 {
                d.on_marker(MarkSource::Run, step);
            }
            let f: Vec<u64> = d.floors().collect();
            let mut s = 0i64;
            for i in 0..f.len() {
                for j in i + 1..f.len() {
                    s += sign(f[j], f[i]);
                }
            }
            assert_eq!(d.rises, s, "step {step}");
        }
    }

    #[test]
    fn only_the_first_optimizer_counts() {
        let mut d = LeakDetector::new(LeakConfig::default());
        for _ in 0..10 {
            d.on_marker(MarkSource::OptimizerStep { optimizer: 2 }, 0);
            d.on_marker(MarkSource::OptimizerStep { optimizer: 1 }, 0);
        }
        assert_eq!(d.steps(), 9);
    }

    #[test]
    fn a_new_run_keeps_the_verdict_and_starts_over() {
        let mut d = LeakDetector::new(LeakConfig::default());
        for step in 0..20u64 {
            d.on_value(1000 + step * 100_000, step);
            d.on_marker(MarkSource::User, step);
        }
        let r = d.report(20, std::iter::empty());
        assert!(r.flagged);
        let at = r.flagged_at_step.unwrap();
        assert_eq!(at, 8);
        d.on_marker(MarkSource::Run, 21);
        let r = d.report(21, std::iter::empty());
        assert!(!r.flagged);
        assert_eq!((r.run, r.steps_observed), (2, 0));
        assert_eq!(
            r.earlier_runs,
            vec![RunVerdict {
                run: 1,
                steps: 19,
                flagged_at_step: Some(at)
            }]
        );
    }

    /// Issue 30, item 2: a looping job's runs, each with the same markers
    /// (one at each step's start, after a setup), count the same steps and
    /// are flagged at the same step: the first marker of a run begins its
    /// first step in every run, not only the first.
    #[test]
    fn every_run_counts_its_steps_alike() {
        let mut d = LeakDetector::new(LeakConfig::default());
        let mut t = 0u64;
        for run in 0..3 {
            if run > 0 {
                d.on_marker(MarkSource::Run, t);
            }
            // Setup: the model's weights, before the first marker.
            d.on_value(5_000_000, t);
            for step in 0..16u64 {
                t += 1;
                d.on_marker(MarkSource::User, t);
                d.on_value(5_000_000 + step * 100_000 + 50_000, t);
                d.on_value(5_000_000 + step * 100_000, t);
            }
        }
        let r = d.report(t, std::iter::empty());
        assert_eq!(r.steps_observed, 15);
        // Issue 46, item 10: every run's steps, for a counter that never
        // falls at a new run (`vramscope_process_steps_total`).
        assert_eq!(r.steps_total, 45);
        let runs: Vec<(u64, Option<u64>)> = (r.earlier_runs.iter())
            .map(|v| (v.steps, v.flagged_at_step))
            .collect();
        assert_eq!(runs, vec![(15, r.flagged_at_step); 2]);
        // A run of which no step was counted is numbered, not listed.
        d.on_marker(MarkSource::Run, t);
        d.on_marker(MarkSource::Run, t);
        let r = d.report(t, std::iter::empty());
        assert_eq!(r.run, 5);
        assert_eq!((r.steps_observed, r.steps_total), (0, 45));
        assert!(r.earlier_runs.iter().all(|v| v.steps > 0), "{r:?}");
        assert_eq!(r.earlier_runs.len(), 3);
    }
}
