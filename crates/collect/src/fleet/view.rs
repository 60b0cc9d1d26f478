//! What the person looks at in `vramscope fleet`: the screen (all nodes,
//! all jobs, one node), the sort, the filter, the selection, and what
//! each step there needs from Prometheus. Pure: steps in, [`Action`]s out.
//! Which key takes which step is the key table's (`ui::keys`), where the
//! dashboard's keys are; `ui::fleet::app` dispatches.

use super::model::{natural, Fleet, Node, Proc};

/// One process's time series from Prometheus: (unix s, bytes).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProcSeries {
    pub instance: String,
    pub pid: String,
    pub allocated: Vec<(f64, f64)>,
    pub reserved: Vec<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screen {
    Nodes,
    Jobs,
    /// One node's GPUs and processes, by instance; `from_jobs`: where
    /// `Esc` goes back to.
    Node {
        instance: String,
        from_jobs: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Name,
    Reserved,
    Allocated,
    Fragmentation,
    Leaks,
    Ooms,
}

impl SortKey {
    pub(crate) const ALL: [SortKey; 6] = [
        SortKey::Name,
        SortKey::Reserved,
        SortKey::Allocated,
        SortKey::Fragmentation,
        SortKey::Leaks,
        SortKey::Ooms,
    ];

    pub fn title(self) -> &'static str {
        match self {
            SortKey::Name => "NAME",
            SortKey::Reserved => "RESV",
            SortKey::Allocated => "ALLOC",
            SortKey::Fragmentation => "FRAG",
            SortKey::Leaks => "LEAK",
            SortKey::Ooms => "OOMS",
        }
    }
}

/// What must happen after a step or an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Nothing,
    Redraw,
    /// Load this process's time series.
    LoadSeries {
        instance: String,
        pid: String,
    },
}

/// The fleet view's state.
#[derive(Debug, Clone)]
pub struct FleetView {
    /// Prometheus's address, shown in the title.
    pub source: String,
    /// The last fleet a refresh returned.
    pub fleet: Option<Fleet>,
    /// Why the last refresh failed (cleared by the next that succeeds).
    pub error: Option<String>,
    /// Refreshes that succeeded.
    pub(crate) refreshes: u64,
    pub screen: Screen,
    pub sort: SortKey,
    pub descending: bool,
    pub filter: String,
    pub selected: usize,
    /// The selected process's series (node screen), or why they failed.
    pub series: Option<Result<ProcSeries, String>>,
}

impl FleetView {
    pub fn new(source: String) -> FleetView {
        FleetView {
            source,
            fleet: None,
            error: None,
            refreshes: 0,
            screen: Screen::Nodes,
            sort: SortKey::Name,
            descending: false,
            filter: String::new(),
            selected: 0,
            series: None,
        }
    }

    /// A refresh's outcome: a new fleet, or why there is none (the last
    /// one stays shown, marked as old).
    pub fn refreshed(&mut self, r: Result<Fleet, String>) -> Action {
        match r {
            Ok(f) => {
                self.fleet = Some(f);
                self.error = None;
                self.refreshes += 1;
            }
            Err(e) => self.error = Some(e),
        }
        self.clamp();
        match self.wanted_series() {
            Some(a) => a,
            None => Action::Redraw,
        }
    }

    /// A series answer; kept only if it is still the selected process's.
    pub fn series_loaded(&mut self, r: Result<ProcSeries, String>, instance: &str, pid: &str) {
        let still = self
            .selected_proc()
            .is_some_and(|p| p.instance == instance && p.pid == pid);
        if still {
            self.series = Some(r);
        }
    }

    fn matches(&self, hay: &[&str]) -> bool {
        let f = self.filter.to_lowercase();
        f.is_empty() || hay.iter().any(|h| h.to_lowercase().contains(&f))
    }

    /// The nodes shown: filtered (name, address, or any process's name or
    /// user), sorted.
    pub fn nodes(&self) -> Vec<&Node> {
        let Some(f) = &self.fleet else {
            return Vec::new();
        };
        let v: Vec<&Node> = f
            .nodes
            .iter()
            .filter(|n| {
                self.matches(&[n.name(), &n.instance])
                    || n.procs.iter().any(|p| self.matches(&[&p.process, &p.user]))
            })
            .collect();
        let key = |n: &Node| -> f64 {
            match self.sort {
                SortKey::Name => 0.0,
                SortKey::Reserved => n.reserved().unwrap_or(-1.0),
                SortKey::Allocated => n.allocated().unwrap_or(-1.0),
                SortKey::Fragmentation => n.fragmentation().unwrap_or(-1.0),
                SortKey::Leaks => n.leaks() as f64,
                SortKey::Ooms => n.ooms(),
            }
        };
        // Each node's key once (it sums over the node's processes).
        let mut keyed: Vec<(f64, &Node)> = v.into_iter().map(|n| (key(n), n)).collect();
        keyed.sort_by(|(ka, a), (kb, b)| {
            let o = if self.sort == SortKey::Name {
                natural(a.name(), b.name())
            } else {
                // Largest first unless reversed.
                kb.total_cmp(ka)
            };
            let o = o.then_with(|| natural(a.name(), b.name()));
            if self.descending {
                o.reverse()
            } else {
                o
            }
        });
        keyed.into_iter().map(|(_, n)| n).collect()
    }

    /// Every process of every node (one row per device), filtered, sorted.
    pub fn jobs(&self) -> Vec<&Proc> {
        let Some(f) = &self.fleet else {
            return Vec::new();
        };
        let mut v: Vec<&Proc> = f
            .nodes
            .iter()
            .flat_map(|n| n.procs.iter())
            .filter(|p| self.matches(&[&p.host, &p.instance, &p.process, &p.user, &p.pid]))
            .collect();
        self.sort_procs(&mut v);
        v
    }

    fn sort_procs(&self, v: &mut [&Proc]) {
        let key = |p: &Proc| -> f64 {
            match self.sort {
                SortKey::Name => 0.0,
                SortKey::Reserved => p.reserved.unwrap_or(-1.0),
                SortKey::Allocated => p.allocated.unwrap_or(-1.0),
                SortKey::Fragmentation => p.fragmentation.unwrap_or(-1.0),
                SortKey::Leaks => f64::from(u8::from(p.leak == Some(true))),
                SortKey::Ooms => p.ooms.unwrap_or(0.0),
            }
        };
        v.sort_by(|a, b| {
            let by_name = || {
                natural(&a.host, &b.host)
                    .then_with(|| natural(&a.pid, &b.pid))
                    .then_with(|| natural(&a.device, &b.device))
            };
            let o = if self.sort == SortKey::Name {
                by_name()
            } else {
                key(b).total_cmp(&key(a)).then_with(by_name)
            };
            if self.descending {
                o.reverse()
            } else {
                o
            }
        });
    }

    /// The node open on the node screen.
    pub fn node(&self) -> Option<&Node> {
        let Screen::Node { instance, .. } = &self.screen else {
            return None;
        };
        self.fleet
            .as_ref()?
            .nodes
            .iter()
            .find(|n| &n.instance == instance)
    }

    /// The open node's processes, sorted.
    pub fn node_procs(&self) -> Vec<&Proc> {
        let mut v: Vec<&Proc> = self
            .node()
            .map(|n| n.procs.iter().collect())
            .unwrap_or_default();
        self.sort_procs(&mut v);
        v
    }

    /// The process selected on the node or jobs screen.
    pub fn selected_proc(&self) -> Option<&Proc> {
        match self.screen {
            Screen::Nodes => None,
            Screen::Jobs => self.jobs().get(self.selected).copied(),
            Screen::Node { .. } => self.node_procs().get(self.selected).copied(),
        }
    }

    fn rows(&self) -> usize {
        match self.screen {
            Screen::Nodes => self.nodes().len(),
            Screen::Jobs => self.jobs().len(),
            Screen::Node { .. } => self.node_procs().len(),
        }
    }

    fn clamp(&mut self) {
        let n = self.rows();
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    /// On the node screen: load the selected process's series unless they
    /// are the ones shown.
    fn wanted_series(&mut self) -> Option<Action> {
        if !matches!(self.screen, Screen::Node { .. }) {
            return None;
        }
        let p = self.selected_proc()?;
        let (instance, pid) = (p.instance.clone(), p.pid.clone());
        Some(Action::LoadSeries { instance, pid })
    }

    /// Selects row `to` (clamped) of the screen's list; on the node
    /// screen a new process's series are asked for.
    pub fn select(&mut self, to: usize) -> Action {
        let before = self.selected;
        self.selected = to;
        self.clamp();
        if self.selected == before {
            return Action::Nothing;
        }
        self.series = None;
        self.wanted_series().unwrap_or(Action::Redraw)
    }

    /// The next sort column (from the first row).
    pub fn sort_next(&mut self) -> Action {
        let i = SortKey::ALL
            .iter()
            .position(|s| *s == self.sort)
            .unwrap_or(0);
        self.sort = SortKey::ALL[(i + 1) % SortKey::ALL.len()];
        self.select(0);
        Action::Redraw
    }

    /// The other way round.
    pub fn reverse(&mut self) -> Action {
        self.descending = !self.descending;
        Action::Redraw
    }

    /// Every node ⇄ every job (from a node: every job).
    pub fn switch_list(&mut self) -> Action {
        self.screen = match self.screen {
            Screen::Jobs => Screen::Nodes,
            _ => Screen::Jobs,
        };
        self.selected = 0;
        self.series = None;
        Action::Redraw
    }

    /// The filter was edited: from the first row again.
    pub fn filter_changed(&mut self) -> Action {
        self.selected = 0;
        self.clamp();
        Action::Redraw
    }

    /// From a node back to the list it was opened from.
    pub fn back(&mut self) -> Action {
        let Screen::Node { from_jobs, .. } = self.screen else {
            return Action::Nothing;
        };
        self.screen = if from_jobs {
            Screen::Jobs
        } else {
            Screen::Nodes
        };
        self.selected = 0;
        self.series = None;
        Action::Redraw
    }

    /// Opens the selected node (from a job: its node, that job selected).
    pub fn open(&mut self) -> Action {
        let (instance, pid, from_jobs) = match self.screen {
            Screen::Nodes => match self.nodes().get(self.selected) {
                Some(n) => (n.instance.clone(), None, false),
                None => return Action::Nothing,
            },
            Screen::Jobs => match self.jobs().get(self.selected) {
                Some(p) => (
                    p.instance.clone(),
                    Some((p.pid.clone(), p.device.clone())),
                    true,
                ),
                None => return Action::Nothing,
            },
            Screen::Node { .. } => return Action::Nothing,
        };
        self.screen = Screen::Node {
            instance,
            from_jobs,
        };
        self.selected = pid
            .and_then(|(pid, dev)| {
                self.node_procs()
                    .iter()
                    .position(|p| p.pid == pid && p.device == dev)
            })
            .unwrap_or(0);
        self.series = None;
        self.wanted_series().unwrap_or(Action::Redraw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::fixtures::fleet;

    #[test]
    fn a_failed_refresh_keeps_the_last_fleet() {
        let mut v = FleetView::new("http://p".into());
        v.refreshed(Err("Prometheus at http://p cannot be reached".into()));
        assert!(v.fleet.is_none() && v.error.is_some());
        v.refreshed(Ok(fleet()));
        assert!(v.error.is_none());
        v.refreshed(Err("x".into()));
        assert_eq!(v.fleet.as_ref().unwrap().nodes.len(), 3);
        assert_eq!(v.error.as_deref(), Some("x"));
    }
}
