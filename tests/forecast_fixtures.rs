//! The out-of-memory forecast on jobs recorded on an H100 leaking until
//! they run out under a memory fraction (`tests/gpu/diff_record.sh`
//! `leak-oom` and `leak-oom-12`: transformers GPT-2 keeping 32 or 12 MiB a
//! step under `set_per_process_memory_fraction(0.03)`; `NAME.truth.json`
//! has the steps whose allocations failed). The recording is played
//! through the model one step at a time, as the dashboard sees the job,
//! and the forecast is read at every step boundary: made when the leak is
//! first flagged, it names the step of the first real out-of-memory error
//! within 10 %, and gets no further from it as steps pass.

mod common;

use std::path::Path;

use common::{forecasts_at_marks, recording, Advising};
use serde_json::Value;
use vramscope_core::model::forecast::Forecast;

fn dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/forecast")
}

/// The forecast at each of the job's own step marks: (step, forecast).
fn forecasts(name: &str) -> Vec<(u64, Option<Forecast>)> {
    forecasts_at_marks(recording(&dir(), name).path(), Advising::Off)
}

fn check(name: &str) -> (u64, Vec<(u64, u64)>) {
    let truth: Value =
        serde_json::from_slice(&std::fs::read(dir().join(format!("{name}.truth.json"))).unwrap())
            .unwrap();
    let real = truth["first_oom_step"].as_u64().unwrap();
    let all = forecasts(name);
    // Before the first real OOM: the forecasts made.
    let made: Vec<(u64, u64)> = all
        .iter()
        .filter(|(s, _)| *s < real)
        .filter_map(|(s, f)| Some((*s, f.as_ref()?.oom_step)))
        .collect();
    println!("{name}: first OOM at step {real}; forecasts (step, OOM step): {made:?}");
    let &(flag_step, first) = made
        .first()
        .unwrap_or_else(|| panic!("{name}: no forecast"));
    assert!(
        flag_step <= real / 2,
        "{name}: first forecast at step {flag_step}"
    );
    assert!(
        first.abs_diff(real) * 10 <= real,
        "{name}: forecast at step {flag_step} says {first}, the job ran out at {real}"
    );
    // Closer as steps pass: over the last quarter of the steps before
    // the OOM, every forecast within 5 %.
    for &(s, f) in made.iter().filter(|(s, _)| *s * 4 >= real * 3) {
        assert!(
            f.abs_diff(real) * 20 <= real,
            "{name}: at step {s} forecast {f}, real {real}"
        );
    }
    let f = all.iter().find_map(|(_, f)| *f).unwrap();
    println!("{name}: first forecast {f:?}");
    assert!(f.fraction);
    assert_eq!(
        f.limit,
        (0.03 * truth["total_memory"].as_f64().unwrap()) as u64
    );
    (real, made)
}

#[test]
fn a_32_mib_leak_is_forecast_to_run_out_when_it_did() {
    check("leak-oom");
}

#[test]
fn a_12_mib_leak_is_forecast_to_run_out_when_it_did() {
    check("leak-oom-12");
}
