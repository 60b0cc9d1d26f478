//! The simulator against real PyTorch on randomized traces (issue 16): the
//! corpus `tests/gpu/sim_diff.py` recorded on a GPU (committed under
//! `tests/fixtures/sim/diff/`, one gzip'd file per allocator setting) is
//! replayed request by request, with the real segment addresses and with the
//! simulator's own (the driver's address space modelled,
//! `sim::placement::VaRegions`), and the six `memory_stats()` figures
//! compared after each.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use vramscope_core::sim::diff::{percent, replay, Addresses, Report};

fn corpus() -> Vec<PathBuf> {
    // SIM_DIFF_DIR: another corpus (e.g. one recorded with SIM_DIFF_SALT).
    let dir = std::env::var_os("SIM_DIFF_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sim/diff"),
        PathBuf::from,
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

fn run(path: &Path, addresses: Addresses) -> Report {
    let f = std::fs::File::open(path).unwrap();
    replay(BufReader::new(GzDecoder::new(f)), addresses)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn print(r: &Report) {
    println!(
        "{:<20} {:>6} {:>8} {:>8.2}% ({} differ) {:>8} ({:.2}% match, {:.2}% in range) all {:.2}% addresses {:.2}% segments {}/{}  [{}{}]",
        r.setting,
        r.traces,
        r.requests,
        r.share(),
        r.compared - r.matching,
        r.after_tie,
        percent(r.after_tie_matching, r.after_tie),
        percent(r.after_tie_in_range, r.after_tie),
        percent(r.matching + r.after_tie_matching, r.requests),
        percent(r.addresses_matching, r.allocs),
        r.segments_matching,
        r.traces - r.dirty,
        r.conf,
        r.fraction
            .map(|f| format!(", fraction {f}"))
            .unwrap_or_default(),
    );
    for d in r.divergences.iter().take(3) {
        println!(
            "    trace {} step {} ({}): {} simulated {} real {}{}",
            d.trace,
            d.step,
            d.request,
            d.figure,
            d.simulated,
            d.real,
            if d.after_tie { " (after a tie)" } else { "" }
        );
    }
    if r.divergences.len() > 3 {
        println!("    ... {} diverging traces", r.divergences.len());
    }
}

#[test]
fn simulator_matches_pytorch_on_random_traces() {
    let files = corpus();
    if files.is_empty() {
        println!("SKIPPED: no corpus under tests/fixtures/sim/diff (record it with tests/gpu/sim_diff.py on a GPU)");
        return;
    }
    let mut failures = Vec::new();
    for addresses in [Addresses::Real, Addresses::Own, Addresses::Ascending] {
        println!("addresses: {addresses:?}");
        println!("setting              traces requests  matching after-tie");
        for f in &files {
            let r = run(f, addresses);
            print(&r);
            assert!(r.traces > 0 && r.requests > 0, "{}: no traces", f.display());
            assert_eq!(
                r.dirty,
                0,
                "{}: traces that did not start empty",
                f.display()
            );
            // Every step matches on all six figures with the real addresses;
            // with the simulator's own, all but a few not found to be
            // decided by a tie (by the address orders the replay tries: two
            // traces' choices none of them reproduced, 0.08% of rp2's steps).
            // The ascending order is the baseline the driver's is measured
            // against (printed, not held to a share).
            let enough = match addresses {
                Addresses::Real => r.matching == r.compared,
                Addresses::Own => r.matching * 1000 >= r.compared * 999,
                Addresses::Ascending => true,
            };
            // Placement without addresses (issue 48): with the driver's
            // address space modelled, the share of all steps (ties and all)
            // whose six figures equal PyTorch's, per setting: at least
            // 99.5 % on the committed corpus (its lowest: 99.65 %; 94–98 %
            // with the order the simulator assumed before), and the
            // issue's 97 % on any other (SIM_DIFF_DIR).
            let floor = if std::env::var_os("SIM_DIFF_DIR").is_some() {
                97.0
            } else {
                99.5
            };
            let all = percent(r.matching + r.after_tie_matching, r.requests);
            if addresses == Addresses::Own && all < floor {
                failures.push(format!(
                    "{} (own addresses): {all:.2}% of all steps match, under {floor}%",
                    r.setting
                ));
            }
            if !enough {
                failures.push(format!(
                    "{} ({addresses:?}): {:.3}% of steps match",
                    r.setting,
                    r.share()
                ));
            }
            // With the real addresses nothing is decided by a tie: every
            // request gets its real address, and the segments at the end are
            // the real ones.
            if addresses == Addresses::Real
                && (r.after_tie > 0
                    || r.addresses_matching != r.allocs
                    || r.segments_matching != r.traces
                    || !r.divergences.is_empty())
            {
                failures.push(format!("{} (real addresses): diverges", r.setting));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
