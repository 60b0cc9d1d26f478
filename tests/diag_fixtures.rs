//! Recordings of real jobs on an H100 (tests/gpu/diag_fixtures.sh: a
//! one-layer transformers GPT-2 training with a planted 1 MiB/step leak, and
//! a healthy GPT-2 inference loop), each watched from the start and by a
//! reader attached mid-run after the rings wrapped, with no code change in
//! the job. Replayed here, so the diagnoses stay pinned without a GPU.
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::succeeded;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/diag")
}

fn json(path: PathBuf) -> Value {
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// The job's process as a replay of `NAME.HOW.vsrec` ends.
fn replay(name: &str, how: &str) -> (Value, Value) {
    let truth = json(dir().join(format!("{name}.truth.json")));
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("replay")
        .arg(dir().join(format!("{name}.{how}.vsrec")))
        .arg("--json")
        .output()
        .unwrap();
    let snap: Value = serde_json::from_slice(&succeeded(out).stdout).unwrap();
    let p = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["identity"]["host_pid"] == truth["pid"])
        .unwrap_or_else(|| panic!("pid {} not in {name}.{how}", truth["pid"]))
        .clone();
    (truth, p)
}

fn steps_within_2_percent(truth: &Value, leak: &Value) {
    let want = truth["steps"].as_u64().unwrap();
    let got = leak["steps_observed"].as_u64().unwrap();
    assert!(
        got.abs_diff(want) * 50 <= want.max(50),
        "{got} steps seen of {want}: {leak}"
    );
}

#[test]
fn a_training_leak_is_flagged_from_optimizer_steps_without_markers() {
    let (truth, p) = replay("gpt2-fast", "start");
    let leak = &p["view"]["leak"];
    assert_eq!(leak["source"], "optimizer_steps", "{leak}");
    assert_eq!(leak["step_confidence"], 1.0);
    steps_within_2_percent(&truth, leak);
    assert_eq!(leak["flagged"], true, "{leak}");
    assert!(leak["flagged_at_step"].as_u64().unwrap() <= 10, "{leak}");
    assert_eq!(p["view"]["figures"]["inconsistencies"], 0);
    assert_eq!(p["view"]["watch"]["mid_run"], false);
}

#[test]
fn attached_mid_run_the_leak_is_flagged_with_no_inconsistency() {
    let (_, p) = replay("gpt2-fast", "mid");
    let v = &p["view"];
    assert_eq!(v["watch"]["mid_run"], true, "{}", v["watch"]);
    assert_eq!(v["watch"]["waiting_for_anchor"], false);
    assert_eq!(v["figures"]["inconsistencies"], 0, "{}", v["figures"]);
    assert_eq!(v["figures"]["lost_events"], 0);
    assert_eq!(v["leak"]["flagged"], true, "{}", v["leak"]);
    assert!(v["leak"]["flagged_at_step"].as_u64().unwrap() <= 10);
}

#[test]
fn an_inference_loop_is_cut_into_steps_from_its_allocations_and_not_flagged() {
    let (truth, p) = replay("inference-none", "start");
    let leak = &p["view"]["leak"];
    assert_eq!(leak["source"], "allocation_period", "{leak}");
    assert!(leak["step_confidence"].as_f64().unwrap() >= 0.9, "{leak}");
    steps_within_2_percent(&truth, leak);
    assert_eq!(leak["flagged"], false, "{leak}");
    assert!(leak["flagged_at_step"].is_null());
    let (_, p) = replay("inference-none", "mid");
    assert_eq!(p["view"]["watch"]["mid_run"], true);
    assert_eq!(p["view"]["figures"]["inconsistencies"], 0);
    assert_eq!(p["view"]["leak"]["flagged"], false);
}
