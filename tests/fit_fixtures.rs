//! `vramscope fit` on real jobs recorded on an H200 (torch 2.11,
//! `tests/gpu/fit_job.py`): GPT-2, ViT, Llama and BERT at batches 4, 8, 16 and
//! 32, with torch's own peaks, and the largest batch under a memory
//! fraction found as Lightning's BatchSizeFinder finds it (by trying, each
//! try a fresh process) in `MODEL.truth.json`.
//!
//! What the user sees is checked: the JSON figures against torch's, the
//! largest batch against trying it, and one line on stderr with the exit
//! status for what cannot be fitted.

mod common;

use common::fit_truth::{dir, off, real_peak, truth};
use common::{exited_with, recording, succeeded, vramscope, Recording};

/// BERT was recorded after `fit` was built: held out.
const MODELS: [&str; 4] = ["gpt2", "vit", "llama", "bert"];

fn rec(model: &str, batch: u64) -> Recording {
    recording(&dir(), &format!("{model}-b{batch}"))
}

fn arg(r: &Recording, batch: u64) -> String {
    format!("{}:{batch}", r.path().display())
}

fn fit(args: &[String]) -> serde_json::Value {
    let out = vramscope()
        .arg("fit")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    serde_json::from_slice(&succeeded(out).stdout).unwrap()
}

fn predicted(v: &serde_json::Value, batch: u64) -> u64 {
    (v["predictions"].as_array().unwrap().iter())
        .find(|p| p["batch"] == batch)
        .unwrap()["peak_reserved"]
        .as_u64()
        .unwrap()
}

/// Two recordings (batches 8 and 16): the peak reserved at twice the
/// larger batch within 2 % of torch's, and the largest batch under the
/// job's fraction exactly the one trying found.
#[test]
fn two_runs_predict_twice_the_batch_and_the_largest_exactly() {
    for model in MODELS {
        let t = truth(model);
        let (a, b) = (rec(model, 8), rec(model, 16));
        let fraction = t["fraction"].as_f64().unwrap().to_string();
        let v = fit(&[
            arg(&a, 8),
            arg(&b, 16),
            "--at".into(),
            "32".into(),
            "--capacity-gib".into(),
            "1000".into(),
        ]);
        assert_eq!(v["method"], "two_runs", "{model}: {v}");
        let (p, r) = (predicted(&v, 32), real_peak(&t, 32));
        assert!(off(p, r) <= 0.02, "{model}: predicted {p}, torch {r}");
        let v = fit(&[arg(&a, 8), arg(&b, 16), "--fraction".into(), fraction]);
        assert_eq!(v["largest_batch"], t["largest_batch"], "{model}: {v}");
        // The largest batch and the next were replayed: one fits, one not.
        let l = t["largest_batch"].as_u64().unwrap();
        let ooms = |b: u64| {
            (v["predictions"].as_array().unwrap().iter())
                .find(|p| p["batch"] == b)
                .unwrap()["ooms"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(ooms(l), 0, "{model}");
        assert!(ooms(l + 1) > 0, "{model}");
    }
}

/// One recording (batch 8), scaled by roles: the peak at 16 within 5 %
/// of torch's, and the largest batch within one of trying.
#[test]
fn one_run_by_roles_within_five_percent_and_one_batch() {
    for model in MODELS {
        let t = truth(model);
        let a = rec(model, 8);
        let v = fit(&[
            arg(&a, 8),
            "--at".into(),
            "16".into(),
            "--capacity-gib".into(),
            "1000".into(),
        ]);
        assert_eq!(v["method"], "roles", "{model}: {v}");
        let (p, r) = (predicted(&v, 16), real_peak(&t, 16));
        assert!(off(p, r) <= 0.05, "{model}: predicted {p}, torch {r}");
        let fraction = t["fraction"].as_f64().unwrap().to_string();
        let v = fit(&[arg(&a, 8), "--fraction".into(), fraction]);
        let (got, real) = (
            v["largest_batch"].as_i64().unwrap(),
            t["largest_batch"].as_i64().unwrap(),
        );
        assert!((got - real).abs() <= 1, "{model}: {got} against {real}");
    }
}

/// Two recordings of different jobs do not match: `fit` says so on one
/// line and scales the first by its roles.
#[test]
fn different_jobs_fall_back_to_roles_and_say_so() {
    let (a, b) = (rec("gpt2", 8), rec("vit", 16));
    let out = vramscope()
        .args(["fit", &arg(&a, 8), &arg(&b, 16), "--json"])
        .output()
        .unwrap();
    let out = succeeded(out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["method"], "roles");
    assert!(v["fallback"].as_str().unwrap().contains("match"), "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("by its roles")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("do not match"), "{err}");
}

/// A batch of 0, negative, huge or not a number, and a limit that is not
/// one: refused while the command line is parsed, one line, exit 2.
#[test]
fn bad_batches_and_limits_are_one_line_exit_2() {
    let a = rec("gpt2", 8);
    let path = a.path().display().to_string();
    for bad in [
        vec![format!("{path}:0")],
        vec![format!("{path}:-8")],
        vec![format!("{path}:99999999999")],
        vec![format!("{path}:eight")],
        vec![path.clone()],
        vec![format!("{path}:8"), "--at".into(), "0".into()],
        vec![format!("{path}:8"), "--at".into(), "2000000".into()],
        vec![format!("{path}:8"), "--limit".into(), "-1GiB".into()],
        vec![format!("{path}:8"), "--limit".into(), "lots".into()],
        vec![format!("{path}:8"), "--fraction".into(), "1.5".into()],
    ] {
        let out = vramscope().arg("fit").args(&bad).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad:?}: {err}");
        assert!(
            err.contains("invalid value") || err.contains("expected"),
            "{bad:?}: {err}"
        );
    }
}

/// A limit below what the job holds whatever the batch: no batch fits,
/// said on one line, `largest_batch` null.
#[test]
fn a_limit_below_the_parameters_fits_no_batch() {
    let a = rec("gpt2", 8);
    let out = vramscope()
        .args(["fit", &arg(&a, 8), "--limit", "64MiB", "--json"])
        .output()
        .unwrap();
    let out = succeeded(out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["largest_batch"].is_null(), "{v}");
    assert!(v["fixed_bytes"].as_u64().unwrap() > 64 << 20, "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no batch fits"), "{err}");
}

/// A recording without step marks cannot be fitted: one line naming the
/// recording and why, exit 1.
#[test]
fn a_recording_with_no_steps_is_refused() {
    let r = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/v1.2-synthetic.vsrec");
    let out = vramscope()
        .args(["fit", &format!("{}:8", r.display())])
        .output()
        .unwrap();
    let err = exited_with(1, out);
    assert!(
        err.contains("has no steps") && err.contains("v1.2-synthetic"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
