//! Recordings of real jobs with role lists (issue 26, item 1), made on an
//! H100 by `tests/gpu/roles_record.sh plain resnet`: a transformers GPT-2
//! (4 layers, AdamW, bf16 autocast, a plain loop) and a timm ResNet-50 (SGD
//! with momentum), each recorded with `vramscope record` while it ran
//! under `vramscope run`, and torch's own bytes by (module, role) at the
//! job's quiescent point (`NAME.truth.json`: its parameters and buffers,
//! their `.grad`, the optimizer's `state`, matched to the allocator's
//! blocks). Replayed here: the replay gives every row exactly.
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/roles")
}

type Rows = BTreeMap<(Option<String>, String), u64>;

/// torch's rows, and the replay's exact-role rows of the same process.
fn rows_of(name: &str) -> (Rows, Rows, Value) {
    let (truth, p) = common::replayed_job(&dir(), name);
    let key = |m: &Value, r: &Value| {
        (
            m.as_str().map(String::from),
            r.as_str().unwrap().to_string(),
        )
    };
    let want: Rows = (truth["rows"].as_array().unwrap().iter())
        .map(|r| (key(&r[0], &r[1]), r[2].as_u64().unwrap()))
        .collect();
    let a = &p["view"]["attribution"];
    let mut got = Rows::new();
    for r in a["by_role"].as_array().unwrap() {
        let role = r["role"].as_str().unwrap();
        if ["parameter", "buffer", "gradient", "optimizer_state"].contains(&role) {
            *got.entry(key(&r["module"], &r["role"])).or_default() += r["bytes"].as_u64().unwrap();
        }
    }
    (want, got, a.clone())
}

fn every_row_is_torchs(name: &str, rows: usize) {
    let (want, got, a) = rows_of(name);
    assert_eq!(want.len(), rows, "{name}: torch's rows");
    assert_eq!(got, want, "{name}");
    // The lists that made them: complete, none short, none dropped.
    let l = &a["role_lists"];
    assert!(l["lists"].as_u64().unwrap() >= 2, "{l}");
    assert_eq!(
        (l["short"].as_u64(), l["dropped"].as_u64()),
        (Some(0), Some(0))
    );
    // By module counts each held tensor under its module: no parameter is
    // the optimizer's or outside every module.
    let mods: Vec<&str> = (a["by_module"].as_array().unwrap().iter())
        .filter_map(|m| m["module"].as_str())
        .collect();
    assert!(
        !mods.iter().any(|m| m.starts_with("optimizer.")),
        "{mods:?}"
    );
}

#[test]
fn gpt2_roles_replay_as_torch_counted_them() {
    every_row_is_torchs("plain", 81);
}

#[test]
fn resnet50_roles_replay_as_torch_counted_them() {
    every_row_is_torchs("resnet", 374);
}
