//! `vramscope diff` on runs recorded on an H100 (`tests/gpu/diff_record.sh`:
//! transformers GPT-2 at batch 8 under `torch.compile`, and eager at batch
//! 16), against what torch itself said of each (`NAME.truth.json`:
//! `max_memory_allocated()` and `max_memory_reserved()`), and the CI gate's
//! exit status.

mod common;

use std::path::Path;

use common::{exited_with, recording, succeeded, vramscope};
use serde_json::Value;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/diff")
}

fn truth(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.truth.json"))).unwrap())
        .unwrap()
}

fn diff(a: &str, b: &str, extra: &[&str]) -> std::process::Output {
    let (ra, rb) = (recording(&dir(), a), recording(&dir(), b));
    vramscope()
        .arg("diff")
        .arg(ra.path())
        .arg(rb.path())
        .args(extra)
        .output()
        .unwrap()
}

fn row<'a>(rows: &'a Value, name: &str) -> &'a Value {
    (rows.as_array().unwrap().iter())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows}"))
}

#[test]
fn peaks_are_torchs_own_and_the_runs_part_at_the_first_step() {
    let (a, b) = ("gpt2-b8-compiled", "gpt2-b16");
    let d: Value = serde_json::from_slice(&succeeded(diff(a, b, &["--json"])).stdout).unwrap();
    let (ta, tb) = (truth(a), truth(b));
    let peak = row(&d["figures"], "peak allocated");
    assert_eq!(peak["a"], ta["peak_allocated"]);
    assert_eq!(peak["b"], tb["peak_allocated"]);
    let reserved = row(&d["figures"], "peak reserved");
    assert_eq!(reserved["a"], ta["peak_reserved"]);
    assert_eq!(reserved["b"], tb["peak_reserved"]);
    // 29 complete steps each (30 marks), the job's own marks.
    assert_eq!(d["a"]["steps"], 29);
    assert_eq!(d["parted_at"]["step"], 1, "{}", d["parted_at"]);
    // Batch 16 holds more activations in the forward pass; the parameters
    // and the optimizer's state are the same.
    let fwd = row(&d["by_phase"], "forward");
    assert!(fwd["b"].as_u64() > fwd["a"].as_u64(), "{fwd}");
    for role in ["parameter", "optimizer_state"] {
        let r = row(&d["by_role"], role);
        assert_eq!(r["a"], r["b"], "{role}");
    }
    let act = row(&d["by_role"], "activation");
    assert!(
        act["b"].as_u64().unwrap() > 3 * act["a"].as_u64().unwrap(),
        "{act}"
    );
    // The phase rows add up to the peak (the breakdown is taken at it).
    let sum = |k: &str| -> u64 {
        (d["by_phase"].as_array().unwrap().iter())
            .map(|r| r[k].as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("a"), ta["peak_allocated"].as_u64().unwrap());
    assert_eq!(sum("b"), tb["peak_allocated"].as_u64().unwrap());
    assert!(!d["new_in_b"].as_array().unwrap().is_empty());
}

#[test]
fn fail_over_is_a_ci_gate() {
    let (a, b) = ("gpt2-b8-compiled", "gpt2-b16");
    // B's peak reserved is 165 % above A's.
    let err = exited_with(3, diff(a, b, &["--fail-over", "10"]));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("more than --fail-over 10%"), "{err}");
    succeeded(diff(a, b, &["--fail-over", "200"]));
    // A run against itself: no change, never parts, passes at 0 %.
    let same = succeeded(diff(b, b, &["--fail-over", "0", "--json"]));
    let d: Value = serde_json::from_slice(&same.stdout).unwrap();
    assert_eq!(d["parted_at"], Value::Null);
    assert_eq!(d["peak_reserved_change"], 0.0);
    // The smaller run second: a saving never trips the gate.
    succeeded(diff(b, a, &["--fail-over", "0"]));
}

#[test]
fn a_file_that_is_neither_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"not a recording and not a pickle").unwrap();
    let rec = recording(&self::dir(), "gpt2-b16");
    let out = vramscope()
        .arg("diff")
        .arg(rec.path())
        .arg(&junk)
        .output()
        .unwrap();
    let err = exited_with(1, out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("junk.bin"), "{err}");
}

/// Eager against `torch.compile` at the same batch: the compiled run's
/// peak is lower (fewer activations and temporaries kept), the parameters
/// the same; the gate trips the other way round.
#[test]
fn eager_against_compiled() {
    let (a, b) = ("gpt2-b8", "gpt2-b8-compiled");
    let d: Value = serde_json::from_slice(&succeeded(diff(a, b, &["--json"])).stdout).unwrap();
    let (ta, tb) = (truth(a), truth(b));
    let peak = row(&d["figures"], "peak allocated");
    assert_eq!(peak["a"], ta["peak_allocated"]);
    assert_eq!(peak["b"], tb["peak_allocated"]);
    assert_eq!(d["parted_at"]["step"], 1);
    assert_eq!(
        row(&d["by_role"], "parameter")["a"],
        row(&d["by_role"], "parameter")["b"]
    );
    for role in ["activation", "temporary"] {
        let r = row(&d["by_role"], role);
        assert!(r["b"].as_u64() < r["a"].as_u64(), "{role}: {r}");
    }
    succeeded(diff(a, b, &["--fail-over", "0"]));
    exited_with(3, diff(b, a, &["--fail-over", "50"]));
}

/// A job the recording began watching mid-run: its replay would start from
/// an empty allocator it never had, so it is refused, as `sim` refuses it.
#[test]
fn a_job_watched_from_mid_run_is_refused() {
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/v1.1-synthetic.vsrec");
    let out = vramscope()
        .arg("diff")
        .arg(&rec)
        .arg(&rec)
        .output()
        .unwrap();
    let err = exited_with(1, out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("already running when the recording began"),
        "{err}"
    );
}
