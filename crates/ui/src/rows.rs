//! One process as a table row: the figures the overview shows and sorts by,
//! with absent figures kept absent (`None`), never turned into 0.

use std::cmp::Ordering;
use std::collections::HashSet;

use vramscope_collect::{ProcessEntry, Snapshot};
use vramscope_core::model::{Mode, ProcessKey};

/// The overview's columns, in display order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Col {
    Pid,
    User,
    Name,
    Gpus,
    Nvml,
    Reserved,
    Allocated,
    NonPytorch,
    Unexplained,
    Peak,
    Frag,
    Rate,
    Lost,
    Cpu,
    Rss,
    Elapsed,
    Mode,
    Flags,
    History,
}

impl Col {
    pub const ALL: [Col; 19] = [
        Col::Pid,
        Col::User,
        Col::Name,
        Col::Gpus,
        Col::Nvml,
        Col::Reserved,
        Col::Allocated,
        Col::NonPytorch,
        Col::Unexplained,
        Col::Peak,
        Col::Frag,
        Col::Rate,
        Col::Lost,
        Col::Cpu,
        Col::Rss,
        Col::Elapsed,
        Col::Mode,
        Col::Flags,
        Col::History,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Col::Pid => "PID",
            Col::User => "USER",
            Col::Name => "NAME",
            Col::Gpus => "GPU",
            Col::Nvml => "NVML",
            Col::Reserved => "RESV",
            Col::Allocated => "ALLOC",
            Col::NonPytorch => "OTHER",
            Col::Unexplained => "UNEXPL",
            Col::Peak => "PEAK",
            Col::Frag => "FRAG",
            Col::Rate => "EV/S",
            Col::Lost => "LOST",
            Col::Cpu => "CPU%",
            Col::Rss => "RSS",
            Col::Elapsed => "TIME",
            Col::Mode => "MODE",
            Col::Flags => "FLAGS",
            Col::History => "LAST 5m",
        }
    }

    /// What the column means, for the help overlay.
    pub fn meaning(self) -> &'static str {
        match self {
            Col::Pid => "process id (host namespace)",
            Col::User => "owner",
            Col::Name => "producer label or process name",
            Col::Gpus => "GPUs the process uses (NVML index, else CUDA ordinal)",
            Col::Nvml => "NVML used memory of the process (what nvidia-smi shows)",
            Col::Reserved => "reserved by the caching allocator (segments)",
            Col::Allocated => "allocated to live tensors",
            Col::NonPytorch => "NVML used - reserved: CUDA context, NCCL, cuBLAS, others",
            Col::Unexplained => "OTHER less what the agent named (CUDA context, libraries)",
            Col::Peak => "peak allocated since start or the last peak reset",
            Col::Frag => "inactive split as a share of reserved (see below)",
            Col::Rate => "allocator events per second",
            Col::Lost => "events lost on the wire",
            Col::Cpu => "host CPU use since the last reading (100 = one core)",
            Col::Rss => "host memory of the process (resident set)",
            Col::Elapsed => "how long the process has run",
            Col::History => "reserved (else NVML used) over the last 5 minutes",
            Col::Mode => "exact: every event / smpl: sampled stats / nvml: no agent",
            Col::Flags => "EXIT exited, OOM seen, LEAK suspected, SYNC needs resync",
        }
    }

    /// Display width (NAME takes what is left).
    pub(crate) fn width(self) -> u16 {
        match self {
            Col::Pid => 7,
            Col::User => 8,
            Col::Name => 12,
            Col::Gpus => 3,
            Col::Nvml
            | Col::Reserved
            | Col::Allocated
            | Col::NonPytorch
            | Col::Unexplained
            | Col::Peak => 6,
            Col::Frag => 5,
            Col::Rate => 5,
            Col::Lost => 5,
            Col::Cpu => 5,
            Col::Rss | Col::Elapsed => 6,
            Col::Mode => 5,
            Col::Flags => 5,
            Col::History => 16,
        }
    }

    /// Lower goes first when the terminal is narrow.
    pub(crate) fn priority(self) -> u8 {
        match self {
            Col::Pid | Col::Name => 100,
            Col::Reserved | Col::Allocated => 90,
            Col::Nvml => 85,
            Col::Flags => 80,
            Col::NonPytorch => 70,
            Col::Frag => 65,
            Col::Peak => 60,
            Col::Mode => 50,
            Col::Cpu => 45,
            Col::Rate => 40,
            Col::Rss => 38,
            Col::Gpus => 35,
            Col::Lost => 30,
            Col::Elapsed => 25,
            Col::User => 20,
            Col::History => 10,
            Col::Unexplained => 5,
        }
    }

    pub(crate) fn right_aligned(self) -> bool {
        !matches!(
            self,
            Col::User | Col::Name | Col::Mode | Col::Flags | Col::Gpus | Col::History
        )
    }
}

/// The figures of one process as the overview shows them.
#[derive(Debug, Clone)]
pub struct Row<'a> {
    pub(crate) entry: &'a ProcessEntry,
    pub pid: u32,
    pub(crate) user: String,
    pub name: String,
    pub gpus: Option<String>,
    pub nvml: Option<u64>,
    pub reserved: Option<u64>,
    pub allocated: Option<u64>,
    pub(crate) non_pytorch: Option<i64>,
    /// `non_pytorch` less what the producer named outside the caching
    /// allocator (absent without NVML, or when it names nothing).
    pub(crate) unexplained: Option<i64>,
    pub peak: Option<u64>,
    pub frag: Option<f64>,
    pub(crate) rate: Option<f64>,
    pub(crate) lost: Option<u64>,
    /// Host figures (`/proc`): CPU %, resident memory, time run.
    pub(crate) cpu: Option<f64>,
    pub(crate) rss: Option<u64>,
    pub(crate) elapsed_ns: Option<u64>,
    pub mode: Mode,
    pub(crate) leak: bool,
    pub ooms: u64,
    pub alive: bool,
    pub(crate) needs_resync: bool,
}

/// The name a process is shown by: its producer label, else its name.
pub(crate) fn display_name(e: &ProcessEntry) -> String {
    if !e.identity.label.is_empty() {
        e.identity.label.clone()
    } else if !e.identity.name.is_empty() {
        e.identity.name.clone()
    } else {
        format!("pid {}", e.identity.host_pid)
    }
}

/// The mode in full, where there is room (the process view).
pub(crate) fn mode_word(m: Mode) -> &'static str {
    match m {
        Mode::Exact => "exact",
        Mode::Sampled => "sampled",
        Mode::NvmlOnly => "nvml",
    }
}

/// The mode in the overview's narrow column.
pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Exact => "exact",
        Mode::Sampled => "smpl",
        Mode::NvmlOnly => "nvml",
    }
}

/// The GPUs `e` uses, lowest first: NVML's indices, else its CUDA
/// ordinals.
pub(crate) fn gpus_of(snap: &Snapshot, e: &ProcessEntry) -> Vec<u32> {
    let pid = e.identity.host_pid;
    let mut gpus: Vec<u32> = snap
        .machine
        .processes
        .iter()
        .filter(|p| p.pid == pid)
        .map(|p| p.gpu)
        .collect();
    if gpus.is_empty() {
        gpus = e
            .view
            .devices
            .iter()
            .map(|d| u32::from(d.figures.device))
            .collect();
    }
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

impl<'a> Row<'a> {
    pub fn new(snap: &Snapshot, e: &'a ProcessEntry) -> Row<'a> {
        let v = &e.view;
        let f = &v.figures;
        let allocator = v.mode != Mode::NvmlOnly;
        let pid = e.identity.host_pid;
        let gpus = gpus_of(snap, e);
        let gpus = (!gpus.is_empty()).then(|| {
            gpus.iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(",")
        });
        let split: u64 = v
            .devices
            .iter()
            .map(|d| d.figures.fragmentation.inactive_split)
            .sum();
        let frag = (allocator && f.reserved > 0).then(|| split as f64 / f.reserved as f64);
        let host = snap.machine.host.iter().find(|h| h.pid == pid);
        Row {
            entry: e,
            pid,
            user: e.identity.user.clone(),
            name: display_name(e),
            gpus,
            nvml: f.nvml_used,
            reserved: allocator.then_some(f.reserved),
            allocated: allocator.then_some(f.allocated),
            non_pytorch: if allocator { f.non_pytorch } else { None },
            unexplained: if allocator { f.unexplained } else { None },
            peak: allocator.then_some(f.peak_allocated),
            frag,
            rate: if allocator { f.events_per_sec } else { None },
            lost: allocator.then_some(f.lost_events.max(e.source.lost)),
            // A figure from a file may be anything: only a real share shows.
            cpu: host
                .and_then(|h| h.cpu_percent)
                .filter(|c| c.is_finite() && *c >= 0.0),
            rss: host.and_then(|h| h.rss),
            elapsed_ns: host.and_then(|h| h.elapsed_ns),
            mode: v.mode,
            leak: v.leak.flagged,
            ooms: v.ooms_total.max(v.ooms.len() as u64),
            alive: e.identity.alive,
            needs_resync: v.needs_resync,
        }
    }

    /// Whether `filter` (lower case) matches name, label, command line or pid.
    pub(crate) fn matches(&self, filter: &str) -> bool {
        if filter.is_empty() {
            return true;
        }
        let id = &self.entry.identity;
        id.name.to_lowercase().contains(filter)
            || id.label.to_lowercase().contains(filter)
            || id.cmdline.to_lowercase().contains(filter)
            || self.pid.to_string().contains(filter)
            || id.user.to_lowercase().contains(filter)
    }

    /// `EXIT OOM LEAK SYNC`: the most urgent first, so that a process that
    /// died is never shown as alive whatever the width.
    pub fn flags(&self) -> String {
        let mut f = Vec::new();
        if !self.alive {
            f.push("EXIT");
        }
        if self.ooms > 0 {
            f.push("OOM");
        }
        if self.leak {
            f.push("LEAK");
        }
        if self.needs_resync {
            f.push("SYNC");
        }
        f.join(" ")
    }

    /// Compares two rows on `col`, absent values last whatever the order.
    pub(crate) fn compare(&self, other: &Row, col: Col, descending: bool) -> Ordering {
        fn num<T: PartialOrd>(a: Option<T>, b: Option<T>, desc: bool) -> Ordering {
            match (a, b) {
                (Some(a), Some(b)) => {
                    let o = a.partial_cmp(&b).unwrap_or(Ordering::Equal);
                    if desc {
                        o.reverse()
                    } else {
                        o
                    }
                }
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            }
        }
        fn text(a: &str, b: &str, desc: bool) -> Ordering {
            let o = a.to_lowercase().cmp(&b.to_lowercase());
            if desc {
                o.reverse()
            } else {
                o
            }
        }
        let d = descending;
        let o = match col {
            Col::Pid => num(Some(self.pid), Some(other.pid), d),
            Col::User => text(&self.user, &other.user, d),
            Col::Name => text(&self.name, &other.name, d),
            Col::Gpus => text(
                self.gpus.as_deref().unwrap_or(""),
                other.gpus.as_deref().unwrap_or(""),
                d,
            ),
            Col::Nvml => num(self.nvml, other.nvml, d),
            Col::Reserved => num(self.reserved, other.reserved, d),
            Col::Allocated => num(self.allocated, other.allocated, d),
            Col::NonPytorch => num(self.non_pytorch, other.non_pytorch, d),
            Col::Unexplained => num(self.unexplained, other.unexplained, d),
            Col::Peak => num(self.peak, other.peak, d),
            Col::Frag => num(self.frag, other.frag, d),
            Col::Rate => num(self.rate, other.rate, d),
            Col::Lost => num(self.lost, other.lost, d),
            Col::Cpu => num(self.cpu, other.cpu, d),
            Col::Rss => num(self.rss, other.rss, d),
            Col::Elapsed => num(self.elapsed_ns, other.elapsed_ns, d),
            Col::Mode => text(mode_name(self.mode), mode_name(other.mode), d),
            Col::Flags => text(&self.flags(), &other.flags(), d),
            Col::History => num(
                self.reserved.or(self.nvml),
                other.reserved.or(other.nvml),
                d,
            ),
        };
        // Exited processes after the live ones, whatever the sort: an
        // exited job's last figures never head the table (issue 46, item 5).
        (other.alive.cmp(&self.alive))
            .then(o)
            .then(self.pid.cmp(&other.pid))
    }
}

/// The rows of `snap` that match `filter` and are not `cleared`, sorted.
pub(crate) fn rows<'a>(
    snap: &'a Snapshot,
    filter: &str,
    cleared: &HashSet<ProcessKey>,
    sort: Col,
    descending: bool,
) -> Vec<Row<'a>> {
    let filter = filter.to_lowercase();
    let mut rows: Vec<Row> = snap
        .processes
        .iter()
        .filter(|e| !cleared.contains(&e.key()))
        .map(|e| Row::new(snap, e))
        .filter(|r| r.matches(&filter))
        .collect();
    rows.sort_by(|a, b| a.compare(b, sort, descending));
    rows
}

/// The columns of the table as drawn: each with its x offset (from the
/// table's left edge) and width. The same layout draws the table and maps a
/// click on its header to a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns(pub Vec<(Col, u16, u16)>);

impl Columns {
    pub fn cols(&self) -> impl Iterator<Item = Col> + '_ {
        self.0.iter().map(|c| c.0)
    }

    /// The column under x (relative to the table's left edge), spacing
    /// included on its left.
    pub(crate) fn at(&self, x: u16) -> Option<Col> {
        self.0
            .iter()
            .find(|(_, at, w)| x + 1 >= *at && x < at + w)
            .map(|c| c.0)
    }
}

/// The columns that fit in `width`, one space apart: the least important go
/// first when the terminal is narrow; FLAGS is as wide as the widest `flags`
/// text of the rows (so `EXIT` is never cut); NAME takes what is left.
pub(crate) fn fit_columns(width: u16, flags_width: u16) -> Columns {
    let w = |c: Col| match c {
        Col::Flags => flags_width.max(c.width()),
        _ => c.width(),
    };
    let mut cols: Vec<Col> = Col::ALL.to_vec();
    let need = |cols: &[Col]| -> u32 {
        cols.iter().map(|c| u32::from(w(*c))).sum::<u32>() + cols.len().saturating_sub(1) as u32
    };
    while need(&cols) > u32::from(width) && cols.len() > 2 {
        let (i, _) = cols
            .iter()
            .enumerate()
            .filter(|(_, c)| c.priority() < 100)
            .min_by_key(|(_, c)| c.priority())
            .expect("a droppable column");
        cols.remove(i);
    }
    let spare = u32::from(width).saturating_sub(need(&cols)) as u16;
    let mut x = 0;
    let mut out = Vec::with_capacity(cols.len());
    for c in cols {
        let cw = if c == Col::Name { w(c) + spare } else { w(c) };
        out.push((c, x, cw));
        x += cw + 1;
    }
    Columns(out)
}
