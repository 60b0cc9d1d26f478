//! Recordings of real jobs in every training stack (issue 26), made on
//! H100s by `tests/gpu/roles_record.sh` (`ROLES_LEAK=body ROLES_STEPS=30`
//! for every stack; `ROLES_LEAK=1 ROLES_STEPS=30` for ResNet-50): each job
//! recorded with `vramscope record` while it ran under `vramscope run`,
//! and torch's own bytes by (module, role) at its quiescent point
//! (`NAME.truth.json`, one per rank: its parameters and buffers, their
//! `.grad`, the optimizer's `state`, matched to the allocator's blocks).
//!
//! The stacks: transformers GPT-2 (4 layers, AdamW, bf16 autocast) in a
//! plain loop, `torch.compile`d, with activation checkpointing, under HF
//! `Trainer`, Accelerate, Lightning (automatic and manual optimization),
//! an inference loop (no optimizer: steps from the allocation pattern),
//! FSDP2 and DDP (two ranks each); a timm ResNet-50 (SGD with momentum).
//! Each plants a leak: 256 KiB a step kept by the loop body (a Trainer
//! callback, Lightning's `training_step`), outside every module; ResNet's
//! in `layer2.0.conv2` (a forward hook keeping its output).
//!
//! Replayed here: every (module, role) row equals torch's, on every rank,
//! and the leak is flagged and named where it was planted.
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/roles")
}

type Rows = BTreeMap<(Option<String>, String), u64>;

/// torch's rows, and the replay's exact-role rows of the same process.
fn rows_of(truth: &Value, p: &Value) -> (Rows, Rows) {
    let key = |m: &Value, r: &Value| {
        (
            m.as_str().map(String::from),
            r.as_str().unwrap().to_string(),
        )
    };
    let want: Rows = (truth["rows"].as_array().unwrap().iter())
        .map(|r| (key(&r[0], &r[1]), r[2].as_u64().unwrap()))
        .collect();
    let mut got = Rows::new();
    for r in p["view"]["attribution"]["by_role"].as_array().unwrap() {
        let role = r["role"].as_str().unwrap();
        if ["parameter", "buffer", "gradient", "optimizer_state"].contains(&role) {
            *got.entry(key(&r["module"], &r["role"])).or_default() += r["bytes"].as_u64().unwrap();
        }
    }
    (want, got)
}

/// Every rank of the job `name`: `rows` (module, role) rows equal to
/// torch's; the lists that made them complete; no held tensor counted
/// under the optimizer; the planted leak flagged and named.
fn stack(name: &str, ranks: usize, rows: usize) {
    let jobs = common::replayed_jobs(&dir(), name);
    assert_eq!(jobs.len(), ranks, "{name}: ranks");
    for (truth, p) in &jobs {
        let rank = &truth["rank"];
        let (want, got) = rows_of(truth, p);
        assert_eq!(want.len(), rows, "{name} rank {rank}: torch's rows");
        assert_eq!(got, want, "{name} rank {rank}");
        let a = &p["view"]["attribution"];
        let l = &a["role_lists"];
        assert!(l["lists"].as_u64().unwrap() >= 2, "{l}");
        assert_eq!(
            (l["short"].as_u64(), l["dropped"].as_u64()),
            (Some(0), Some(0))
        );
        let mods: Vec<&str> = (a["by_module"].as_array().unwrap().iter())
            .filter_map(|m| m["module"].as_str())
            .collect();
        assert!(
            !mods.iter().any(|m| m.starts_with("optimizer.")),
            "{mods:?}"
        );
        let leak = &p["view"]["leak"];
        assert_eq!(leak["flagged"], true, "{name} rank {rank}: {leak}");
        assert!(leak["flagged_at_step"].as_u64().unwrap() <= 10, "{leak}");
        let origins = leak["origins"].as_array().unwrap();
        assert!(!origins.is_empty(), "{name} rank {rank}: {leak}");
        let modules: Vec<Option<&str>> = origins.iter().map(|o| o["module"].as_str()).collect();
        assert!(
            !modules
                .iter()
                .flatten()
                .any(|m| m.starts_with("optimizer.")),
            "{modules:?}"
        );
        match truth["leak_path"].as_str().unwrap() {
            // The loop body: outside every module, 256 KiB a step.
            "null" => {
                assert_eq!(modules[0], None, "{name} rank {rank}: {leak}");
                assert_eq!(origins[0]["bytes_per_step"], 262144, "{leak}");
            }
            path => assert!(
                modules.iter().take(2).flatten().any(|m| m.ends_with(path)),
                "{name} rank {rank}: {path} not in {modules:?}"
            ),
        }
    }
}

#[test]
fn plain_loop() {
    stack("plain-body", 1, 81);
}

#[test]
fn resnet50_leak_in_a_module() {
    stack("resnet-leak", 1, 374);
}

#[test]
fn torch_compile() {
    stack("compiled-body", 1, 81);
}

#[test]
fn activation_checkpointing() {
    stack("ckpt-body", 1, 81);
}

#[test]
fn hf_trainer() {
    stack("trainer-body", 1, 54);
}

#[test]
fn accelerate() {
    stack("accelerate-body", 1, 81);
}

#[test]
fn lightning_automatic_optimization() {
    stack("lightning-body", 1, 81);
}

#[test]
fn lightning_manual_optimization() {
    stack("lightning-manual-body", 1, 81);
}

/// No optimizer: steps from the allocation pattern, and the leak dated by
/// birth time (the job's own `vramscope snapshot` came before the end of
/// the recording: its blocks keep their births).
#[test]
fn inference_loop() {
    stack("inference-body", 1, 27);
}

#[test]
fn fsdp2_two_ranks() {
    stack("fsdp2-body", 2, 59);
}

#[test]
fn ddp_two_ranks() {
    stack("ddp-body", 2, 81);
}
