//! [`Model`]: all processes by [`ProcessKey`], the entry points the
//! collector feeds and the views read.

use std::collections::BTreeMap;

use super::config::{Mode, ModelConfig, ProcessKey, Watch};
use super::process::Process;
use super::view::{ModelView, ViewOptions};
use vramscope_wire::event::{Event, RingPos};

/// All processes the collector feeds.
#[derive(Debug, Clone, Default)]
pub struct Model {
    cfg: ModelConfig,
    processes: BTreeMap<ProcessKey, Process>,
    /// Events (and other inputs) of processes beyond [`Bounds::processes`](super::config::Bounds::processes).
    dropped_events: u64,
}

impl Model {
    pub fn new(cfg: ModelConfig) -> Self {
        Self {
            cfg,
            processes: BTreeMap::new(),
            dropped_events: 0,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The process, created on first use while fewer than
    /// [`Bounds::processes`](super::config::Bounds::processes) are followed (`None` beyond: the caller's input
    /// is dropped and counted in [`dropped_events`](Self::dropped_events)).
    pub fn process_mut(&mut self, key: ProcessKey) -> Option<&mut Process> {
        if !self.processes.contains_key(&key)
            && self.processes.len() >= self.cfg.bounds.processes.max(1)
        {
            self.dropped_events = self.dropped_events.saturating_add(1);
            return None;
        }
        let cfg = &self.cfg;
        Some(
            self.processes
                .entry(key)
                .or_insert_with(|| Process::new(key, cfg.clone())),
        )
    }

    /// Whether `key` is followed (created if the bound allows).
    pub fn admit(&mut self, key: ProcessKey) -> bool {
        self.process_mut(key).is_some()
    }

    /// Inputs dropped because [`Bounds::processes`](super::config::Bounds::processes) processes were followed.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
    }

    pub fn process(&self, key: ProcessKey) -> Option<&Process> {
        self.processes.get(&key)
    }

    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.processes.values()
    }

    /// Forget a process (it exited and the view no longer shows it).
    pub fn remove(&mut self, key: ProcessKey) -> Option<Process> {
        self.processes.remove(&key)
    }

    #[cfg(test)]
    /// Apply one event of `key`.
    pub(crate) fn apply(&mut self, key: ProcessKey, ev: &Event) {
        if let Some(p) = self.process_mut(key) {
            p.apply(ev);
        }
    }

    /// Apply a batch of events of `key` (one map lookup).
    pub fn apply_all<'a>(&mut self, key: ProcessKey, events: impl IntoIterator<Item = &'a Event>) {
        self.apply_all_at(key, events, &[]);
    }

    /// Apply a batch of events of `key` with their ring positions (`at`:
    /// one per event, or empty when not given).
    pub fn apply_all_at<'a>(
        &mut self,
        key: ProcessKey,
        events: impl IntoIterator<Item = &'a Event>,
        at: &[RingPos],
    ) {
        let records = (events.into_iter().enumerate()).map(|(i, ev)| (ev, at.get(i).copied()));
        self.apply_records(key, records);
    }

    /// Apply events of `key` in order, each with its ring position when
    /// given (one map lookup for all).
    pub fn apply_records<'a>(
        &mut self,
        key: ProcessKey,
        records: impl IntoIterator<Item = (&'a Event, Option<RingPos>)>,
    ) {
        match self.process_mut(key) {
            Some(p) => {
                for (ev, at) in records {
                    p.apply_at(ev, at);
                }
            }
            None => {
                let n = records.into_iter().count() as u64;
                self.dropped_events = self.dropped_events.saturating_add(n.saturating_sub(1));
            }
        }
    }

    /// How watching `key` began (FORMAT.md, "Attaching mid-run").
    pub fn watch(&mut self, key: ProcessKey, watch: &Watch) {
        if let Some(p) = self.process_mut(key) {
            p.watch(watch);
        }
    }

    /// `count` events of `key` were lost on the wire.
    pub fn note_loss(&mut self, key: ProcessKey, count: u64) {
        if let Some(p) = self.process_mut(key) {
            p.note_loss(count);
        }
    }

    /// NVML's used memory for `key` at `time_ns`.
    pub fn note_nvml(&mut self, key: ProcessKey, time_ns: u64, bytes: u64) {
        if let Some(p) = self.process_mut(key) {
            p.note_nvml(time_ns, bytes);
        }
    }

    pub fn set_mode(&mut self, key: ProcessKey, mode: Mode) {
        if let Some(p) = self.process_mut(key) {
            p.set_mode(mode);
        }
    }

    pub fn reset_peaks(&mut self, key: ProcessKey) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.reset_peaks();
        }
    }

    #[cfg(test)]
    /// Whether the block map of `key` cannot be trusted (see
    /// [`Process::needs_resync`]), whether or not a snapshot is in flight.
    pub(crate) fn needs_resync(&self, key: ProcessKey) -> bool {
        self.processes.get(&key).is_some_and(Process::needs_resync)
    }

    #[cfg(test)]
    /// Processes that need a snapshot and have none in flight (regardless
    /// of when one was last asked for).
    pub(crate) fn resync_wanted(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.processes
            .values()
            .filter(|p| p.resync_wanted())
            .map(Process::key)
    }

    /// Processes to ask for a snapshot at `now_ns`: those of
    /// `resync_wanted` not asked within
    /// [`ModelConfig::resync_interval_ns`]. The caller records each request
    /// it makes with [`resync_requested`](Self::resync_requested).
    pub fn resync_due(&self, now_ns: u64) -> Vec<ProcessKey> {
        self.processes
            .values()
            .filter(|p| p.resync_due(now_ns))
            .map(Process::key)
            .collect()
    }

    /// The caller asked `key` for a snapshot at `now_ns` (a process the
    /// model does not know is ignored).
    pub fn resync_requested(&mut self, key: ProcessKey, now_ns: u64) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.resync_requested(now_ns);
        }
    }

    /// A copy of everything the views show, at the caller's `now_ns`.
    pub fn view(&self, now_ns: u64, opts: &ViewOptions) -> ModelView {
        self.view_for(now_ns, opts, None)
    }

    /// [`Self::view`] with `opts` (block map, events, timeline) for the
    /// process `focus` only, when given, and the figures alone for every
    /// other process (a dashboard shows one process's detail at a time).
    pub fn view_for(
        &self,
        now_ns: u64,
        opts: &ViewOptions,
        focus: Option<ProcessKey>,
    ) -> ModelView {
        let brief = ViewOptions {
            block_map: false,
            recent_events: 0,
            timeline: None,
        };
        ModelView {
            dropped_events: self.dropped_events,
            processes: self
                .processes
                .iter()
                .map(|(k, p)| {
                    let o = if focus.is_none_or(|f| f == *k) {
                        opts
                    } else {
                        &brief
                    };
                    p.view(now_ns, o)
                })
                .collect(),
        }
    }

    /// The collector dropped `count` things named `what` for `key` so far
    /// (an `Input::Dropped`; the latest count replaces earlier ones). Unknown
    /// processes are not created for it.
    pub fn note_collector_drop(&mut self, key: ProcessKey, what: &str, count: u64) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.note_collector_drop(what, count);
        }
    }

    /// Heap bytes held by the model (estimate).
    pub fn memory_bytes(&self) -> usize {
        self.processes.values().map(Process::memory_bytes).sum()
    }
}
