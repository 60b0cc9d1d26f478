//! Recordings of real jobs whose step runs a closure (issue 26, item 2),
//! made on an H100 by `STEPS=30 LAYERS=1 tests/gpu/closure_origins.sh`: a
//! Lightning `Trainer.fit` (automatic optimization: `training_step`,
//! forward and backward run inside `optimizer.step(closure)`) and a plain
//! loop under `torch.optim.LBFGS`, each with a 256 KiB/step leak planted
//! outside every module (in `training_step`, in the closure). Replayed
//! here: the leak is flagged and its origin is where the closure was
//! called from (`null`: outside every module), never the optimizer, which
//! is what the agent said before the closure was run outside it
//! (`optimizer.AdamW`, `optimizer.LBFGS`).
mod common;

use std::path::PathBuf;

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/closure")
}

/// The leak report of the job's process as the replay of `NAME.vsrec` ends.
fn leak_of(name: &str) -> (Value, Value) {
    let (truth, p) = common::replayed_job(&dir(), name);
    (truth, p["view"]["leak"].clone())
}

fn the_closures_leak_is_named_outside_every_module(name: &str) {
    let (truth, leak) = leak_of(name);
    assert_eq!(leak["flagged"], true, "{leak}");
    assert_eq!(leak["source"], "optimizer_steps", "{leak}");
    assert!(leak["flagged_at_step"].as_u64().unwrap() <= 10, "{leak}");
    let origins = leak["origins"].as_array().unwrap();
    assert!(!origins.is_empty(), "{leak}");
    assert!(origins[0]["module"].is_null(), "{leak}");
    assert_eq!(
        origins[0]["bytes_per_step"], truth["leak_bytes_per_step"],
        "{leak}"
    );
    assert!(
        origins.iter().all(|o| !o["module"]
            .as_str()
            .is_some_and(|m| m.starts_with("optimizer."))),
        "{leak}"
    );
}

#[test]
fn lightning_automatic_optimization_leak_is_not_the_optimizers() {
    the_closures_leak_is_named_outside_every_module("lightning");
}

#[test]
fn lbfgs_closure_leak_is_not_the_optimizers() {
    the_closures_leak_is_named_outside_every_module("lbfgs");
}
