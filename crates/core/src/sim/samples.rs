//! A replay compared with the statistics samples a recorded process took.
//!
//! A sample placed by ring positions ([`PlacedSample`]) is compared after
//! exactly the requests it reflects, on every figure PyTorch and the
//! simulator both keep ([`FIGURES`]). One whose window leaves several
//! candidate places is compared when the replay's figures are the same at
//! every one of them, and is *ambiguous* otherwise (not compared). A sample
//! without a position is placed by time and compared on allocated,
//! reserved and segments ([`TIME_FIGURES`]), as before positions existed.
//! Differences are given in exact bytes.

use std::collections::VecDeque;
use std::fmt::Write as _;

use serde::Serialize;

use super::from_events::PlacedSample;
use vramscope_text::format::{bytes_exact, grouped};
use vramscope_wire::event::Stats;

/// A figure of a sample: its name, whether it is bytes, and its value.
type Figure = (&'static str, bool, fn(&Stats) -> u64);

/// The figures a placed sample is compared on.
pub(crate) const FIGURES: [Figure; 6] = [
    ("allocated", true, |s| s.allocated),
    ("reserved", true, |s| s.reserved),
    ("segments", false, |s| s.segments),
    ("inactive split", true, |s| s.inactive_split),
    ("retries", false, |s| s.alloc_retries),
    ("OOMs", false, |s| s.ooms),
];

/// The figures a sample placed by time is compared on.
pub const TIME_FIGURES: [Figure; 3] = [FIGURES[0], FIGURES[1], FIGURES[2]];

/// The names of `figures`, for a report: `allocated, reserved, segments`.
pub fn names(figures: &[Figure]) -> String {
    figures.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
}

/// One figure that differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub(crate) figure: &'static str,
    pub(crate) simulated: u64,
    pub(crate) recorded: u64,
    #[serde(skip)]
    is_bytes: bool,
}

impl Difference {
    /// `reserved 6,903,824,384 simulated vs 6,903,824,896 recorded (+512 B)`:
    /// exact values; the bracket is recorded minus simulated.
    pub(crate) fn describe(&self) -> String {
        let (s, r) = (self.simulated, self.recorded);
        let sign = if r >= s { '+' } else { '-' };
        let gap = r.abs_diff(s);
        if self.is_bytes {
            format!(
                "{} {} simulated vs {} recorded ({sign}{})",
                self.figure,
                grouped(s),
                grouped(r),
                bytes_exact(gap)
            )
        } else {
            format!(
                "{} {} simulated vs {} recorded ({sign}{})",
                self.figure,
                grouped(s),
                grouped(r),
                grouped(gap)
            )
        }
    }
}

/// The figures of `figures` in which `simulated` and `recorded` differ.
pub fn differences(figures: &[Figure], simulated: &Stats, recorded: &Stats) -> Vec<Difference> {
    figures
        .iter()
        .filter(|(_, _, f)| f(simulated) != f(recorded))
        .map(|&(figure, is_bytes, f)| Difference {
            figure,
            simulated: f(simulated),
            recorded: f(recorded),
            is_bytes,
        })
        .collect()
}

/// All of `diffs` described, `; ` between them.
pub fn describe_all(diffs: &[Difference]) -> String {
    diffs
        .iter()
        .map(Difference::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the comparison of one placed sample found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// Every compared figure is the same.
    Matches,
    /// These figures differ.
    Differs(Vec<Difference>),
    /// The replay's figures change inside the sample's window: not compared.
    Ambiguous,
}

/// A placed sample, checked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Checked {
    /// The sample reflects the first `k` requests, `k` in this range.
    pub(crate) after_requests: (usize, usize),
    pub(crate) recorded: Stats,
    pub(crate) verdict: Verdict,
}

/// A placed sample whose window the replay is inside.
struct Open {
    sample: PlacedSample,
    /// The replay's figures at the window's start.
    first: Stats,
    /// They were the same at every place of the window so far.
    same: bool,
}

/// Checks placed samples as a replay goes: give it the replay's statistics
/// after 0, 1, 2, … requests.
pub struct SampleCheck {
    /// Samples whose window has not begun, by window start.
    waiting: VecDeque<PlacedSample>,
    open: Vec<Open>,
}

impl SampleCheck {
    pub fn new(mut placed: Vec<PlacedSample>) -> Self {
        placed.sort_by_key(|p| p.from);
        SampleCheck {
            waiting: placed.into(),
            open: Vec::new(),
        }
    }

    /// The replay's statistics after `k` requests (`k` = 0, 1, 2, … in
    /// turn); returns the samples whose window ends at `k`.
    pub fn at(&mut self, k: usize, sim: &Stats) -> Vec<Checked> {
        while self.waiting.front().is_some_and(|p| p.from <= k) {
            if let Some(sample) = self.waiting.pop_front() {
                self.open.push(Open {
                    sample,
                    first: *sim,
                    same: true,
                });
            }
        }
        let mut done = Vec::new();
        self.open.retain_mut(|o| {
            o.same &= differences(&FIGURES, &o.first, sim).is_empty();
            if o.sample.to > k {
                return true;
            }
            let diffs = differences(&FIGURES, &o.first, &o.sample.stats);
            done.push(Checked {
                after_requests: (o.sample.from, o.sample.to),
                recorded: o.sample.stats,
                verdict: if !o.same {
                    Verdict::Ambiguous
                } else if diffs.is_empty() {
                    Verdict::Matches
                } else {
                    Verdict::Differs(diffs)
                },
            });
            false
        });
        done
    }
}

/// Counts of placed samples checked, and the first that differed.
#[derive(Debug, Default)]
pub struct PlacedSummary {
    pub compared: u64,
    pub(crate) matched: u64,
    pub ambiguous: u64,
    /// The first sample that differed: the requests it reflects, and how.
    pub(crate) first_diff: Option<(usize, Vec<Difference>)>,
}

impl PlacedSummary {
    pub fn add(&mut self, c: &Checked) {
        match &c.verdict {
            Verdict::Ambiguous => self.ambiguous += 1,
            Verdict::Matches => {
                self.compared += 1;
                self.matched += 1;
            }
            Verdict::Differs(d) => {
                self.compared += 1;
                if self.first_diff.is_none() {
                    self.first_diff = Some((c.after_requests.0, d.clone()));
                }
            }
        }
    }

    /// The report's lines about placed samples (none when there were none).
    pub fn lines(&self, under: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.compared + self.ambiguous == 0 {
            return out;
        }
        out.push(format!(
            "under {under}: {} of {} exactly placed statistics samples match the replay ({})",
            self.matched,
            self.compared,
            names(&FIGURES)
        ));
        if self.ambiguous > 0 {
            out.push(format!(
                "{} samples in an ambiguous window (the replay's figures change inside it): not compared",
                self.ambiguous
            ));
        }
        if let Some((k, d)) = &self.first_diff {
            let mut line = String::from("first difference of an exactly placed sample, ");
            match k.checked_sub(1) {
                Some(i) => {
                    let _ = write!(line, "after request {i}: ");
                }
                None => line.push_str("before the first request: "),
            }
            line.push_str(&describe_all(d));
            out.push(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_wire::event::RingSpan;

    fn stats(allocated: u64, reserved: u64) -> Stats {
        Stats {
            allocated,
            reserved,
            ..Stats::default()
        }
    }

    fn sample(from: usize, to: usize, s: Stats) -> PlacedSample {
        PlacedSample {
            stats: s,
            from,
            to,
            at: RingSpan {
                ring: 1,
                before: 0,
                after: 0,
                exact: from == to,
                ambiguous: from != to,
            },
        }
    }

    /// Runs a check over the replay's figures after 0, 1, … requests.
    fn run(placed: Vec<PlacedSample>, replay: &[Stats]) -> Vec<Checked> {
        let mut c = SampleCheck::new(placed);
        (0..replay.len())
            .flat_map(|k| c.at(k, &replay[k]))
            .collect()
    }

    #[test]
    fn exact_samples_compare_at_their_place_and_windows_only_when_unchanged() {
        let replay = [stats(0, 0), stats(1, 2), stats(1, 2), stats(3, 4)];
        let got = run(
            vec![
                sample(2, 2, stats(1, 2)),
                sample(3, 3, stats(3, 6)),
                sample(1, 2, stats(1, 2)),
                sample(2, 3, stats(1, 2)),
                sample(0, 0, stats(0, 0)),
            ],
            &replay,
        );
        let verdicts: Vec<_> = got
            .iter()
            .map(|c| (c.after_requests, c.verdict.clone()))
            .collect();
        assert_eq!(
            verdicts,
            vec![
                ((0, 0), Verdict::Matches),
                ((1, 2), Verdict::Matches),
                ((2, 2), Verdict::Matches),
                ((2, 3), Verdict::Ambiguous),
                (
                    (3, 3),
                    Verdict::Differs(differences(&FIGURES, &stats(3, 4), &stats(3, 6)))
                ),
            ]
        );
        let mut sum = PlacedSummary::default();
        got.iter().for_each(|c| sum.add(c));
        let lines = sum.lines("the default configuration").join("\n");
        assert!(lines.contains("3 of 4 exactly placed"), "{lines}");
        assert!(
            lines.contains("1 samples in an ambiguous window"),
            "{lines}"
        );
        assert!(
            lines.contains("after request 2: reserved 4 simulated vs 6 recorded (+2 B)"),
            "{lines}"
        );
    }

    #[test]
    fn differences_are_exact_bytes_with_the_sign_of_recorded_minus_simulated() {
        let d = differences(
            &FIGURES,
            &Stats {
                reserved: 6_903_824_384,
                segments: 12,
                ..Stats::default()
            },
            &Stats {
                reserved: 6_903_824_896,
                segments: 11,
                ..Stats::default()
            },
        );
        assert_eq!(
            describe_all(&d),
            "reserved 6,903,824,384 simulated vs 6,903,824,896 recorded (+512 B); \
             segments 12 simulated vs 11 recorded (-1)"
        );
    }
}
