//! The advisor's answer as text: the table `vramscope advise` prints, the
//! verdict under it, and the one-line summaries the live views show.

use std::borrow::Cow;

use super::advise::{Advice, OomFate, Outcome};
use super::live::{Coverage, LiveAdvice};
use super::spread::Range;
use vramscope_text::format::{bytes, percent};
use vramscope_text::printable;

/// The environment line a user copies (printable: a setting may be the
/// job's own text).
pub fn env_line(conf: &str) -> String {
    format!("PYTORCH_CUDA_ALLOC_CONF={}", printable(conf))
}

/// A setting as shown: `(defaults)` for none, else its text made
/// printable (a job's own text is the job's: issue 44, item 5).
pub fn shown(conf: &str) -> Cow<'_, str> {
    if conf.is_empty() {
        Cow::Borrowed("(defaults)")
    } else if printable(conf) == conf {
        Cow::Borrowed(conf)
    } else {
        Cow::Owned(printable(conf))
    }
}

/// What the job's own replay says of the recording.
pub fn own_line(a: &Advice, conf: &str) -> String {
    let o = &a.own;
    let samples = if o.compared == 0 {
        "the recording has no statistics samples to compare with".to_string()
    } else {
        format!(
            "{} of {} recorded statistics samples match",
            o.matching, o.compared
        )
    };
    let mut s = format!(
        "the job's own setting {} replayed: {samples}; OOMs {} (the job: {})\n",
        shown(conf),
        o.replay_ooms,
        o.job_ooms
    );
    if !o.reproduces() {
        s.push_str(&format!(
            "warning: the replay does not reproduce the job{}: pass the setting it ran with (--conf, --fraction, --capacity-gib); the figures below are relative to the replay\n",
            o.first_difference
                .as_deref()
                .map(|d| format!(" (first difference: {d})"))
                .unwrap_or_default()
        ));
    }
    s
}

/// A figure over the placements: one value, or "A to B" where a tie
/// between equal free blocks decides.
pub fn range_bytes(r: Range) -> String {
    if r.is_spread() {
        format!("{} to {}", bytes(r.lo), bytes(r.hi))
    } else {
        bytes(r.lo)
    }
}

/// A count over the placements, as [`range_bytes`].
pub fn range_count(r: Range) -> String {
    if r.is_spread() {
        format!("{} to {}", r.lo, r.hi)
    } else {
        r.lo.to_string()
    }
}

/// A change of bytes: `-1.00 GiB`, `+2.00 MiB`, `same`.
pub fn signed_bytes(d: i64) -> String {
    match d.cmp(&0) {
        std::cmp::Ordering::Less => format!("-{}", bytes(d.unsigned_abs())),
        std::cmp::Ordering::Equal => "same".into(),
        std::cmp::Ordering::Greater => format!("+{}", bytes(d as u64)),
    }
}

/// The job's OOMs under a candidate: "avoided 1 of 1", "fail", …
fn fates(o: &Outcome) -> String {
    if o.job_ooms.is_empty() {
        return "—".into();
    }
    let n = o.job_ooms.len();
    let count = |f: OomFate| o.job_ooms.iter().filter(|(_, x)| *x == f).count();
    let (avoided, depends) = (count(OomFate::Avoided), count(OomFate::Depends));
    let mut s = format!("avoids {avoided} of {n}");
    if depends > 0 {
        s.push_str(&format!(" ({depends} by placement)"));
    }
    s
}

pub fn table(a: &Advice) -> String {
    let w = a
        .outcomes
        .iter()
        .map(|o| shown(&o.candidate.conf).chars().count() + if o.candidate.own { 6 } else { 0 })
        .max()
        .unwrap_or(0)
        .max("PYTORCH_CUDA_ALLOC_CONF".len());
    let mut s = format!(
        "{:>3}  {:<w$} {:>22} {:>11} {:>22} {:>22} {:>7} {:>6}  {}\n",
        "#",
        "PYTORCH_CUDA_ALLOC_CONF",
        "peak reserved",
        "vs own",
        "reserved at end",
        "split at end",
        "retries",
        "OOMs",
        "job's OOMs"
    );
    for (i, o) in a.outcomes.iter().enumerate() {
        let c = &o.candidate;
        let mut name = shown(&c.conf).to_string();
        if c.own {
            name.push_str(" (own)");
        }
        s.push_str(&format!(
            "{:>3}  {:<w$} {:>22} {:>11} {:>22} {:>22} {:>7} {:>6}  {}\n",
            if c.unusable.is_some() {
                "-".to_string()
            } else {
                (i + 1).to_string()
            },
            name,
            range_bytes(o.totals.reserved_peak),
            signed_bytes(o.peak_change),
            range_bytes(o.totals.reserved_now),
            range_bytes(o.totals.inactive_split_now),
            range_count(o.totals.alloc_retries),
            range_count(o.totals.ooms),
            fates(o),
        ));
        if let Some(why) = &c.unusable {
            s.push_str(&format!("     not usable: {why}\n"));
        }
    }
    s
}

/// The last lines: what to do.
pub fn verdict(a: &Advice) -> String {
    let ties = a.outcomes.iter().any(|o| o.tied_steps > 0);
    let mut s = String::new();
    match a.recommendation() {
        Some(best) => {
            let own = a.outcomes.iter().find(|o| o.candidate.own);
            let own_peak = own.map_or(0, |o| o.totals.reserved_peak.hi);
            let saving = own_peak.saturating_sub(best.totals.reserved_peak.hi);
            s.push_str(&format!(
                "recommended: {}\n",
                env_line(&best.candidate.conf)
            ));
            s.push_str(&format!(
                "  peak reserved {} instead of {} ({}{}){}\n",
                range_bytes(best.totals.reserved_peak),
                bytes(own_peak),
                if saving > 0 { "saves " } else { "" },
                if saving > 0 {
                    format!(
                        "{}, {}",
                        bytes(saving),
                        percent(saving as f64 / own_peak.max(1) as f64)
                    )
                } else {
                    "no more memory, fewer out-of-memory errors".into()
                },
                if best.job_ooms.is_empty() {
                    String::new()
                } else {
                    format!("; the job's OOMs: {}", fates(best))
                }
            ));
        }
        None => s.push_str(
            "recommended: keep the job's own setting (no usable candidate does better)\n",
        ),
    }
    if ties {
        s.push_str(&format!(
            "segments go where the driver's address space would put them; \"A to B\" is the range over {} placements where a tie between equal free blocks decides\n",
            super::spread::BESIDE + 1
        ));
    }
    s
}

/// What the live advice covers, in one line.
pub fn coverage_line(c: &Coverage) -> String {
    let steps = match (c.first_step, c.last_step) {
        (Some(a), Some(b)) if a != b => format!(", steps {a} to {b}"),
        (Some(a), _) => format!(", step {a}"),
        _ => String::new(),
    };
    let held = format!(
        "the {} tensor{} held then, {}, placed afresh under each setting",
        c.held,
        if c.held == 1 { "" } else { "s" },
        bytes(c.held_bytes)
    );
    let from = match (c.run, c.from_start) {
        (None, true) => "from the job's start".to_string(),
        (None, false) => format!("from when the advisor began ({held})"),
        (Some(n), true) => format!("from the start of the job's run {n}"),
        (Some(n), false) => format!("from the start of the job's run {n} ({held})"),
    };
    let mut s = format!("{} requests {from}{steps}", c.requests);
    if c.unknown_frees > 0 {
        s.push_str(&format!(
            "; {} frees of tensors never seen allocated",
            c.unknown_frees
        ));
    }
    if c.unseen_frees > 0 {
        s.push_str(&format!(
            "; {} tensors let go of without a free seen",
            c.unseen_frees
        ));
    }
    if let Some(why) = &c.stopped {
        s.push_str(&format!("; stopped there: {why}"));
    }
    if let Some(n) = &c.note {
        s.push_str(&format!("; {n}"));
    }
    // Why it stopped and its note may quote the job's setting.
    printable(&s)
}

/// The live advice in one line: the recommendation and its saving, or
/// why there is none yet.
pub fn summary(a: &LiveAdvice) -> String {
    let Some(advice) = &a.advice else {
        return match &a.coverage.stopped {
            Some(why) => format!("no advice: {}", printable(why)),
            None => format!(
                "choosing the candidates ({} requests seen)",
                a.coverage.requests
            ),
        };
    };
    match a.best() {
        Some((best, saving)) => {
            let own = advice.outcomes.iter().find(|o| o.candidate.own);
            let own_peak = own.map_or(0, |o| o.totals.reserved_peak.hi).max(1);
            let own_ooms = own.map_or(0, |o| o.totals.ooms.hi);
            let what = if saving > 0 {
                format!(
                    "saves {} ({}) of peak reserved",
                    bytes(saving as u64),
                    percent(saving as f64 / own_peak as f64)
                )
            } else {
                format!(
                    "{} OOMs instead of {}, peak reserved {}",
                    best.totals.ooms.hi,
                    own_ooms,
                    signed_bytes(-saving)
                )
            };
            format!("{}: {what}", env_line(&best.candidate.conf))
        }
        None => "keep the job's own setting (no candidate does better)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the advice starts, as said for each way the advisor began: at
    /// the job's start, mid-run, or at the start of a later run.
    #[test]
    fn coverage_says_where_the_advice_starts() {
        let at = |run, from_start| {
            coverage_line(&Coverage {
                requests: 10,
                first_step: Some(3),
                last_step: Some(7),
                from_start,
                run,
                held: 2,
                held_bytes: 4 << 20,
                ..Coverage::default()
            })
        };
        assert_eq!(
            at(None, true),
            "10 requests from the job's start, steps 3 to 7"
        );
        let mid = at(None, false);
        assert!(
            mid.starts_with(
                "10 requests from when the advisor began (the 2 tensors held then, 4.00 MiB"
            ),
            "{mid}"
        );
        assert!(at(Some(2), true).contains("from the start of the job's run 2, steps 3 to 7"));
        assert!(at(Some(2), false).contains("run 2 (the 2 tensors held then"));
    }
}
