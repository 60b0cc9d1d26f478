//! Replaying allocation traces through the simulator.
//!
//! # Request format (JSON lines)
//!
//! One JSON object per line; blank lines are ignored. `op` selects the
//! request:
//!
//! ```text
//! {"op":"alloc","id":7,"size":1048576,"stream":0}   // torch.empty(...): `size` bytes on `stream` (default 0)
//! {"op":"free","id":7}                              // the tensor with this id dies
//! {"op":"empty_cache"}                              // torch.cuda.empty_cache()
//! {"op":"record_stream","id":7,"stream":3}          // tensor.record_stream(s): its free waits for stream 3
//! {"op":"synchronize"}                              // torch.cuda.synchronize(): pending frees complete
//! ```
//!
//! `id` names a live tensor: an `alloc` may not reuse an id that is still
//! live, and `free` / `record_stream` must name a live one (the parser
//! checks this, with the line number). An `alloc` that runs out of memory
//! leaves its id dead; a later `free` of it is a no-op in the replay.
//!
//! A trace is read as a stream: [`TraceReader`] yields one request at a
//! time from any reader (a line may be at most [`MAX_LINE`] bytes; a
//! longer one, e.g. `/dev/zero`, is an error naming its line), keeping
//! only the set of live ids, and [`Replay`] applies one request at a time,
//! keeping only the allocator and the live tensors' addresses. Memory is
//! bounded by the live tensors, not by the trace's length.
//!
//! [`replay`] returns one [`StepReport`] per request, with the allocator's
//! statistics after it (`allocated`, `reserved` and `segments` mean exactly
//! `allocated_bytes.all.current`, `reserved_bytes.all.current` and
//! `segment.all.current`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::BufRead;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::allocator::{EventSink, NullSink, OomError, SimAllocator, SimConfig};
use super::placement::Placement;
use vramscope_text::format::{bytes, percent};

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Alloc {
        id: u64,
        size: u64,
        #[serde(default)]
        stream: u64,
        /// Where the real allocator put the segment this request made, when
        /// it made one and the trace knows (a recording does: its
        /// SEGMENT_ALLOC / SEGMENT_MAP address). The simulator's new
        /// segment takes it, so that ties between equal free blocks break
        /// by the same addresses as in PyTorch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment_addr: Option<u64>,
        /// The real allocator released segments just before this request
        /// (a recording saw the release but cannot tell why): either its
        /// own retry, when the request did not fit, or the job's
        /// `empty_cache()`. The replay tells them apart: when the request
        /// fits without releasing anything, it was `empty_cache()`, and
        /// the replay empties the cache first.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        released_before: bool,
    },
    Free {
        id: u64,
    },
    EmptyCache,
    RecordStream {
        id: u64,
        stream: u64,
    },
    Synchronize,
}

impl Request {
    /// An allocation whose segment's address is not known (a replay past
    /// what the job did, or a test's).
    pub fn alloc(id: u64, size: u64, stream: u64) -> Request {
        Request::Alloc {
            id,
            size,
            stream,
            segment_addr: None,
            released_before: false,
        }
    }
}

/// A trace line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    /// 1-based line number.
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// The longest line a trace may have (1 MiB).
pub const MAX_LINE: usize = 1 << 20;

/// Checks a trace's lines one by one: each is a request, and ids are used
/// consistently (it keeps the set of live ids).
#[derive(Debug, Default)]
pub struct TraceParser {
    live: HashSet<u64>,
    line: usize,
}

impl TraceParser {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The number of the last line given (1-based).
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// The request on the next line, or None for a blank line.
    pub(crate) fn next_line(&mut self, raw: &str) -> Result<Option<Request>, TraceError> {
        self.line += 1;
        let line = self.line;
        let s = raw.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let req: Request = serde_json::from_str(s).map_err(|e| TraceError {
            line,
            message: format!("{e} (in `{}`)", shorten(s)),
        })?;
        let live = &mut self.live;
        match &req {
            Request::Alloc { id, .. } => {
                if !live.insert(*id) {
                    return Err(TraceError {
                        line,
                        message: format!("alloc of id {id}, which is still live"),
                    });
                }
            }
            Request::Free { id } => {
                if !live.remove(id) {
                    return Err(TraceError {
                        line,
                        message: format!("free of id {id}, which is not live"),
                    });
                }
            }
            Request::RecordStream { id, .. } => {
                if !live.contains(id) {
                    return Err(TraceError {
                        line,
                        message: format!("record_stream of id {id}, which is not live"),
                    });
                }
            }
            Request::EmptyCache | Request::Synchronize => {}
        }
        Ok(Some(req))
    }
}

/// At most 200 characters of a line, for an error message.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The requests of a JSON-lines trace read from `R`, one at a time.
pub struct TraceReader<R> {
    input: R,
    parser: TraceParser,
    buf: Vec<u8>,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R) -> Self {
        TraceReader {
            input,
            parser: TraceParser::new(),
            buf: Vec::new(),
        }
    }

    /// The next request; None at the end of the input.
    pub fn next_request(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            self.buf.clear();
            let line = self.parser.line() + 1;
            let n = std::io::Read::take(&mut self.input, MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| TraceError {
                    line,
                    message: format!("reading: {e}"),
                })?;
            if n == 0 {
                return Ok(None);
            }
            if self.buf.last() == Some(&b'\n') {
                self.buf.pop();
            } else if self.buf.len() > MAX_LINE {
                return Err(TraceError {
                    line,
                    message: format!("longer than {MAX_LINE} bytes (1 MiB); not a trace?"),
                });
            }
            let text = std::str::from_utf8(&self.buf).map_err(|_| TraceError {
                line,
                message: "not UTF-8 text; not a trace?".into(),
            })?;
            if let Some(req) = self.parser.next_line(text)? {
                return Ok(Some(req));
            }
        }
    }
}

/// Parses a JSON-lines trace, checking that ids are used consistently.
pub fn parse_trace(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut parser = TraceParser::new();
    let mut out = Vec::new();
    for raw in text.lines() {
        if let Some(req) = parser.next_line(raw)? {
            out.push(req);
        }
    }
    Ok(out)
}

/// The allocator's state after one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    /// 0-based index of the request.
    pub step: usize,
    pub(crate) request: Request,
    /// `allocated_bytes.all.current`
    pub allocated: u64,
    /// `reserved_bytes.all.current`
    pub reserved: u64,
    /// `segment.all.current` (cudaMalloc segments; expandable segments are
    /// mapped pages, not counted, as in PyTorch)
    pub segments: u64,
    /// `active_bytes.all.current`
    pub(crate) active: u64,
    /// `requested_bytes.all.current`
    pub(crate) requested: u64,
    /// Fragmentation: `inactive_split_bytes.all.current`.
    pub(crate) inactive_split: u64,
    /// The largest cached free block.
    pub(crate) largest_free: u64,
    pub(crate) allocated_peak: u64,
    pub(crate) reserved_peak: u64,
    pub(crate) alloc_retries: u64,
    pub(crate) ooms: u64,
    /// The address the request got (alloc only).
    pub(crate) addr: Option<u64>,
    /// Set when this request ran out of memory.
    pub oom: Option<OomError>,
    /// A remark (e.g. a free of a tensor whose alloc failed).
    pub(crate) note: Option<String>,
}

/// Replays `requests` on a fresh allocator with `cfg`.
pub fn replay(requests: &[Request], cfg: &SimConfig) -> Vec<StepReport> {
    replay_with_sink(requests, cfg, &mut NullSink)
}

/// [`replay`], sending every trace event to `sink` (one simulated
/// millisecond per request).
pub fn replay_with_sink(
    requests: &[Request],
    cfg: &SimConfig,
    sink: &mut dyn EventSink,
) -> Vec<StepReport> {
    let mut r = Replay::new(cfg);
    requests.iter().map(|req| r.step(req, sink)).collect()
}

/// A replay one request at a time: the allocator and the live tensors'
/// addresses, nothing of the requests already applied.
///
/// A new segment goes where the request says the real one went
/// (`segment_addr`), else where the replay's [`Placement`] puts it (by
/// default the driver's order, [`Placement::driver`]).
#[derive(Clone)]
pub struct Replay {
    a: SimAllocator,
    addrs: HashMap<u64, u64>,
    step: usize,
    placement: Placement,
    given: bool,
}

impl Replay {
    pub fn new(cfg: &SimConfig) -> Self {
        Self::with_placement(cfg, Placement::driver())
    }

    /// A replay whose segments go where `placement` puts them when the
    /// request does not say.
    pub(crate) fn with_placement(cfg: &SimConfig, placement: Placement) -> Self {
        Replay {
            a: SimAllocator::new(cfg.clone()),
            addrs: HashMap::new(),
            step: 0,
            placement,
            given: true,
        }
    }

    /// A replay that begins where a running job's allocator is: `held`
    /// installed (None when one of them cannot be, or the setting has
    /// expandable segments). Its tensors are taken up with [`Self::adopt`].
    pub(crate) fn installed(
        cfg: &SimConfig,
        held: &[crate::model::device::HeldSegment],
    ) -> Option<Self> {
        let mut r = Replay::new(cfg);
        held.iter().all(|s| r.a.install(s)).then_some(r)
    }

    /// Tensor `id` is the one an installed segment holds at `addr` (each
    /// address once); false (nothing changed) when no allocated block
    /// begins there.
    pub(crate) fn adopt(&mut self, id: u64, addr: u64) -> bool {
        let held = self.a.block_size(addr).is_some();
        if held {
            self.addrs.insert(id, addr);
        }
        held
    }

    /// Leaves out the addresses the requests give: every segment goes
    /// where the placement puts it (a what-if replay under another
    /// setting, where the real addresses mean nothing).
    pub(crate) fn ignoring_addresses(mut self) -> Self {
        self.given = false;
        self
    }

    /// Among equal free blocks, takes the one at the highest address
    /// (PyTorch takes the lowest): beside a replay without it, shows the
    /// steps a tie decides.
    pub(crate) fn breaking_ties_high(mut self) -> Self {
        self.a.break_ties_high(true);
        self
    }

    /// Peaks from now on (`torch.cuda.reset_peak_memory_stats()`).
    pub(crate) fn reset_peaks(&mut self) {
        self.a.reset_peak_stats();
    }

    /// The allocator's statistics after the requests applied so far.
    pub fn stats(&self) -> vramscope_wire::event::Stats {
        self.a.stats()
    }

    /// Applies the next request (one simulated millisecond after the last).
    pub fn step(&mut self, req: &Request, sink: &mut dyn EventSink) -> StepReport {
        let step = self.step;
        self.step += 1;
        self.a.set_time((step as u64).saturating_mul(1_000_000));
        let given = self.given;
        let outcome = apply(
            &mut self.a,
            &mut self.placement,
            given,
            &mut self.addrs,
            req,
            sink,
        );
        StepReport::after(step, req, &self.a, outcome)
    }
}

/// What one request did besides changing the statistics.
#[derive(Default)]
struct Outcome {
    addr: Option<u64>,
    oom: Option<OomError>,
    note: Option<String>,
}

fn skipped(id: u64) -> String {
    format!("id {id} was never allocated (out of memory); skipped")
}

/// Whether `a` serves `size` bytes without releasing cached segments
/// itself (no retry, no garbage collection, no OOM): tried on a copy.
fn fits_without_releasing(
    a: &SimAllocator,
    placement: &Placement,
    size: u64,
    stream: u64,
    at: Option<u64>,
) -> bool {
    let (mut probe, mut p) = (a.clone(), placement.clone());
    let mut released = false;
    let mut sink = super::allocator::FnSink(|e: vramscope_wire::event::Event| {
        use vramscope_wire::event::EventKind::{SegmentFree, SegmentUnmap};
        released |= matches!(e.kind, SegmentFree { .. } | SegmentUnmap { .. });
    });
    let ok = p.malloc(&mut probe, size, stream, at, &mut sink).is_ok();
    ok && !released
}

/// Applies one request; `addrs` maps live tensor ids to their addresses.
fn apply(
    a: &mut SimAllocator,
    placement: &mut Placement,
    given: bool,
    addrs: &mut HashMap<u64, u64>,
    req: &Request,
    sink: &mut dyn EventSink,
) -> Outcome {
    let mut out = Outcome::default();
    match *req {
        Request::Alloc {
            id,
            size,
            stream,
            segment_addr,
            released_before,
        } => {
            let at = segment_addr.filter(|_| given);
            if released_before && fits_without_releasing(a, placement, size, stream, at) {
                a.empty_cache(sink);
                out.note = Some("segments released before it: an empty_cache()".into());
            }
            match placement.malloc(a, size, stream, at, sink) {
                Ok(p) => {
                    addrs.insert(id, p);
                    out.addr = Some(p);
                }
                Err(e) => out.oom = Some(e),
            }
        }
        Request::Free { id } => match addrs.remove(&id) {
            Some(p) => a.free(p, sink).expect("live tensor"),
            None => out.note = Some(skipped(id)),
        },
        Request::RecordStream { id, stream } => match addrs.get(&id) {
            Some(&p) => a.record_stream(p, stream).expect("live tensor"),
            None => out.note = Some(skipped(id)),
        },
        Request::EmptyCache => a.empty_cache(sink),
        Request::Synchronize => a.synchronize(sink),
    }
    out
}

impl StepReport {
    /// The report of request `step`, from the allocator's state after it.
    fn after(step: usize, req: &Request, a: &SimAllocator, outcome: Outcome) -> StepReport {
        let st = a.stats();
        StepReport {
            step,
            request: req.clone(),
            allocated: st.allocated,
            reserved: st.reserved,
            segments: st.segments,
            active: st.active,
            requested: st.requested,
            inactive_split: st.inactive_split,
            largest_free: a.largest_free_block(),
            allocated_peak: st.allocated_peak,
            reserved_peak: st.reserved_peak,
            alloc_retries: st.alloc_retries,
            ooms: st.ooms,
            addr: outcome.addr,
            oom: outcome.oom,
            note: outcome.note,
        }
    }
}

fn describe(r: &Request) -> String {
    match r {
        Request::Alloc {
            id, size, stream, ..
        } => {
            format!("alloc #{id} {} s{stream}", bytes(*size))
        }
        Request::Free { id } => format!("free #{id}"),
        Request::EmptyCache => "empty_cache".into(),
        Request::RecordStream { id, stream } => format!("record_stream #{id} s{stream}"),
        Request::Synchronize => "synchronize".into(),
    }
}

/// A plain-text table of a replay, one line per step, then a summary.
pub fn render_table(reports: &[StepReport]) -> String {
    let mut s = table_header();
    for r in reports {
        s.push_str(&table_row(r));
    }
    if let Some(last) = reports.last() {
        s.push_str(&table_summary(last));
    }
    s
}

/// The table's header line. FRAG is the dashboard's FRAG: the inactive
/// split as a share of reserved; `split` is the same in bytes.
pub fn table_header() -> String {
    format!(
        "{:>6}  {:<28} {:>10} {:>10} {:>5} {:>5} {:>10} {:>12}\n",
        "step", "request", "allocated", "reserved", "segs", "FRAG", "split", "largest free"
    )
}

/// The table's line for one step.
pub fn table_row(r: &StepReport) -> String {
    let frag = if r.reserved > 0 {
        percent(r.inactive_split as f64 / r.reserved as f64)
    } else {
        "—".to_string()
    };
    let mut s = format!(
        "{:>6}  {:<28} {:>10} {:>10} {:>5} {:>5} {:>10} {:>12}",
        r.step,
        describe(&r.request),
        bytes(r.allocated),
        bytes(r.reserved),
        r.segments,
        frag,
        bytes(r.inactive_split),
        bytes(r.largest_free),
    );
    if let Some(e) = &r.oom {
        let _ = write!(s, "  OOM: {e}");
    }
    if let Some(n) = &r.note {
        let _ = write!(s, "  ({n})");
    }
    s.push('\n');
    s
}

/// The table's last line, from the last step's report.
pub fn table_summary(last: &StepReport) -> String {
    format!(
        "peak allocated {}, peak reserved {}, retries {}, OOMs {}\n",
        bytes(last.allocated_peak),
        bytes(last.reserved_peak),
        last.alloc_retries,
        last.ooms
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::conf::AllocConf;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_table_gives_frag_as_the_dashboard_does_and_bytes_in_one_unit_style() {
        let reports = replay(
            &[
                Request::alloc(1, 3 * MIB, 0),
                Request::alloc(2, 5 * MIB, 0),
                Request::Free { id: 1 },
            ],
            &SimConfig::default(),
        );
        let t = render_table(&reports);
        let header = t.lines().next().unwrap();
        assert!(
            header.contains("FRAG") && header.contains("split"),
            "{header}"
        );
        let last = reports.last().unwrap();
        let share =
            vramscope_text::format::percent(last.inactive_split as f64 / last.reserved as f64);
        let row = t.lines().nth(3).unwrap();
        assert!(row.contains(&share), "{share} in {row}");
        assert!(
            row.contains(&vramscope_text::format::bytes(last.inactive_split)),
            "{row}"
        );
        assert!(!t.contains("bytes") && !t.contains(".00 KiB"), "{t}");
    }

    #[test]
    fn parses_documented_format() {
        let text = r#"{"op":"alloc","id":7,"size":1048576,"stream":0}

{"op":"alloc","id":8,"size":512}
{"op":"record_stream","id":8,"stream":2}
{"op":"free","id":7}
{"op":"empty_cache"}
{"op":"synchronize"}
"#;
        let reqs = parse_trace(text).unwrap();
        assert_eq!(reqs.len(), 6);
        assert_eq!(reqs[0], Request::alloc(7, 1 << 20, 0));
        assert_eq!(reqs[1], Request::alloc(8, 512, 0));
        assert_eq!(reqs[4], Request::EmptyCache);
    }

    #[test]
    fn errors_carry_line_numbers() {
        let e = parse_trace(
            "{\"op\":\"alloc\",\"id\":1,\"size\":4}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":1}\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().starts_with("trace line 3:"));
        let e = parse_trace("\n\n{\"op\":\"free\",\"id\":3}").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("not live"));
        let e = parse_trace(
            "{\"op\":\"alloc\",\"id\":1,\"size\":4}\n{\"op\":\"alloc\",\"id\":1,\"size\":4}",
        )
        .unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_trace("{\"op\":\"alloc\",\"id\":1}").unwrap_err();
        assert!(e.message.contains("size"), "{e}");
        assert!(parse_trace("not json").is_err());
    }

    #[test]
    fn reader_streams_and_bounds_lines() {
        let text = "{\"op\":\"alloc\",\"id\":1,\"size\":4}\n\n{\"op\":\"free\",\"id\":1}";
        let mut r = TraceReader::new(text.as_bytes());
        assert!(matches!(r.next_request(), Ok(Some(Request::Alloc { .. }))));
        assert_eq!(r.next_request(), Ok(Some(Request::Free { id: 1 })));
        assert_eq!(r.next_request(), Ok(None));
        let zeros = std::io::BufReader::new(std::io::repeat(0));
        let e = TraceReader::new(zeros).next_request().unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("longer than"), "{e}");
        let mut long = "{\"op\":\"synchronize\"}\n".to_string();
        long.push_str(&" ".repeat(MAX_LINE));
        long.push_str("{\"op\":\"synchronize\"}\n");
        let mut r = TraceReader::new(long.as_bytes());
        assert!(r.next_request().unwrap().is_some());
        assert_eq!(r.next_request().unwrap_err().line, 2);
    }

    #[test]
    fn replay_reports_memory_stats_semantics() {
        let reqs = parse_trace(
            r#"{"op":"alloc","id":1,"size":5242880}
{"op":"alloc","id":2,"size":1000}
{"op":"free","id":1}
{"op":"empty_cache"}
{"op":"free","id":2}
{"op":"empty_cache"}"#,
        )
        .unwrap();
        let r = replay(&reqs, &SimConfig::default());
        assert_eq!(r.len(), 6);
        assert_eq!(
            (r[0].allocated, r[0].reserved, r[0].segments),
            (5 * MIB, 20 * MIB, 1)
        );
        assert_eq!(r[0].inactive_split, 15 * MIB);
        assert_eq!(
            (r[1].allocated, r[1].reserved, r[1].segments),
            (5 * MIB + 1024, 22 * MIB, 2)
        );
        assert_eq!(r[1].requested, 5 * MIB + 1000);
        assert_eq!(
            (r[2].allocated, r[2].reserved, r[2].largest_free),
            (1024, 22 * MIB, 20 * MIB)
        );
        assert_eq!((r[3].reserved, r[3].segments), (2 * MIB, 1));
        assert_eq!((r[5].reserved, r[5].segments, r[5].allocated), (0, 0, 0));
        assert_eq!(r[5].reserved_peak, 22 * MIB);
        assert!(r.iter().all(|s| s.oom.is_none()));
        let json = serde_json::to_string(&r).unwrap();
        let back: Vec<StepReport> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        assert!(render_table(&r).contains("empty_cache"));
    }

    #[test]
    fn replay_oom_and_skip() {
        let reqs = parse_trace(
            r#"{"op":"alloc","id":1,"size":62914560}
{"op":"alloc","id":2,"size":62914560}
{"op":"free","id":2}
{"op":"free","id":1}"#,
        )
        .unwrap();
        let cfg = SimConfig {
            capacity: 100 * MIB,
            ..SimConfig::default()
        };
        let r = replay(&reqs, &cfg);
        let oom = r[1].oom.as_ref().expect("second 60 MiB does not fit");
        assert_eq!(oom.device_free, 40 * MIB);
        assert_eq!(r[1].ooms, 1);
        assert!(r[2].note.is_some());
        assert_eq!(r[3].allocated, 0);
        assert!(render_table(&r).contains("OOM"));
    }

    #[test]
    fn replay_with_conf_changes_outcome() {
        // Growing tensors (batch N, N+1, ...), each replacing the last:
        // cudaMalloc segments pile up, an expandable segment grows in place.
        let mut text = String::new();
        for i in 0..20u64 {
            let size = (11 + i) * MIB;
            text.push_str(&format!(
                "{{\"op\":\"alloc\",\"id\":{i},\"size\":{size}}}\n"
            ));
            if i > 0 {
                text.push_str(&format!("{{\"op\":\"free\",\"id\":{}}}\n", i - 1));
            }
        }
        let reqs = parse_trace(&text).unwrap();
        let plain = replay(&reqs, &SimConfig::default());
        let es = replay(
            &reqs,
            &SimConfig::with_conf(AllocConf::parse("expandable_segments:True").unwrap()),
        );
        assert_eq!(
            plain.last().unwrap().requested,
            es.last().unwrap().requested
        );
        assert_eq!(es.last().unwrap().segments, 0);
        assert!(es.last().unwrap().reserved_peak < plain.last().unwrap().reserved_peak);
    }
}
