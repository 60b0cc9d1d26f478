//! The real jobs `fit` is checked on (`tests/fixtures/recordings/fit/`):
//! torch's figures per model in `MODEL.truth.json`.

use std::path::{Path, PathBuf};

pub(crate) fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/fit")
}

pub(crate) fn truth(model: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir().join(format!("{model}.truth.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// torch's peak reserved at `batch`.
pub(crate) fn real_peak(t: &serde_json::Value, batch: u64) -> u64 {
    (t["runs"].as_array().unwrap().iter())
        .find(|r| r["batch"] == batch)
        .unwrap()["peak_reserved"]
        .as_u64()
        .unwrap()
}

/// How far `predicted` is from `real`, as a share of it.
pub(crate) fn off(predicted: u64, real: u64) -> f64 {
    (predicted as f64 - real as f64).abs() / real as f64
}
