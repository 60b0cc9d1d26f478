//! Two runs of a job compared (`vramscope diff A B`): peak and steady-state
//! allocated and reserved, what the live blocks were at the peak by phase,
//! role and module, the modules (and module roles) that are new in B or
//! grew, and the step at which the runs part. Pure: [`Profile`]s in, a
//! [`Diff`] out (`collect::profile` makes the profiles).

use serde::Serialize;

/// One step of a run: what allocated and reserved reached within it, and
/// where they stood at its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StepFigures {
    pub step: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub end_allocated: u64,
    pub end_reserved: u64,
}

/// Live bytes at one moment, by phase, role, module and module role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub by_phase: Vec<(String, u64)>,
    pub by_role: Vec<(String, u64)>,
    pub by_module: Vec<(String, u64)>,
    /// `module / role`.
    pub by_module_role: Vec<(String, u64)>,
}

/// One run, as the comparison needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// The file, and the process in it: its host pid, and the pid it
    /// sees itself as (they differ in a container).
    pub name: String,
    pub pid: u32,
    pub ns_pid: u32,
    pub cmdline: String,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The step the allocated peak fell in (None: no step markers).
    pub peak_step: Option<u64>,
    /// The live blocks at the allocated peak.
    pub at_peak: Breakdown,
    /// The last complete step: its figures, and the live blocks at its end.
    pub steady: Option<StepFigures>,
    pub at_steady: Breakdown,
    /// Every complete step, in order (the first `MAX_STEPS`), and how many
    /// more there were.
    pub steps: Vec<StepFigures>,
    pub steps_dropped: u64,
    /// Memory outside the caching allocator at the run's end, by what
    /// holds it (context, NCCL, cuBLAS, …: `model::outside::by_what`;
    /// empty where the producer names nothing).
    pub outside: Vec<(String, u64)>,
}

/// A figure in A and in B.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub name: String,
    pub a: u64,
    pub b: u64,
}

impl Row {
    /// B − A.
    pub fn change(&self) -> i64 {
        self.b as i64 - self.a as i64
    }
    /// B − A as a share of A (None when A is 0).
    pub fn share(&self) -> Option<f64> {
        (self.a > 0).then(|| self.change() as f64 / self.a as f64)
    }
}

/// The first step where the runs differ, and on what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Parting {
    pub step: u64,
    pub figure: &'static str,
    pub a: u64,
    pub b: u64,
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diff {
    pub a: Summary,
    pub b: Summary,
    /// Peak and steady-state allocated and reserved.
    pub figures: Vec<Row>,
    /// B's peak reserved against A's (B − A over A; None when A's is 0).
    pub peak_reserved_change: Option<f64>,
    pub parted_at: Option<Parting>,
    /// At each run's allocated peak.
    pub by_phase: Vec<Row>,
    pub by_role: Vec<Row>,
    /// Modules, largest change first.
    pub by_module: Vec<Row>,
    /// Modules and module roles that hold nothing at A's peak and something
    /// at B's, and those that hold more, largest first.
    pub new_in_b: Vec<Row>,
    pub grew_in_b: Vec<Row>,
    /// Those that hold less in B, or nothing.
    pub shrank_in_b: Vec<Row>,
    /// Memory outside the caching allocator at each run's end, by what
    /// holds it (none where neither run's producer names any).
    pub outside: Vec<Row>,
}

/// What the report says of each run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub name: String,
    pub pid: u32,
    pub ns_pid: u32,
    pub cmdline: String,
    pub steps: usize,
    pub peak_step: Option<u64>,
}

/// The least difference that counts: 1 MiB, and 1 % of the larger value.
fn differs(a: u64, b: u64) -> bool {
    let gap = a.abs_diff(b);
    gap >= 1 << 20 && gap * 100 >= a.max(b)
}

/// Rows for every name in `a` or `b`, in `a`'s order then `b`'s.
/// One row per name, in `a`'s order then `b`'s new names: a name given
/// more than once on a side (two kinds of allocation outside every module
/// both shown as one) is summed, not listed twice.
fn rows(a: &[(String, u64)], b: &[(String, u64)]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    for (side, list) in [(0, a), (1, b)] {
        for (n, x) in list {
            let i = match out.iter().position(|r| &r.name == n) {
                Some(i) => i,
                None => {
                    out.push(Row {
                        name: n.clone(),
                        a: 0,
                        b: 0,
                    });
                    out.len() - 1
                }
            };
            let r = &mut out[i];
            if side == 0 {
                r.a = r.a.saturating_add(*x);
            } else {
                r.b = r.b.saturating_add(*x);
            }
        }
    }
    out
}

fn summary(p: &Profile) -> Summary {
    Summary {
        name: p.name.clone(),
        pid: p.pid,
        ns_pid: p.ns_pid,
        cmdline: p.cmdline.clone(),
        steps: p.steps.len(),
        peak_step: p.peak_step,
    }
}

/// Compares run `a` with run `b`.
pub fn compare(a: &Profile, b: &Profile) -> Diff {
    let mut figures = vec![
        Row {
            name: "peak allocated".into(),
            a: a.peak_allocated,
            b: b.peak_allocated,
        },
        Row {
            name: "peak reserved".into(),
            a: a.peak_reserved,
            b: b.peak_reserved,
        },
    ];
    if let (Some(sa), Some(sb)) = (a.steady, b.steady) {
        figures.push(Row {
            name: "steady allocated".into(),
            a: sa.end_allocated,
            b: sb.end_allocated,
        });
        figures.push(Row {
            name: "steady reserved".into(),
            a: sa.end_reserved,
            b: sb.end_reserved,
        });
    }
    let parted_at = a.steps.iter().zip(&b.steps).find_map(|(x, y)| {
        [
            (
                "peak allocated in the step",
                x.peak_allocated,
                y.peak_allocated,
            ),
            (
                "allocated at the step's end",
                x.end_allocated,
                y.end_allocated,
            ),
            (
                "peak reserved in the step",
                x.peak_reserved,
                y.peak_reserved,
            ),
        ]
        .into_iter()
        .find(|(_, p, q)| differs(*p, *q))
        .map(|(figure, p, q)| Parting {
            step: x.step,
            figure,
            a: p,
            b: q,
        })
    });
    let by_module_and_role = {
        let mut m = rows(&a.at_peak.by_module, &b.at_peak.by_module);
        m.extend(rows(&a.at_peak.by_module_role, &b.at_peak.by_module_role));
        m
    };
    let mut new_in_b: Vec<Row> = by_module_and_role
        .iter()
        .filter(|r| r.a == 0 && r.b >= 1 << 20)
        .cloned()
        .collect();
    let mut grew_in_b: Vec<Row> = by_module_and_role
        .iter()
        .filter(|r| r.a > 0 && r.b > r.a && differs(r.a, r.b))
        .cloned()
        .collect();
    let mut shrank_in_b: Vec<Row> = by_module_and_role
        .iter()
        .filter(|r| r.a > r.b && differs(r.a, r.b))
        .cloned()
        .collect();
    for v in [&mut new_in_b, &mut grew_in_b, &mut shrank_in_b] {
        v.sort_by_key(|r| std::cmp::Reverse(r.change().unsigned_abs()));
    }
    let mut by_module = rows(&a.at_peak.by_module, &b.at_peak.by_module);
    by_module.sort_by_key(|r| std::cmp::Reverse(r.change().unsigned_abs()));
    Diff {
        a: summary(a),
        b: summary(b),
        peak_reserved_change: figures[1].share(),
        figures,
        parted_at,
        by_phase: rows(&a.at_peak.by_phase, &b.at_peak.by_phase),
        by_role: rows(&a.at_peak.by_role, &b.at_peak.by_role),
        by_module,
        new_in_b,
        grew_in_b,
        shrank_in_b,
        outside: rows(&a.outside, &b.outside),
    }
}

#[cfg(test)]
mod tests {

    /// Issue 46, item 21: a name given twice on a side (two kinds of
    /// allocation outside every module, both shown as one) is one row,
    /// its bytes summed.
    #[test]
    fn a_name_given_twice_is_one_row() {
        let n = |s: &str, x: u64| (s.to_string(), x);
        let r = rows(
            &[
                n("(outside every module)", 3),
                n("model", 5),
                n("(outside every module)", 4),
            ],
            &[
                n("(outside every module)", 10),
                n("head", 1),
                n("(outside every module)", 1),
            ],
        );
        let got: Vec<(&str, u64, u64)> = r.iter().map(|r| (r.name.as_str(), r.a, r.b)).collect();
        assert_eq!(
            got,
            [
                ("(outside every module)", 7, 11),
                ("model", 5, 0),
                ("head", 0, 1)
            ]
        );
    }

    use super::*;

    const MIB: u64 = 1 << 20;

    fn step(step: u64, peak: u64, end: u64) -> StepFigures {
        StepFigures {
            step,
            peak_allocated: peak * MIB,
            peak_reserved: peak * MIB + 20 * MIB,
            end_allocated: end * MIB,
            end_reserved: peak * MIB + 20 * MIB,
        }
    }

    fn profile(steps: Vec<StepFigures>, modules: &[(&str, u64)]) -> Profile {
        let at_peak = Breakdown {
            by_module: modules
                .iter()
                .map(|(m, b)| (m.to_string(), b * MIB))
                .collect(),
            ..Breakdown::default()
        };
        Profile {
            peak_allocated: steps.iter().map(|s| s.peak_allocated).max().unwrap_or(0),
            peak_reserved: steps.iter().map(|s| s.peak_reserved).max().unwrap_or(0),
            steady: steps.last().copied(),
            at_peak,
            steps,
            ..Profile::default()
        }
    }

    #[test]
    fn runs_part_at_the_first_step_that_differs_and_new_modules_are_named() {
        let a = profile(
            vec![step(1, 100, 40), step(2, 100, 40), step(3, 100, 40)],
            &[("mlp", 30), ("attn", 10)],
        );
        // Same first step; from step 2 a new module holds 50 MiB at the peak.
        let b = profile(
            vec![step(1, 100, 40), step(2, 150, 40), step(3, 150, 40)],
            &[("mlp", 30), ("attn", 10), ("cache", 50)],
        );
        let d = compare(&a, &b);
        let p = d.parted_at.unwrap();
        assert_eq!((p.step, p.figure), (2, "peak allocated in the step"));
        assert_eq!(d.new_in_b.len(), 1);
        assert_eq!(d.new_in_b[0].name, "cache");
        assert!(d.grew_in_b.is_empty() && d.shrank_in_b.is_empty());
        assert_eq!(d.by_module[0].name, "cache");
        let share = d.peak_reserved_change.unwrap();
        assert!((share - 50.0 / 120.0).abs() < 1e-9, "{share}");
    }

    /// Issue 47: what each run held outside the caching allocator, by what
    /// holds it, side by side; nothing where neither run names any.
    #[test]
    fn outside_parts_side_by_side() {
        let a = profile(vec![step(1, 100, 40)], &[("mlp", 30)]);
        let mut b = a.clone();
        assert!(compare(&a, &b).outside.is_empty());
        b.outside = vec![("context".into(), 500 * MIB), ("NCCL".into(), 388 * MIB)];
        let mut a = a;
        a.outside = vec![("context".into(), 500 * MIB), ("cuBLAS".into(), 32 * MIB)];
        let got: Vec<(String, u64, u64)> = (compare(&a, &b).outside.into_iter())
            .map(|r| (r.name, r.a / MIB, r.b / MIB))
            .collect();
        assert_eq!(
            got,
            [
                ("context".to_string(), 500, 500),
                ("cuBLAS".to_string(), 32, 0),
                ("NCCL".to_string(), 0, 388)
            ]
        );
    }

    /// Differences under 1 MiB or 1 % are noise: the runs do not part.
    #[test]
    fn small_differences_do_not_part_the_runs() {
        let a = profile(vec![step(1, 100, 40), step(2, 100, 40)], &[("mlp", 30)]);
        let mut b = a.clone();
        b.steps[1].peak_allocated += 512 * 1024;
        b.at_peak.by_module[0].1 += 512 * 1024;
        let d = compare(&a, &b);
        assert_eq!(d.parted_at, None);
        assert!(d.grew_in_b.is_empty());
    }
}
