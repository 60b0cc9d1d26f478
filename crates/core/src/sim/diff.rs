//! Differential replay: traces recorded from real PyTorch by
//! `tests/gpu/sim_diff.py` (one gzip'd JSON-lines file per allocator setting,
//! format in that script's docstring) are replayed through the simulator,
//! and after every request the six figures `memory_stats()` reported are
//! compared with the simulator's.
//!
//! With `Addresses::Real`, every segment the simulator creates takes the
//! address the real one had (the address the request got at that step), so
//! ties between equal free blocks break as in PyTorch. With
//! `Addresses::Own`, segments go where the driver's address space would
//! put them (`sim::va`), and five more runs
//! replay the trace beside it with other orders (reversed, shuffled): from a
//! step where any of them disagrees on a figure until the device is empty
//! again, steps are decided by a tie and counted apart.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Deserialize;

use super::allocator::{NullSink, SimAllocator, SimConfig};
use super::conf::AllocConf;
use super::placement::Placement;

/// The figures compared at every step, in the order a step records them.
pub(crate) const FIGURES: [&str; 6] = [
    "allocated",
    "reserved",
    "segments",
    "inactive_split",
    "alloc_retries",
    "ooms",
];

/// Where the simulator's segments go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addresses {
    /// Where the trace says the real ones went.
    Real,
    /// In the order the driver hands out most segments.
    Own,
    /// Ascending, never reused (the simulator's order before the driver's
    /// was measured): the baseline `Own` is compared with.
    Ascending,
}

/// The first step of a trace where the simulator and PyTorch disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    pub trace: u64,
    /// 1-based request number within the trace.
    pub step: usize,
    /// The request: op (a, f, r, e), tensor id, size, stream.
    pub request: String,
    /// One of `FIGURES`, or "address".
    pub figure: &'static str,
    pub simulated: u64,
    pub real: u64,
    /// Whether an earlier request was decided by a tie (`Addresses::Own`).
    pub after_tie: bool,
}

/// One setting's result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub setting: String,
    pub conf: String,
    pub fraction: Option<f64>,
    pub traces: usize,
    pub requests: usize,
    /// Steps compared (not after a tie) and those matching on all six.
    pub compared: usize,
    pub matching: usize,
    /// Steps from a tie-decided request on (`Addresses::Own`) and those
    /// matching anyway.
    pub after_tie: usize,
    pub after_tie_matching: usize,
    /// Tie-decided steps whose six real figures each lie in the range the
    /// replays span (what `sim` and the advisor report for such a step).
    pub after_tie_in_range: usize,
    /// Successful allocations, and those at the real address.
    pub allocs: usize,
    pub addresses_matching: usize,
    /// Traces whose segments (address and size of each, from
    /// `memory_snapshot()` at the end) the simulator has too: address and
    /// size with `Addresses::Real`, sizes alone with `Addresses::Own`.
    pub segments_matching: usize,
    /// Traces that did not start from an empty cache (not replayed).
    pub dirty: usize,
    /// The first divergence of each diverging trace.
    pub divergences: Vec<Divergence>,
}

#[derive(Deserialize)]
struct Header {
    setting: String,
    conf: String,
    fraction: Option<f64>,
    capacity: u64,
}

#[derive(Deserialize)]
struct TraceEnd {
    /// address, total size, pool, stream
    segments: Vec<(u64, u64, serde_json::Value, serde_json::Value)>,
}

#[derive(Deserialize)]
struct TraceStart {
    trace: u64,
    reserved: u64,
    base: (u64, u64),
}

/// op, id, size, stream, address, then the six figures.
type Step = (
    String,
    u64,
    u64,
    u64,
    Option<u64>,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
);

/// One simulator replaying a trace.
struct Run {
    sim: SimAllocator,
    /// Simulated addresses of the live tensors, by id.
    addrs: HashMap<u64, u64>,
    placement: Placement,
}

/// The largest device capacity a header may give (the simulated address
/// space must hold several devices' worth).
const MAX_CAPACITY: u64 = 1 << 50;

/// How many shuffled runs beside the reversed one.
const SHUFFLED_RUNS: u64 = 4;

/// The runs beside the one compared: one with the reversed order, and
/// `SHUFFLED_RUNS` shuffled ones, seeded by the trace's number.
fn other_runs(cfg: &SimConfig, trace: u64) -> Vec<Run> {
    let mut runs: Vec<Run> = Placement::alternatives(1 + SHUFFLED_RUNS as usize, trace)
        .into_iter()
        .map(|p| Run::new(cfg, p))
        .collect();
    // The driver's order with every tie between equal free blocks broken
    // the other way: a step whose figures then differ was decided by one.
    let mut flipped = Run::new(cfg, Placement::driver());
    flipped.sim.break_ties_high(true);
    runs.push(flipped);
    runs
}

impl Run {
    fn new(cfg: &SimConfig, placement: Placement) -> Run {
        Run {
            sim: SimAllocator::new(cfg.clone()),
            addrs: HashMap::new(),
            placement,
        }
    }

    /// Applies one request; returns the address an allocation got.
    /// `real_addr`: where the real segment went (`Addresses::Real`).
    fn apply(
        &mut self,
        op: &str,
        id: u64,
        size: u64,
        stream: u64,
        real_addr: Option<u64>,
    ) -> Result<Option<u64>, String> {
        let sim = &mut self.sim;
        match op {
            "a" => {
                let got = self
                    .placement
                    .malloc(sim, size, stream, real_addr, &mut NullSink)
                    .ok();
                if let Some(a) = got {
                    self.addrs.insert(id, a);
                }
                return Ok(got);
            }
            "f" => {
                if let Some(a) = self.addrs.remove(&id) {
                    sim.free(a, &mut NullSink).map_err(|e| e.to_string())?;
                }
            }
            "r" => {
                if let Some(&a) = self.addrs.get(&id) {
                    sim.record_stream(a, stream).map_err(|e| e.to_string())?;
                }
            }
            "e" => sim.empty_cache(&mut NullSink),
            other => return Err(format!("unknown op {other:?}")),
        }
        Ok(None)
    }
}

/// One trace being replayed: the run compared with PyTorch, and with
/// `Addresses::Own` five more whose segments go in other address orders
/// (`other_runs`), so that ties between equal free blocks break other ways.
struct Replay {
    trace: u64,
    run: Run,
    others: Vec<Run>,
    base: (u64, u64),
    step: usize,
    /// Whether the address orders have disagreed since the device was
    /// last empty.
    tied: bool,
    diverged: bool,
}

fn figures(sim: &SimAllocator) -> [u64; 6] {
    let s = sim.stats();
    [
        s.allocated,
        s.reserved,
        s.segments,
        s.inactive_split,
        s.alloc_retries,
        s.ooms,
    ]
}

/// Replays one setting's file; `Err` names the line that could not be read.
pub fn replay(input: impl BufRead, addresses: Addresses) -> Result<Report, String> {
    let mut lines = input.lines().enumerate();
    let bad = |n: usize, e: &dyn std::fmt::Display| format!("line {}: {e}", n + 1);
    let (n, first) = lines.next().ok_or("empty file")?;
    let header: Header =
        serde_json::from_str(&first.map_err(|e| bad(n, &e))?).map_err(|e| bad(n, &e))?;
    let conf = AllocConf::parse(&header.conf).map_err(|e| bad(n, &e))?;
    if header.capacity > MAX_CAPACITY {
        return Err(bad(
            n,
            &format!("capacity {} is more than 1 PiB", header.capacity),
        ));
    }
    let cfg = SimConfig {
        capacity: header.capacity,
        alloc: conf,
        memory_fraction: header.fraction,
        ..SimConfig::default()
    };
    let mut report = Report {
        setting: header.setting,
        conf: header.conf,
        fraction: header.fraction,
        ..Report::default()
    };
    let mut cur: Option<Replay> = None;
    for (n, line) in lines {
        let line = line.map_err(|e| bad(n, &e))?;
        if line.starts_with('[') {
            let step: Step = serde_json::from_str(&line).map_err(|e| bad(n, &e))?;
            let Some(r) = cur.as_mut() else {
                return Err(bad(n, &"a request before any trace"));
            };
            r.apply(&step, addresses, &mut report)
                .map_err(|e| bad(n, &e))?;
        } else if line.contains("\"trace\"") {
            let t: TraceStart = serde_json::from_str(&line).map_err(|e| bad(n, &e))?;
            report.traces += 1;
            cur = if t.reserved == 0 {
                Some(Replay {
                    trace: t.trace,
                    run: Run::new(
                        &cfg,
                        match addresses {
                            // Every new segment's address is given.
                            Addresses::Real => Placement::Ascending,
                            Addresses::Own => Placement::driver(),
                            Addresses::Ascending => Placement::Ascending,
                        },
                    ),
                    others: if addresses != Addresses::Real {
                        other_runs(&cfg, t.trace)
                    } else {
                        Vec::new()
                    },
                    base: t.base,
                    step: 0,
                    tied: false,
                    diverged: false,
                })
            } else {
                report.dirty += 1;
                None
            };
        } else if line.contains("\"end\"") {
            let end: TraceEnd = serde_json::from_str(&line).map_err(|e| bad(n, &e))?;
            if let Some(r) = cur.take() {
                let own = addresses != Addresses::Real;
                let key = |addr: u64, size: u64| if own { (0, size) } else { (addr, size) };
                let mut real: Vec<_> = end.segments.iter().map(|s| key(s.0, s.1)).collect();
                let mut sim: Vec<_> = r
                    .run
                    .sim
                    .segments()
                    .iter()
                    .map(|s| key(s.addr, s.size))
                    .collect();
                real.sort_unstable();
                sim.sort_unstable();
                report.segments_matching += (real == sim) as usize;
            }
        } else {
            return Err(bad(n, &"neither a request, a trace's start nor its end"));
        }
    }
    Ok(report)
}

impl Replay {
    fn apply(&mut self, s: &Step, addresses: Addresses, report: &mut Report) -> Result<(), String> {
        let (op, id, size, stream, real_addr) = (s.0.as_str(), s.1, s.2, s.3, s.4);
        self.step += 1;
        report.requests += 1;
        let hint = if addresses == Addresses::Real {
            real_addr
        } else {
            None
        };
        let sim_addr = self.run.apply(op, id, size, stream, hint)?;
        for other in &mut self.others {
            other.apply(op, id, size, stream, None)?;
        }
        let real = [
            s.5,
            s.6,
            s.7,
            s.8,
            s.9.saturating_sub(self.base.0),
            s.10.saturating_sub(self.base.1),
        ];
        let got = figures(&self.run.sim);
        let same = got == real;
        // Decided by a tie: the two address orders disagree.
        // Decided by a tie: from a step where the address orders disagree on
        // a figure until all runs are back to an empty device.
        if self.others.iter().any(|o| figures(&o.sim) != got) {
            self.tied = true;
        } else if got[2] == 0 && self.others.iter().all(|o| o.sim.stats().segments == 0) {
            self.tied = false;
        }
        let tied = self.tied;
        if tied {
            report.after_tie += 1;
            report.after_tie_matching += same as usize;
            let in_range = (0..6).all(|k| {
                let all =
                    std::iter::once(got[k]).chain(self.others.iter().map(|o| figures(&o.sim)[k]));
                let (lo, hi) = all.fold((u64::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)));
                (lo..=hi).contains(&real[k])
            });
            report.after_tie_in_range += in_range as usize;
        } else {
            report.compared += 1;
            report.matching += same as usize;
        }
        if let (Some(r), Some(g)) = (real_addr, sim_addr) {
            report.allocs += 1;
            report.addresses_matching += (r == g) as usize;
        }
        if self.diverged {
            return Ok(());
        }
        let differs = (0..6)
            .find(|&i| got[i] != real[i])
            .map(|i| (FIGURES[i], got[i], real[i]));
        let addr_differs = match (addresses, real_addr, sim_addr) {
            (Addresses::Real, Some(r), Some(g)) if r != g => Some(("address", g, r)),
            (_, None, Some(g)) if op == "a" => Some(("address", g, 0)),
            (_, Some(r), None) => Some(("address", 0, r)),
            _ => None,
        };
        if let Some((figure, simulated, real)) = differs.or(addr_differs) {
            self.diverged = true;
            report.divergences.push(Divergence {
                trace: self.trace,
                step: self.step,
                request: format!("{op} id {id} size {size} stream {stream}"),
                figure,
                simulated,
                real,
                after_tie: tied,
            });
        }
        Ok(())
    }
}

impl Report {
    /// Percentage of compared steps matching on all six figures.
    pub fn share(&self) -> f64 {
        percent(self.matching, self.compared)
    }
}

/// `part` of `whole` in percent (100 when `whole` is 0).
pub fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        100.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"setting":"t","conf":"","fraction":null,"capacity":1073741824}"#;

    fn run(body: &str, addresses: Addresses) -> Result<Report, String> {
        replay(format!("{HEADER}\n{body}").as_bytes(), addresses)
    }

    #[test]
    fn a_matching_trace_and_a_divergence_in_exact_bytes() {
        // 1000 B -> a 512 B-rounded block of 1024 in a new 2 MiB segment.
        let ok = r#"{"trace":0,"seed":1,"reserved":0,"base":[0,0]}
["a",1,1000,0,140187732541440,1024,2097152,1,2096128,0,0]
["f",1,0,0,null,0,2097152,1,0,0,0]
["e",0,0,0,null,0,0,0,0,0,0]
{"end":0,"segments":[]}"#;
        let r = run(ok, Addresses::Real).unwrap();
        assert_eq!((r.traces, r.requests, r.compared, r.matching), (1, 3, 3, 3));
        assert_eq!(
            (r.allocs, r.addresses_matching, r.segments_matching),
            (1, 1, 1)
        );
        assert!(r.divergences.is_empty());
        // PyTorch said 1536 allocated: the first divergence, in bytes.
        let off = ok.replace(
            "1000,0,140187732541440,1024,",
            "1000,0,140187732541440,1536,",
        );
        let r = run(&off, Addresses::Real).unwrap();
        assert_eq!(r.matching, 2);
        let d = &r.divergences[0];
        assert_eq!(
            (d.step, d.figure, d.simulated, d.real),
            (1, "allocated", 1024, 1536)
        );
        // The simulator's own addresses: the figures still match.
        let r = run(ok, Addresses::Own).unwrap();
        assert_eq!((r.matching, r.after_tie, r.addresses_matching), (3, 0, 0));
    }

    #[test]
    fn bad_lines_are_one_error_naming_the_line() {
        let start = r#"{"trace":0,"seed":1,"reserved":0,"base":[0,0]}"#;
        for (body, want) in [
            (
                format!("{start}\n[\"x\",1,1,0,null,0,0,0,0,0,0]"),
                "line 3: unknown op",
            ),
            (format!("{start}\n[\"a\",1]"), "line 3: "),
            (
                "[\"a\",1,1,0,null,0,0,0,0,0,0]".to_string(),
                "line 2: a request before any trace",
            ),
            ("hello".to_string(), "line 2: neither"),
        ] {
            let e = run(&body, Addresses::Own).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
        assert!(replay("".as_bytes(), Addresses::Real).is_err());
        let bad_conf = HEADER.replace(r#""conf":"""#, r#""conf":"nonsense:1""#);
        assert!(replay(bad_conf.as_bytes(), Addresses::Real).is_err());
    }

    #[test]
    fn extreme_values_do_not_panic() {
        let huge = HEADER.replace("1073741824", &(1u64 << 50).to_string());
        let too_big = HEADER.replace("1073741824", &u64::MAX.to_string());
        let e = replay(too_big.as_bytes(), Addresses::Real).unwrap_err();
        assert!(e.starts_with("line 1: capacity"), "{e}");
        let body = r#"{"trace":0,"seed":1,"reserved":0,"base":[9,9]}
["a",1,18446744073709551615,0,18446744073709551615,0,0,0,0,0,0]
["a",2,1,2,0,0,0,0,0,0,0]
["r",2,0,1,null,0,0,0,0,0,0]
["f",2,0,0,null,0,0,0,0,0,0]
["f",7,0,0,null,0,0,0,0,0,0]"#;
        for header in [
            HEADER.to_string(),
            huge.replace("\"conf\":\"\"", "\"conf\":\"expandable_segments:True\""),
        ] {
            for addresses in [Addresses::Real, Addresses::Own] {
                let r = replay(format!("{header}\n{body}").as_bytes(), addresses).unwrap();
                assert_eq!(r.requests, 5);
            }
        }
    }
}
