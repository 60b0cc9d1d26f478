//! `vramscope sim --trace`: the documented request format replayed under a
//! configuration, one JSON object per request with PyTorch's meanings.

use std::process::Command;

use serde_json::Value;

fn sim(trace: &str, extra: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    std::fs::write(&path, trace).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("sim")
        .arg("--trace")
        .arg(&path)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const MIB: u64 = 1 << 20;

#[test]
fn json_lines_follow_pytorch_rules() {
    let trace = r#"{"op":"alloc","id":1,"size":1000}
{"op":"alloc","id":2,"size":5242880}
{"op":"alloc","id":3,"size":17825792,"stream":0}
{"op":"free","id":2}
{"op":"empty_cache"}
"#;
    let (ok, out, err) = sim(trace, &["--json"]);
    assert!(ok, "{err}");
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 5);
    let fig = |r: &Value| {
        (
            r["allocated"].as_u64().unwrap(),
            r["reserved"].as_u64().unwrap(),
            r["segments"].as_u64().unwrap(),
        )
    };
    // 1000 B rounds to 1024 in a 2 MiB small-pool segment.
    assert_eq!(fig(&rows[0]), (1024, 2 * MIB, 1));
    // 5 MiB (< 10 MiB) gets a 20 MiB segment.
    assert_eq!(fig(&rows[1]), (1024 + 5 * MIB, 22 * MIB, 2));
    // 17 MiB fits no cached block (15 MiB free in the 20 MiB segment) and
    // gets an 18 MiB segment (2 MiB rounding at 10 MiB and above); the 1 MiB
    // remainder is not > 1 MiB, so the block is not split: all 18 MiB count.
    assert_eq!(fig(&rows[2]), (1024 + 23 * MIB, 40 * MIB, 3));
    // Freeing caches the block: reserved unchanged.
    assert_eq!(fig(&rows[3]), (1024 + 18 * MIB, 40 * MIB, 3));
    // empty_cache returns the now wholly free 20 MiB segment.
    assert_eq!(fig(&rows[4]), (1024 + 18 * MIB, 20 * MIB, 2));
}

#[test]
fn expandable_segments_change_the_answer() {
    // 8 x 7 MiB: two per 20 MiB segment with 6 MiB stranded in each (80 MiB);
    // expandable segments map 20 MiB pages back to back (60 MiB).
    let trace = (0..8)
        .map(|i| format!("{{\"op\":\"alloc\",\"id\":{i},\"size\":{}}}\n", 7 * MIB))
        .collect::<String>();
    let (_, plain, _) = sim(&trace, &["--json"]);
    let (_, exp, _) = sim(&trace, &["--json", "--conf", "expandable_segments:True"]);
    let last = |s: &str| -> Value { serde_json::from_str(s.lines().last().unwrap()).unwrap() };
    assert_eq!(last(&plain)["reserved"].as_u64(), Some(80 * MIB));
    assert_eq!(last(&exp)["reserved"].as_u64(), Some(60 * MIB));
}

#[test]
fn bad_input_names_the_line() {
    let (ok, _, err) = sim(
        "{\"op\":\"alloc\",\"id\":1,\"size\":10}\n{\"op\":\"free\",\"id\":9}\n",
        &[],
    );
    assert!(!ok);
    assert!(err.contains("line 2"), "{err}");
    let (ok, _, err) = sim("{}\n", &["--conf", "max_split_size_mb:abc"]);
    assert!(!ok);
    assert!(
        err.contains("line 1") || err.contains("max_split_size_mb"),
        "{err}"
    );
}

/// Issue 16, item 3: with a recording, the capacity is the recorded GPU's
/// (NVML's total), unless --capacity-gib says otherwise; --fraction caps
/// reserved memory as set_per_process_memory_fraction does.
#[test]
fn capacity_comes_from_the_recording_and_fraction_caps_reserved() {
    let rec = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/recordings/diag/gpt2-fast.start.vsrec"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["sim", "--trace", rec])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("capacity: 79.6 GiB (GPU 0's total"), "{err}");
    assert!(
        err.contains("14 of 14 recorded statistics samples match"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args([
            "sim",
            "--trace",
            rec,
            "--capacity-gib",
            "1",
            "--fraction",
            "0.001",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("capacity:"), "the flag wins: {err}");
    let ooms: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("out-of-memory requests in the replay: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(ooms > 0, "{err}");
    for bad in ["0", "1.5", "-0.1", "nan"] {
        let (ok, _, err) = sim(rec, &["--fraction", bad]);
        assert!(
            !ok && err.contains("--fraction") && err.lines().count() == 1,
            "{err}"
        );
    }
}
