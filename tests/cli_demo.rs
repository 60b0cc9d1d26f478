//! `vramscope demo --headless --json`: each scenario's claim holds, and what
//! the dashboard's model reports through the ring equals the simulator's own
//! statistics exactly.

mod common;
use common::succeeded;
use std::process::Command;

use serde_json::Value;

fn demo(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("demo")
        .args(args)
        .args(["--headless", "--json"])
        .output()
        .unwrap();
    let out = succeeded(out);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{path} in {v}"))
}

fn exact(r: &Value) {
    // Model figures (from the ring) equal the allocator's own statistics.
    assert_eq!(
        u(r, "/process/view/figures/allocated"),
        u(r, "/allocator/allocated")
    );
    assert_eq!(
        u(r, "/process/view/figures/reserved"),
        u(r, "/allocator/reserved")
    );
    assert_eq!(
        u(r, "/process/view/figures/peak_allocated"),
        u(r, "/allocator/allocated_peak")
    );
    assert_eq!(
        u(r, "/process/view/figures/peak_reserved"),
        u(r, "/allocator/reserved_peak")
    );
    assert_eq!(u(r, "/process/source/lost"), 0);
    // The block map (from snapshots and events) agrees with the statistics.
    let dev = &r["process"]["view"]["devices"][0];
    assert_eq!(dev["figures"]["synced"], Value::Bool(true), "{dev}");
    let seg_total: u64 = dev["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["size"].as_u64().unwrap())
        .sum();
    assert_eq!(seg_total, u(r, "/allocator/reserved"));
}

#[test]
fn list_names_every_scenario_first() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "--list"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "healthy",
            "leak",
            "fragmentation",
            "empty-cache",
            "oom",
            "inference"
        ]
    );
}

#[test]
fn healthy_is_steady_and_not_flagged() {
    let r = demo(&["healthy"]);
    exact(&r);
    assert_eq!(r["process"]["view"]["leak"]["flagged"], Value::Bool(false));
    assert!(u(&r, "/process/view/leak/steps_observed") >= 8);
    assert_eq!(u(&r, "/process/view/ooms_total"), 0);
}

#[test]
fn leak_is_flagged_with_the_growing_size() {
    let r = demo(&["leak"]);
    exact(&r);
    let leak = &r["process"]["view"]["leak"];
    assert_eq!(leak["flagged"], Value::Bool(true), "{leak}");
    assert!(leak["floor_slope_bytes_per_step"].as_f64().unwrap() > 1e6);
    let top = leak["top_sizes"].as_array().unwrap();
    assert!(top
        .iter()
        .any(|s| s["live_growth_per_step"].as_f64().unwrap() >= 1.0));

    // Attribution through the ring: the simulated job names its layers and
    // phases, and sends role lists. The rows add up to the allocated bytes;
    // each layer holds its weight, its gradient, Adam's two states (named
    // by the role list: made in the optimizer's code, held for the layer)
    // and one 16 MiB validation activation per step.
    let a = &r["process"]["view"]["attribution"];
    assert_eq!(u(a, "/step"), 16);
    let rows = a["by_module"].as_array().unwrap();
    let sum: u64 = rows.iter().map(|m| m["bytes"].as_u64().unwrap()).sum();
    assert_eq!(sum, u(&r, "/process/view/figures/allocated"));
    const MIB: u64 = 1 << 20;
    for l in 0..12 {
        let m = rows
            .iter()
            .find(|m| m["module"] == format!("model.layers.{l}"))
            .unwrap_or_else(|| panic!("layer {l} in {a}"));
        let bytes = m["bytes"].as_u64().unwrap();
        assert!(bytes >= 4 * 48 * MIB + 16 * 16 * MIB, "{m}");
        assert!(bytes < 4 * 48 * MIB + 16 * 16 * MIB + MIB, "{m}");
        // By role: weight and bias (48 MiB + 12 KiB, each in its block),
        // their gradients, twice that of optimizer state.
        let role = |r: &str| -> u64 {
            (a["by_role"].as_array().unwrap().iter())
                .filter(|x| x["module"] == format!("model.layers.{l}") && x["role"] == r)
                .map(|x| x["bytes"].as_u64().unwrap())
                .sum()
        };
        let param = role("parameter");
        assert!((48 * MIB..49 * MIB).contains(&param), "{param} in {a}");
        assert_eq!(role("gradient"), param);
        assert_eq!(role("optimizer_state"), 2 * param);
    }
    let phase = |p: &str| {
        let row = a["by_phase"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["phase"] == p);
        row.map_or(0, |r| r["bytes"].as_u64().unwrap())
    };
    // Adam's state: twice the weights; the leaked graph: forward.
    assert!(phase("optimizer") >= 2 * 12 * 48 * MIB);
    assert!(phase("forward") >= 16 * 12 * 16 * MIB);

    // The leak by module: the layers' validation activations (16 MiB each
    // per step, rolled up into model.layers.*) first, then the kept batch
    // outside every module and model.head's kept loss; no parameter,
    // gradient or optimizer state.
    let origins = leak["origins"].as_array().unwrap();
    // Outside every module: null in JSON (issue 26, item 4).
    let names: Vec<Option<&str>> = origins.iter().map(|o| o["module"].as_str()).collect();
    assert_eq!(
        names,
        [Some("model.layers.*"), None, Some("model.head")],
        "{leak}"
    );
    assert!(origins[1]["module"].is_null());
    assert_eq!(u(&origins[0], "/modules"), 12);
    assert_eq!(u(&origins[0], "/bytes_per_step"), 12 * 16 * MIB);
    assert_eq!(u(&origins[1], "/bytes_per_step"), 4 * MIB);
    assert_eq!(u(&origins[2], "/bytes_per_step"), 512);
    for o in origins {
        assert_eq!(o["steps_with_survivors"], o["window_steps"], "{o}");
    }
}

#[test]
fn expandable_segments_lower_fragmentation() {
    let plain = demo(&["fragmentation"]);
    let exp = demo(&["fragmentation", "--conf", "expandable_segments:True"]);
    exact(&plain);
    let split = |r: &Value| u(r, "/allocator/inactive_split");
    assert!(
        split(&exp) < split(&plain),
        "{} vs {}",
        split(&exp),
        split(&plain)
    );
    assert!(u(&exp, "/allocator/reserved_peak") < u(&plain, "/allocator/reserved_peak"));
}

#[test]
fn empty_cache_returns_memory_but_not_allocated() {
    let r = demo(&["empty-cache"]);
    exact(&r);
    assert!(u(&r, "/allocator/reserved") < u(&r, "/allocator/reserved_peak"));
}

#[test]
fn oom_happens_while_free_memory_sits_in_the_cache() {
    let r = demo(&["oom"]);
    assert!(u(&r, "/process/view/ooms_total") >= 1);
    let oom = &r["process"]["view"]["ooms"][0];
    // The cache held more free bytes than the failed request, but in pieces.
    let cached_free = u(&r, "/allocator/reserved") - u(&r, "/allocator/allocated");
    assert!(cached_free > oom["request"].as_u64().unwrap(), "{oom}");
    assert!(oom["largest_free"].as_u64().unwrap() < oom["request"].as_u64().unwrap());
    // The caption names the largest free block as the OOM pane does (issue
    // 30, item 8: it said "120 MiB pieces" beside "largest free block 100 MiB").
    let largest = oom["largest_free"].as_u64().unwrap();
    assert_eq!(largest, 100 << 20);
    let caption = r["caption"].as_str().unwrap();
    assert!(caption.contains("free block over 100 MiB"), "{caption}");
    let fixed = demo(&["oom", "--conf", "expandable_segments:True"]);
    assert_eq!(u(&fixed, "/process/view/ooms_total"), 0);
}

#[test]
fn inference_needs_less_than_training() {
    let train = demo(&["healthy"]);
    let infer = demo(&["inference"]);
    exact(&infer);
    // The scenario trains 8 steps, then runs 8 under no_grad: the training
    // peak is the same as `healthy`'s, and what stays allocated at the end
    // (weights and optimizer state, no grads, no graph) is smaller.
    assert_eq!(
        u(&infer, "/allocator/allocated_peak"),
        u(&train, "/allocator/allocated_peak")
    );
    assert!(u(&infer, "/allocator/allocated") < u(&train, "/allocator/allocated"));
}

#[test]
fn unknown_scenario_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "nope", "--headless"])
        .output()
        .unwrap();
    // A usage error (exit 2), one line naming the value and the choices.
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("'nope'") && err.contains("healthy") && err.contains("inference"),
        "{err}"
    );
}

/// Issue 47: the simulated job names what it holds outside the caching
/// allocator (its CUDA context and cuBLAS's workspace, on device 0); with
/// no NVML in the headless demo, what no one named is absent (null), never
/// 0. The text says it on one line.
#[test]
fn the_demo_names_memory_outside_the_allocator() {
    let r = demo(&["healthy"]);
    let outside = r["process"]["view"]["outside"].as_array().unwrap();
    let parts: Vec<(&str, &str, u64, u64)> = (outside.iter())
        .map(|p| {
            (
                p["library"].as_str().unwrap(),
                p["kind"].as_str().unwrap(),
                p["device"].as_u64().unwrap(),
                p["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        parts,
        [
            ("CUDA", "context", 0, 524_288_000),
            ("cuBLAS", "allocations", 0, 33_554_432)
        ]
    );
    let figures = &r["process"]["view"]["figures"];
    assert_eq!(u(&r, "/process/view/figures/outside_named"), 557_842_432);
    assert!(figures["unexplained"].is_null(), "{figures}");
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "healthy", "--headless"])
        .output()
        .unwrap();
    let text = String::from_utf8(succeeded(out).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l == "outside    context 500 MiB · cuBLAS 32.0 MiB · unexplained —"),
        "{text}"
    );
}

/// Issue 10, item 3: a looping scenario keeps its verdict per run. The leak
/// demo is flagged in every run (within 10 steps of the run's start); the
/// healthy one in none.
#[test]
fn a_looping_demo_keeps_its_verdict_in_every_run() {
    let r = demo(&["leak", "--runs", "5"]);
    let leak = &r["process"]["view"]["leak"];
    assert_eq!(leak["run"], 5, "{leak}");
    assert_eq!(leak["flagged"], true, "{leak}");
    let runs = leak["earlier_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{leak}");
    for run in runs.iter().chain([leak]) {
        let at = run["flagged_at_step"].as_u64();
        assert!(at.is_some_and(|s| s <= 10), "{run}");
    }
    let r = demo(&["healthy", "--runs", "3"]);
    let leak = &r["process"]["view"]["leak"];
    assert_eq!(leak["flagged"], false, "{leak}");
    for run in leak["earlier_runs"].as_array().unwrap() {
        assert!(run["flagged_at_step"].is_null(), "{run}");
        assert!(run["steps"].as_u64().unwrap() >= 8, "{run}");
    }
}

/// The reader side of command 5 through the real ring: `vramscope stacks
/// PID` asks a running demo (a real segment, answering on its control
/// block) to capture stacks for 3 steps; blocks allocated meanwhile carry
/// their code location in `snapshot --json --blocks`, and capture ends by
/// itself.
#[test]
fn stacks_command_captures_code_locations_in_a_running_demo() {
    let dir = tempfile::tempdir().unwrap();
    let sc = vramscope_collect::demo::scenario("leak", None).unwrap();
    let control = vramscope_collect::demo::start(sc, dir.path(), 5.0, None).unwrap();
    let pid = std::process::id().to_string();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .arg("--shm-dir")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    // Into the run (the model is on the GPU), then ask.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let out = succeeded(run(&["stacks", &pid, "--steps", "3"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "process {pid}: capturing stacks for 3 steps from step"
        )),
        "{text}"
    );
    let began: u64 = text.trim().rsplit(' ').next().unwrap().parse().unwrap();
    // Wait until capture is over (the leak's validation activations
    // allocated meanwhile stay alive), then look.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (v, step) = loop {
        let out = succeeded(run(&["snapshot", "--json", "--blocks", "--no-nvml"]));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let step = v
            .pointer("/processes/0/view/attribution/step")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if step >= began + 4 || std::time::Instant::now() > deadline {
            break (v, step);
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    control.stop();
    assert!(step >= began + 4, "the demo never got past step {step}");
    let a = v.pointer("/processes/0/view/attribution").unwrap();
    let contexts = a["contexts"].as_array().unwrap();
    let with_stack: Vec<&Value> = contexts
        .iter()
        .filter(|c| {
            c.get("stack")
                .is_some_and(|s| s.as_array().is_some_and(|s| !s.is_empty()))
        })
        .collect();
    let validate = with_stack
        .iter()
        .find(|c| c["stack"][1] == "train.py:88 validate")
        .unwrap_or_else(|| panic!("no validation stack in {contexts:?}"));
    assert_eq!(validate["stack"][0], "model.py:31 forward");
    assert_eq!(validate["phase"], "forward");
    assert!(validate["module"]
        .as_str()
        .unwrap()
        .starts_with("model.layers."));
    // A live block made during capture names that context, born in a
    // captured step; blocks born after it ended carry no stack.
    let id = validate["id"].as_u64().unwrap();
    let blocks: Vec<&Value> = v
        .pointer("/processes/0/view/devices/0/segments")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap())
        .collect();
    let born = |b: &Value| b.pointer("/origin/step").and_then(Value::as_u64);
    let captured: Vec<&&Value> = blocks
        .iter()
        .filter(|b| b.pointer("/origin/context").and_then(Value::as_u64) == Some(id))
        .collect();
    assert!(!captured.is_empty());
    for b in &captured {
        let s = born(b).unwrap();
        assert!(
            (began..began + 3).contains(&s),
            "born {s}, capture from {began}"
        );
    }
    let stacked: Vec<u64> = with_stack
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    let after = blocks
        .iter()
        .filter(|b| born(b).is_some_and(|s| s >= began + 3));
    for b in after {
        let c = b
            .pointer("/origin/context")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        assert!(!stacked.contains(&c), "{b} after capture ended");
    }
}

/// Issue 30, item 5: the fragmentation scenario's closing caption follows
/// `--conf` (it suggested expandable_segments:True to a run that had it).
#[test]
fn the_fragmentation_caption_follows_conf() {
    let now = |conf: Option<&str>| {
        let mut args = vec!["demo", "fragmentation", "--headless"];
        if let Some(c) = conf {
            args.extend(["--conf", c]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines()
            .find(|l| l.starts_with("now"))
            .unwrap_or_else(|| panic!("no caption: {text}"))
            .to_string()
    };
    assert!(now(None).contains("compare with --conf expandable_segments:True"));
    let exp = now(Some("expandable_segments:True"));
    assert!(
        exp.contains("with expandable_segments:True") && exp.contains("compare with the default"),
        "{exp}"
    );
    assert!(!exp.contains("--conf expandable_segments:True"), "{exp}");
    let split = now(Some("max_split_size_mb:64"));
    assert!(
        split.contains("with max_split_size_mb:64") && split.contains("expandable_segments:True"),
        "{split}"
    );
}

/// Issue 46, item 19: the dashboard with no terminal (input from
/// /dev/null, output to a pipe) says that a terminal is needed and names
/// what works without one, on one line, exit 1.
#[test]
fn no_terminal_says_a_terminal_is_needed_and_what_works_without() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "healthy"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = common::exited_with(1, out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("needs a terminal"), "{err}");
    for way in ["demo --headless", "vramscope snapshot", "vramscope serve"] {
        assert!(err.contains(way), "{err}");
    }
    assert!(!err.contains("os error"), "{err}");
}
