//! The allocator advisor: a job's allocation requests replayed under the
//! settings it could have used, best first.
//!
//! [`candidates`] chooses the settings from the job itself: its own (the
//! check that the replay reproduces what happened),
//! `expandable_segments:True`, `max_split_size_mb` just above the median
//! and the 90th percentile of its large requests, `roundup_power2_divisions`
//! in both forms, `garbage_collection_threshold` where a memory fraction is
//! set, and the combinations users reach for. Each keeps the job's other
//! options; a candidate that changes nothing is left out (so
//! `expandable_segments:True` is never suggested to a job that has it).
//!
//! [`advise`] replays each candidate through a [`SpreadReplay`]: segments
//! go where the driver's address space would put them, four other placements beside it,
//! and where a tie between equal free blocks decides a figure it is given
//! as a range. The job's own setting is replayed with the addresses the
//! real segments had (exact, as `sim --trace` is on a recording) and
//! compared with the statistics the job recorded.
//!
//! Ranking: usable before unusable, then fewer out-of-memory errors (the
//! worst placement's), then lower peak reserved, then lower reserved at the
//! end. A candidate the job cannot use (expandable segments while it
//! allocates in a CUDA-graph pool, an option its torch predates) is marked
//! and never the recommendation.

use serde::Serialize;

use super::allocator::{NullSink, SimConfig};
use super::conf::AllocConf;
use super::from_events::PlacedSample;
use super::samples::{self, SampleCheck, Verdict};
use super::spread::{Range, SpreadReplay, Totals};
use super::trace::{Replay, Request};
use vramscope_wire::event::Stats;

const MIB: u64 = 1 << 20;

/// The least share of the job's peak reserved a candidate must save to be
/// recommended for it (without fewer OOMs): below it, a change of setting
/// is not worth making.
pub(crate) const MIN_SAVING: f64 = 0.01;

/// What the advisor knows of a job.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its allocation requests on one device, in order.
    pub requests: Vec<Request>,
    /// Its own setting: `PYTORCH_CUDA_ALLOC_CONF`'s text ("" for the
    /// defaults), device memory and memory fraction.
    pub conf: String,
    pub cfg: SimConfig,
    /// Its torch version (major, minor), when known.
    pub torch: Option<(u32, u32)>,
    /// It allocated in a pool other than the default (CUDA graphs,
    /// `MemPool`).
    pub graph_pools: bool,
    /// The requests that ran out of memory in the job (indices).
    pub ooms: Vec<usize>,
    /// The statistics the job recorded: placed by ring positions, and per
    /// request the one placed by time.
    pub placed: Vec<PlacedSample>,
    pub recorded: Vec<Option<Stats>>,
}

/// One setting to try.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The `PYTORCH_CUDA_ALLOC_CONF` value.
    pub conf: String,
    /// What it changes, in a few words.
    pub what: String,
    /// Why the job cannot use it (None: it can).
    pub unusable: Option<String>,
    /// It is the job's own setting.
    pub own: bool,
    #[serde(skip)]
    pub parsed: AllocConf,
}

/// Whether one OOM the job hit happens under a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomFate {
    /// The request succeeds under every placement.
    Avoided,
    /// It fails under every placement.
    Fails,
    /// A tie between equal free blocks decides.
    Depends,
}

/// A candidate's replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub candidate: Candidate,
    /// Figures over every placement (lo = hi where no tie decides).
    pub totals: Totals,
    /// Steps a tie between equal free blocks decided.
    pub tied_steps: usize,
    /// Per OOM the job hit (request index): its fate here.
    pub job_ooms: Vec<(usize, OomFate)>,
    /// Peak reserved against the job's own replay (bytes; negative is a
    /// saving), for the placement giving the highest peak.
    pub peak_change: i64,
}

/// How well the job's own replay reproduces what it recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OwnCheck {
    /// Samples compared (placed by ring positions, or by time), matching.
    pub compared: u64,
    pub matching: u64,
    /// The first difference, described.
    pub first_difference: Option<String>,
    /// The highest reserved any recorded sample shows.
    pub recorded_peak_reserved: Option<u64>,
    /// Its own replay's OOMs, against the job's.
    pub replay_ooms: u64,
    pub job_ooms: u64,
}

impl OwnCheck {
    /// Whether the replay reproduces the job: every compared sample
    /// matches and the OOMs are the same.
    pub fn reproduces(&self) -> bool {
        self.matching == self.compared && self.replay_ooms == self.job_ooms
    }
}

/// The advice: the own replay's check, and every candidate best first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    pub requests: usize,
    pub capacity: u64,
    pub memory_fraction: Option<f64>,
    pub own: OwnCheck,
    /// Best first; the job's own setting among them.
    pub outcomes: Vec<Outcome>,
    /// The index in `outcomes` of the recommendation: the best usable
    /// candidate that beats the job's own setting (None: keep it).
    pub best: Option<usize>,
}

impl Advice {
    /// The recommendation, if any.
    pub fn recommendation(&self) -> Option<&Outcome> {
        self.best.map(|i| &self.outcomes[i])
    }
}

/// The top-level options of a `PYTORCH_CUDA_ALLOC_CONF` text, as (key,
/// value) pairs, split at commas outside brackets.
fn options(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let mut push = |part: &str| {
        let part = part.trim();
        if part.is_empty() {
            return;
        }
        match part.split_once(':') {
            Some((k, v)) => out.push((k.trim().to_string(), v.trim().to_string())),
            None => out.push((part.to_string(), String::new())),
        }
    };
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&text[start..]);
    out
}

/// The job's options with `set` replacing or added to them.
pub(crate) fn with_options(own: &str, set: &[(&str, String)]) -> String {
    let mut opts = options(own);
    for (k, v) in set {
        match opts.iter_mut().find(|(key, _)| key == k) {
            Some(o) => o.1 = v.clone(),
            None => opts.push((k.to_string(), v.clone())),
        }
    }
    opts.iter()
        .map(|(k, v)| format!("{k}:{v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The torch version (major, minor) in a framework string such as
/// `torch 2.11.0+cu130`.
pub fn torch_version(framework: &str) -> Option<(u32, u32)> {
    let v = framework.strip_prefix("torch ")?;
    let mut parts = v.split(['.', '+', 'a', 'r', 'c']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The first torch release that reads each option (for options and forms
/// it predates, the candidate is marked).
fn needs(key: &str, value: &str) -> (u32, u32) {
    match key {
        "max_split_size_mb" => (1, 10),
        "garbage_collection_threshold" => (1, 12),
        "roundup_power2_divisions" if value.starts_with('[') => (2, 1),
        "roundup_power2_divisions" => (1, 13),
        "expandable_segments" => (2, 1),
        _ => (0, 0),
    }
}

/// `max_split_size_mb` values from the job's large requests: whole MiB
/// just above the median and the 90th percentile of their rounded sizes
/// (PyTorch takes values above 20).
fn max_split_values(job: &Job) -> Vec<u64> {
    let own = &job.cfg.alloc;
    let mut sizes: Vec<u64> = job
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::Alloc { size, .. } => Some(own.round_size(*size)),
            _ => None,
        })
        .filter(|&s| s > MIB)
        .collect();
    if sizes.is_empty() {
        return Vec::new();
    }
    sizes.sort_unstable();
    let at = |q: f64| sizes[((sizes.len() - 1) as f64 * q) as usize];
    let mut out: Vec<u64> = [at(0.5), at(0.9)]
        .into_iter()
        .map(|s| (s.div_ceil(MIB) + 1).max(21))
        .collect();
    out.dedup();
    out
}

/// The settings worth trying for `job`, its own first.
pub(crate) fn candidates(job: &Job) -> Vec<Candidate> {
    let own_text = job.conf.trim();
    let mut sets: Vec<(Vec<(&str, String)>, String)> = vec![(
        vec![("expandable_segments", "True".into())],
        "segments grow in place".into(),
    )];
    let splits = max_split_values(job);
    for v in &splits {
        sets.push((
            vec![("max_split_size_mb", v.to_string())],
            format!("blocks over {v} MiB are never split"),
        ));
    }
    sets.push((
        vec![("roundup_power2_divisions", "4".into())],
        "sizes rounded to quarter powers of two".into(),
    ));
    sets.push((
        vec![(
            "roundup_power2_divisions",
            "[256:1,512:2,1024:4,>:8]".into(),
        )],
        "sizes rounded per size band".into(),
    ));
    let fraction = job.cfg.memory_fraction.is_some();
    if fraction {
        for t in ["0.6", "0.8"] {
            sets.push((
                vec![("garbage_collection_threshold", t.into())],
                format!("cached blocks freed above {t} of the limit"),
            ));
        }
    }
    if let Some(v) = splits.last() {
        sets.push((
            vec![
                ("max_split_size_mb", v.to_string()),
                ("roundup_power2_divisions", "4".into()),
            ],
            "both".into(),
        ));
        if fraction {
            sets.push((
                vec![
                    ("max_split_size_mb", v.to_string()),
                    ("garbage_collection_threshold", "0.6".into()),
                ],
                "both".into(),
            ));
        }
    }
    if fraction {
        sets.push((
            vec![
                ("expandable_segments", "True".into()),
                ("garbage_collection_threshold", "0.6".into()),
            ],
            "both".into(),
        ));
    }
    let mut out = vec![Candidate {
        conf: own_text.to_string(),
        what: "the job's own setting".into(),
        unusable: None,
        own: true,
        parsed: job.cfg.alloc.clone(),
    }];
    for (set, what) in sets {
        let conf = with_options(own_text, &set);
        // Built from options the parser knows; a job's own text that does
        // not parse never gets here (its SimConfig would not exist).
        let Ok(parsed) = AllocConf::parse(&conf) else {
            continue;
        };
        if out.iter().any(|c| c.parsed == parsed) {
            continue;
        }
        let mut unusable = None;
        if parsed.expandable_segments && job.graph_pools {
            unusable = Some(
                "the job allocates in CUDA-graph (private) pools, which expandable segments do not serve"
                    .into(),
            );
        }
        if let Some(have) = job.torch {
            for (k, v) in &set {
                let need = needs(k, v);
                if have < need {
                    unusable = Some(format!(
                        "`{k}:{v}` needs torch {}.{} or later; the job has {}.{}",
                        need.0, need.1, have.0, have.1
                    ));
                }
            }
        }
        out.push(Candidate {
            what: if what == "both" {
                set.iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(" with ")
            } else {
                what
            },
            conf,
            unusable,
            own: false,
            parsed,
        });
    }
    out
}

/// Replays one candidate; `exact`: with the addresses the requests give.
fn replay(job: &Job, c: &Candidate, exact: bool) -> Outcome {
    let cfg = SimConfig {
        alloc: c.parsed.clone(),
        ..job.cfg.clone()
    };
    let mut r = if exact {
        SpreadReplay::exact(&cfg)
    } else {
        SpreadReplay::new(&cfg, true)
    };
    let mut fates = Vec::with_capacity(job.ooms.len());
    let mut next = job.ooms.iter().copied().peekable();
    for (i, req) in job.requests.iter().enumerate() {
        let (rep, spread) = r.step(req);
        while next.peek().is_some_and(|&k| k < i) {
            next.next();
        }
        if next.peek() == Some(&i) {
            let failed = rep.oom.is_some();
            let fate = match spread {
                // A tie split the replays: the OOM counter differs.
                Some(s) if s.ooms.is_spread() => OomFate::Depends,
                _ if failed => OomFate::Fails,
                _ => OomFate::Avoided,
            };
            fates.push((i, fate));
        }
    }
    let totals = r.totals().unwrap_or_else(|| {
        let zero = Range { lo: 0, hi: 0 };
        Totals {
            reserved_now: zero,
            reserved_peak: zero,
            allocated_peak: zero,
            inactive_split_now: zero,
            inactive_split_peak: zero,
            alloc_retries: zero,
            ooms: zero,
        }
    });
    Outcome {
        candidate: c.clone(),
        totals,
        tied_steps: r.tied,
        job_ooms: fates,
        peak_change: 0,
    }
}

impl OwnCheck {
    /// One recorded sample compared: `diffs` are the figures that differ.
    pub(crate) fn see(&mut self, diffs: &[samples::Difference], recorded: &Stats) {
        let peak = self.recorded_peak_reserved.unwrap_or(0);
        self.recorded_peak_reserved = Some(peak.max(recorded.reserved));
        self.compared += 1;
        if diffs.is_empty() {
            self.matching += 1;
        } else if self.first_difference.is_none() {
            self.first_difference = Some(samples::describe_all(diffs));
        }
    }

    fn take(&mut self, checked: Vec<samples::Checked>) {
        for c in checked {
            match &c.verdict {
                Verdict::Matches => self.see(&[], &c.recorded),
                Verdict::Differs(d) => self.see(d, &c.recorded),
                Verdict::Ambiguous => {}
            }
        }
    }
}

/// The job's own replay (exact addresses) against what it recorded.
fn check_own(job: &Job) -> OwnCheck {
    let mut replay = Replay::new(&job.cfg);
    let mut check = SampleCheck::new(job.placed.clone());
    let mut own = OwnCheck {
        job_ooms: job.ooms.len() as u64,
        ..OwnCheck::default()
    };
    own.take(check.at(0, &replay.stats()));
    for (i, req) in job.requests.iter().enumerate() {
        let r = replay.step(req, &mut NullSink);
        own.replay_ooms = r.ooms;
        own.take(check.at(i + 1, &replay.stats()));
        if let Some(s) = job.recorded.get(i).copied().flatten() {
            let sim = Stats {
                allocated: r.allocated,
                reserved: r.reserved,
                segments: r.segments,
                ..Stats::default()
            };
            own.see(&samples::differences(&samples::TIME_FIGURES, &sim, &s), &s);
        }
    }
    own
}

/// Sets each outcome's change against the job's own (the one marked
/// `own`), sorts them best first and gives the recommendation's index:
/// the first, when it is usable and beats the job's own setting.
pub(crate) fn rank(outcomes: &mut [Outcome]) -> Option<usize> {
    let own_peak = outcomes
        .iter()
        .find(|o| o.candidate.own)
        .map_or(0, |o| o.totals.reserved_peak.hi);
    for o in outcomes.iter_mut() {
        o.peak_change = o.totals.reserved_peak.hi as i64 - own_peak as i64;
    }
    outcomes.sort_by_key(|o| {
        (
            o.candidate.unusable.is_some(),
            o.totals.ooms.hi,
            o.totals.reserved_peak.hi,
            o.totals.reserved_now.hi,
            !o.candidate.own,
        )
    });
    let own_at = outcomes.iter().position(|o| o.candidate.own);
    match (outcomes.first(), own_at) {
        (Some(first), Some(at)) if at > 0 && first.candidate.unusable.is_none() => {
            let own = &outcomes[at];
            let (p, q) = (&first.totals, &own.totals);
            let fewer_ooms = p.ooms.hi < q.ooms.lo || (p.ooms.hi < q.ooms.hi && q.ooms.lo > 0);
            let saves = p.reserved_peak.hi as f64 <= q.reserved_peak.lo as f64 * (1.0 - MIN_SAVING)
                && p.ooms.hi <= q.ooms.lo;
            (fewer_ooms || saves).then_some(0)
        }
        _ => None,
    }
}

/// The advice for `job`: its own setting checked, every candidate
/// replayed (on up to `threads` threads), best first.
pub fn advise(job: &Job, threads: usize) -> Advice {
    let cands = candidates(job);
    let own = check_own(job);
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(cands.len());
    let threads = threads.clamp(1, cands.len().max(1));
    std::thread::scope(|s| {
        let chunks: Vec<Vec<(usize, &Candidate)>> = (0..threads)
            .map(|t| cands.iter().enumerate().skip(t).step_by(threads).collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(i, c)| (i, replay(job, c, c.own)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(usize, Outcome)> = handles
            .into_iter()
            .flat_map(|h| h.join().expect("a candidate's replay panicked"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        outcomes.extend(all.into_iter().map(|(_, o)| o));
    });
    let best = rank(&mut outcomes);
    Advice {
        requests: job.requests.len(),
        capacity: job.cfg.capacity,
        memory_fraction: job.cfg.memory_fraction,
        own,
        outcomes,
        best,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, size: u64) -> Request {
        Request::alloc(id, size, 0)
    }

    fn job(conf: &str, fraction: Option<f64>, requests: Vec<Request>) -> Job {
        Job {
            requests,
            conf: conf.into(),
            cfg: SimConfig {
                capacity: 1 << 30,
                alloc: AllocConf::parse(conf).unwrap(),
                memory_fraction: fraction,
                ..SimConfig::default()
            },
            torch: Some((2, 11)),
            graph_pools: false,
            ooms: Vec::new(),
            placed: Vec::new(),
            recorded: Vec::new(),
        }
    }

    fn confs(j: &Job) -> Vec<String> {
        candidates(j).into_iter().map(|c| c.conf).collect()
    }

    /// Sizes 30, 40, …, 120 MiB: the median is 70 MiB, the 90th percentile
    /// 110; each value is above its size, in whole MiB.
    #[test]
    fn max_split_values_come_from_the_jobs_large_requests() {
        let reqs = (3..=12).map(|k| alloc(k, k * 10 * MIB)).collect();
        let c = confs(&job("", None, reqs));
        assert!(c.contains(&"max_split_size_mb:71".to_string()), "{c:?}");
        assert!(c.contains(&"max_split_size_mb:111".to_string()), "{c:?}");
        // Small requests only: no max_split_size_mb to try.
        let small = confs(&job("", None, vec![alloc(1, 4096)]));
        assert!(small.iter().all(|c| !c.contains("max_split")), "{small:?}");
    }

    /// A job that has expandable segments is not told to turn them on
    /// (pytorch/pytorch#173049), and its other options are kept.
    #[test]
    fn candidates_keep_the_jobs_options_and_never_repeat_them() {
        let j = job(
            "expandable_segments:True,max_split_size_mb:64",
            None,
            vec![alloc(1, 50 * MIB)],
        );
        let all = candidates(&j);
        assert!(all[0].own);
        let c: Vec<&str> = all[1..].iter().map(|c| c.conf.as_str()).collect();
        assert!(!c.contains(&"expandable_segments:True"), "{c:?}");
        assert!(
            c.iter().all(|c| c.starts_with("expandable_segments:True")),
            "{c:?}"
        );
        assert!(
            c.contains(&"expandable_segments:True,max_split_size_mb:64,roundup_power2_divisions:4"),
            "{c:?}"
        );
        // Without a memory fraction, garbage collection does nothing: not tried.
        assert!(c.iter().all(|c| !c.contains("garbage")), "{c:?}");
        let with = confs(&job("", Some(0.5), vec![alloc(1, 50 * MIB)]));
        assert!(with.contains(&"garbage_collection_threshold:0.6".to_string()));
        assert!(
            with.contains(&"expandable_segments:True,garbage_collection_threshold:0.6".to_string())
        );
    }

    #[test]
    fn a_candidate_the_job_cannot_use_is_marked_and_never_recommended() {
        // Fragmentation expandable segments would remove.
        let mut reqs = Vec::new();
        for i in 0..40u64 {
            reqs.push(alloc(2 * i, (12 + i % 7) * MIB));
            reqs.push(alloc(2 * i + 1, 3 * MIB));
            reqs.push(Request::Free { id: 2 * i });
        }
        let mut j = job("", None, reqs);
        let free = advise(&j, 2);
        let es = |a: &Advice| {
            a.outcomes
                .iter()
                .find(|o| o.candidate.conf == "expandable_segments:True")
                .cloned()
                .unwrap()
        };
        assert!(es(&free).candidate.unusable.is_none());
        assert_eq!(
            free.recommendation().unwrap().candidate.conf,
            "expandable_segments:True"
        );
        j.graph_pools = true;
        let graphs = advise(&j, 2);
        assert!(es(&graphs)
            .candidate
            .unusable
            .unwrap()
            .contains("CUDA-graph"));
        assert!(graphs
            .recommendation()
            .is_none_or(|o| !o.candidate.conf.contains("expandable")));
        // A torch before 2.1 knows neither expandable segments nor the
        // list form of roundup_power2_divisions.
        j.graph_pools = false;
        j.torch = Some((2, 0));
        let old = advise(&j, 1);
        for o in &old.outcomes {
            let c = &o.candidate.conf;
            let marked = o.candidate.unusable.is_some();
            assert_eq!(marked, c.contains("expandable") || c.contains('['), "{c}");
        }
    }

    #[test]
    fn torch_versions_are_read_from_the_framework_string() {
        assert_eq!(torch_version("torch 2.11.0+cu130"), Some((2, 11)));
        assert_eq!(torch_version("torch 2.1.0a0+git1234"), Some((2, 1)));
        assert_eq!(torch_version("torch 1.13.1"), Some((1, 13)));
        assert_eq!(torch_version("jax 0.4"), None);
        assert_eq!(torch_version("torch x"), None);
    }

    /// The job ran out at its third request; the candidate that serves it
    /// says the OOM is avoided, and the own replay reproduces the OOM.
    #[test]
    fn an_oom_the_job_hit_is_avoided_or_not_per_candidate() {
        let reqs = vec![
            alloc(1, 300 * MIB),
            Request::Free { id: 1 },
            alloc(2, 310 * MIB),
            Request::Free { id: 2 },
        ];
        // 0.5 GiB allowed: the cached 300 MiB segment is released and the
        // 310 MiB one fits (a retry, no OOM) under every setting; at 0.3 GiB
        // (307 MiB) nothing serves 310 MiB.
        let mut j = job("", Some(0.3), reqs);
        j.ooms = vec![2];
        let a = advise(&j, 1);
        assert_eq!(a.own.replay_ooms, 1);
        assert!(a.own.reproduces());
        for o in &a.outcomes {
            assert_eq!(
                o.job_ooms,
                vec![(2, OomFate::Fails)],
                "{}",
                o.candidate.conf
            );
        }
        j.cfg.memory_fraction = Some(0.5);
        let a = advise(&j, 1);
        assert!(!a.own.reproduces(), "the job's OOM is not in the replay");
        for o in &a.outcomes {
            assert_eq!(
                o.job_ooms,
                vec![(2, OomFate::Avoided)],
                "{}",
                o.candidate.conf
            );
        }
    }

    #[test]
    fn options_split_at_commas_outside_brackets() {
        assert_eq!(
            options("max_split_size_mb:64, roundup_power2_divisions:[256:1,>:8],expandable_segments:True"),
            vec![
                ("max_split_size_mb".to_string(), "64".to_string()),
                ("roundup_power2_divisions".to_string(), "[256:1,>:8]".to_string()),
                ("expandable_segments".to_string(), "True".to_string()),
            ]
        );
        assert_eq!(
            with_options(
                "max_split_size_mb:64",
                &[("max_split_size_mb", "80".into())]
            ),
            "max_split_size_mb:80"
        );
        assert!(options("").is_empty());
    }
}
