//! `vramscope diff A B`: two runs compared (recordings made by `vramscope
//! record`, or PyTorch snapshot files): peak and steady-state allocated and
//! reserved, the live memory at each run's peak by phase, role and module,
//! what is new in B or grew, and the step at which the runs part
//! (`vramscope_core::model::rundiff`). With `--fail-over PCT` it is a CI gate:
//! exit status 3 when B's peak reserved exceeds A's by more than PCT % (or
//! A's is 0 B and B's is not: growth from nothing exceeds any percentage).
use std::path::{Path, PathBuf};

use anyhow::Result;

use vramscope_collect::given::Given;
use vramscope_core::model::rundiff::{compare, Diff, Profile, Row};
use vramscope_core::recording::census;
use vramscope_text::format::{bytes, percent};

use super::out;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The run compared against: a recording or a PyTorch snapshot file.
    a: PathBuf,
    /// The run compared.
    b: PathBuf,
    /// The process of A, by its host pid or the pid it sees itself as in
    /// its container (default: the one with the most allocator events).
    #[arg(long, value_name = "PID")]
    pid_a: Option<u32>,
    /// The process of B (as --pid-a).
    #[arg(long, value_name = "PID")]
    pid_b: Option<u32>,
    /// The comparison as one JSON object.
    #[arg(long)]
    json: bool,
    /// Exit with status 3 when B's peak reserved exceeds A's by more than
    /// PCT percent (0 to 1000000). Against an A of 0 B, any B above 0 B
    /// fails (growth from nothing exceeds every percentage).
    #[arg(long, value_name = "PCT", allow_negative_numbers = true)]
    fail_over: Option<super::value::Percent>,
    /// Module rows shown (largest changes first; 0: all).
    #[arg(long, default_value_t = 15)]
    top: usize,
}

/// Exit status when `--fail-over` trips.
pub(crate) const FAIL_OVER_EXIT: u8 = 3;

/// The profile of one run.
fn of(path: &Path, pid: Option<u32>) -> Result<Profile> {
    Given::open(path)?.profile(pid).map_err(anyhow::Error::msg)
}

pub(crate) fn run(args: Args) -> Result<()> {
    let a = of(&args.a, args.pid_a)?;
    let b = of(&args.b, args.pid_b)?;
    let d = compare(&a, &b);
    if args.json {
        out::print(&format!("{}\n", serde_json::to_value(&d)?))?;
    } else {
        out::print(&text(&d, args.top))?;
    }
    let Some(limit) = args.fail_over else {
        return Ok(());
    };
    let (a, b) = (d.figures[1].a, d.figures[1].b);
    // Growth from nothing exceeds any percentage.
    if a == 0 && b > 0 {
        vramscope_text::stderr_line(format_args!(
            "vramscope: B's peak reserved is {} and A's is 0 B: growth from nothing is more than any --fail-over ({}%)",
            bytes(b),
            limit.get()
        ));
        return Err(super::common::ExitStatus(FAIL_OVER_EXIT).into());
    }
    if let Some(change) = d.peak_reserved_change {
        if change * 100.0 > limit.get() {
            vramscope_text::stderr_line(format_args!(
                "vramscope: B's peak reserved is {} above A's ({} against {}), more than --fail-over {}%",
                percent(change),
                bytes(d.figures[1].b),
                bytes(d.figures[1].a),
                limit.get()
            ));
            return Err(super::common::ExitStatus(FAIL_OVER_EXIT).into());
        }
    }
    Ok(())
}

fn change(r: &Row) -> String {
    let c = r.change();
    let sign = if c < 0 { "-" } else { "+" };
    let abs = bytes(c.unsigned_abs());
    match (c, r.share()) {
        (0, _) => "same".into(),
        // A change that rounds to 0.0 % is not "-0.0%".
        (_, Some(s)) if s.abs() < 0.0005 => format!("{sign}{abs} (under 0.1%)"),
        (_, Some(s)) => format!("{sign}{abs} ({sign}{})", percent(s.abs())),
        (_, None) => format!("{sign}{abs} (new)"),
    }
}

fn table(title: &str, rows: &[Row], top: usize) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let w = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(title.len());
    let mut s = format!("{title:<w$}  {:>10}  {:>10}  B - A\n", "A", "B");
    let shown = if top == 0 { rows.len() } else { top };
    for r in rows.iter().take(shown) {
        s.push_str(&format!(
            "{:<w$}  {:>10}  {:>10}  {}\n",
            vramscope_text::printable(&r.name),
            bytes(r.a),
            bytes(r.b),
            change(r)
        ));
    }
    if rows.len() > shown {
        s.push_str(&format!(
            "… {} more (--top 0 shows all)\n",
            rows.len() - shown
        ));
    }
    s.push('\n');
    s
}

fn text(d: &Diff, top: usize) -> String {
    let mut s = String::new();
    for (tag, run) in [("A", &d.a), ("B", &d.b)] {
        s.push_str(&format!(
            "{tag}: {} ({}{}), {} steps{}\n",
            vramscope_text::printable(&run.name),
            census::name(run.pid, run.ns_pid),
            if run.cmdline.is_empty() {
                String::new()
            } else {
                format!(": {}", vramscope_text::printable(&run.cmdline))
            },
            run.steps,
            run.peak_step
                .map(|k| format!(", peak allocated in step {k}"))
                .unwrap_or_default()
        ));
    }
    s.push('\n');
    s.push_str(&table("", &d.figures, 0));
    match &d.parted_at {
        Some(p) => s.push_str(&format!(
            "the runs part at step {}: {} {} in A, {} in B\n\n",
            p.step,
            p.figure,
            bytes(p.a),
            bytes(p.b)
        )),
        None if d.a.steps > 0 && d.b.steps > 0 => s.push_str(
            "the runs do not part: every step common to both is the same within 1 MiB or 1 %\n\n",
        ),
        None => s.push_str("no step markers in both runs: the steps cannot be compared\n\n"),
    }
    s.push_str("at each run's peak allocated:\n");
    s.push_str(&table("phase", &d.by_phase, 0));
    s.push_str(&table("role", &d.by_role, 0));
    s.push_str(&table("module", &d.by_module, top));
    s.push_str(&table("new in B", &d.new_in_b, top));
    s.push_str(&table("grew in B", &d.grew_in_b, top));
    s.push_str(&table("less in B", &d.shrank_in_b, top));
    if !d.outside.is_empty() {
        s.push_str("outside PyTorch's allocator, at each run's end:\n");
        s.push_str(&table("outside", &d.outside, 0));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46, item 21: a change too small for a tenth of a percent is
    /// "under 0.1%", never "-0.0%".
    #[test]
    fn a_tiny_change_is_under_a_tenth_of_a_percent() {
        let row = |a: u64, b: u64| Row {
            name: "model".into(),
            a,
            b,
        };
        assert_eq!(
            change(&row(1 << 30, (1 << 30) - 12 * 1024)),
            "-12.0 KiB (under 0.1%)"
        );
        assert_eq!(
            change(&row(1 << 30, (1 << 30) + 12 * 1024)),
            "+12.0 KiB (under 0.1%)"
        );
        assert_eq!(change(&row(100 << 20, 90 << 20)), "-10.0 MiB (-10%)");
        assert_eq!(change(&row(0, 1 << 20)), "+1.00 MiB (new)");
        assert_eq!(change(&row(5, 5)), "same");
    }
}
