//! The advisor against real reruns (issue 27): jobs recorded on an H100
//! under their own setting, then rerun for real under every candidate the
//! advisor proposed (`tests/gpu/advise_check.sh`; the reruns' figures are
//! committed beside each recording as `NAME.reruns.json`). Here
//! `vramscope advise --json` predicts every candidate from the recording
//! alone, and each prediction is held to what the rerun really did: peak
//! reserved inside the predicted range widened by 2 %, and running out of
//! memory or not as predicted.

mod common;

use std::path::Path;

use common::{recording, succeeded, vramscope};
use serde_json::Value;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/advise")
}

/// `vramscope advise` on NAME with the job's own fraction and device size.
fn advise(name: &str, json: bool) -> (Value, String) {
    let reruns: Value =
        serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.reruns.json"))).unwrap())
            .unwrap();
    let rec = recording(&dir(), name);
    let job = &reruns["job"];
    let mut cmd = vramscope();
    cmd.arg("advise").arg(rec.path()).args([
        "--capacity-gib",
        &(job["total_memory"].as_f64().unwrap() / (1u64 << 30) as f64).to_string(),
    ]);
    if let Some(f) = job["fraction"].as_f64() {
        cmd.args(["--fraction", &f.to_string()]);
    }
    if json {
        cmd.arg("--json");
    }
    let out = succeeded(cmd.output().unwrap());
    (reruns, String::from_utf8(out.stdout).unwrap())
}

/// Every candidate's prediction agrees with its real rerun; returns the
/// advice.
fn check(name: &str) -> Value {
    let (reruns, text) = advise(name, true);
    let advice: Value = serde_json::from_str(&text).unwrap();
    let own = &advice["own"];
    assert!(own["compared"].as_u64().unwrap() > 0, "{own}");
    assert_eq!(own["matching"], own["compared"], "own replay: {own}");
    assert_eq!(own["replay_ooms"], own["job_ooms"], "{own}");
    let outcomes = advice["outcomes"].as_array().unwrap();
    assert!(outcomes.len() >= 5, "{} candidates", outcomes.len());
    let mut failures = Vec::new();
    for o in outcomes {
        let conf = o["conf"].as_str().unwrap();
        let real = (reruns["reruns"].as_array().unwrap().iter())
            .find(|r| r["conf"] == conf)
            .unwrap_or_else(|| panic!("{name}: no rerun under {conf:?}"));
        let t = &o["totals"];
        let (lo, hi) = (
            t["reserved_peak"]["lo"].as_f64().unwrap(),
            t["reserved_peak"]["hi"].as_f64().unwrap(),
        );
        let peak = real["peak_reserved"].as_f64().unwrap();
        if !(lo * 0.98 <= peak && peak <= hi * 1.02) {
            failures.push(format!("{conf:?}: peak {peak} outside {lo}..{hi}"));
        }
        let (olo, ohi) = (
            t["ooms"]["lo"].as_u64().unwrap(),
            t["ooms"]["hi"].as_u64().unwrap(),
        );
        let ran_out = real["num_ooms"].as_u64().unwrap() > 0;
        if !((olo > 0) <= ran_out && ran_out <= (ohi > 0)) {
            failures.push(format!(
                "{conf:?}: predicted {olo}..{ohi} OOMs, the rerun {}",
                real["num_ooms"]
            ));
        }
    }
    assert!(failures.is_empty(), "{name}: {failures:#?}");
    advice
}

#[test]
fn convnext_every_candidate_as_the_reruns() {
    let advice = check("convnext");
    // Expandable segments saved 162 MiB at peak in the rerun: the first
    // candidate, and the recommendation.
    let best = &advice["outcomes"][advice["best"].as_u64().unwrap() as usize];
    assert_eq!(best["conf"], "expandable_segments:True");
    assert_eq!(
        advice["recommended_env"],
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    );
    assert!(
        best["peak_change"].as_i64().unwrap() < -(100 << 20),
        "{best}"
    );
}

#[test]
fn a_job_that_runs_out_every_candidate_as_the_reruns() {
    let advice = check("gpt2-oom-1.02");
    // The job ran out 10 times under its own setting; the recommendation
    // runs out less often (the rerun: never).
    let own = (advice["outcomes"].as_array().unwrap().iter())
        .find(|o| o["own"] == true)
        .unwrap();
    assert_eq!(own["totals"]["ooms"]["lo"], 10);
    let best = &advice["outcomes"][advice["best"].as_u64().unwrap() as usize];
    assert!(
        best["totals"]["ooms"]["hi"].as_u64() < own["totals"]["ooms"]["lo"].as_u64(),
        "{best}"
    );
    let fates = best["job_ooms"].as_array().unwrap();
    assert_eq!(fates.len(), 10, "one fate per OOM the job hit");
}

#[test]
fn the_table_ends_with_the_line_to_copy() {
    let (_, text) = advise("convnext", false);
    assert!(
        text.contains("\nrecommended: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"),
        "{text}"
    );
    assert!(
        text.contains("replayed: 378 of 378 recorded statistics samples match"),
        "{text}"
    );
}
