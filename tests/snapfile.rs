//! `vramscope open` on PyTorch memory snapshot files: the fixtures of every
//! release (tests/fixtures/snapshots/releases, written by its generate.py to
//! each release's shape) and those real PyTorch 2.11 wrote
//! (tests/fixtures/snapshots/torch-2.11, by tests/gpu/snapshot_fixtures.py),
//! each against the figures expected of it; the state at any event rebuilt
//! by the model; and one test per refusal.
mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

use vramscope_collect::Hub;
use vramscope_core::model::ViewOptions;
use vramscope_core::snapfile::{self, inputs};

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(name)
}

/// Every fixture of `dir` with its expected figures per device.
fn expected(dir: &Path) -> Vec<(PathBuf, Value)> {
    let text = std::fs::read_to_string(dir.join("expected.json")).expect("expected.json");
    let v: Value = serde_json::from_str(&text).expect("expected.json is JSON");
    let mut out: Vec<_> = v
        .as_object()
        .expect("an object")
        .iter()
        .map(|(k, v)| (dir.join(k), v.clone()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn open_json(path: &Path, extra: &[&str]) -> Value {
    let out = common::succeeded(
        common::vramscope()
            .arg("open")
            .arg(path)
            .arg("--json")
            .args(extra)
            .output()
            .expect("runs"),
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `open --json` reports, for every device, the figures torch reported:
/// from the file, and from the model's state at the end.
fn check_dir(name: &str) -> usize {
    let d = dir(name);
    if !d.join("expected.json").exists() {
        println!("SKIPPED: {} has no fixtures", d.display());
        return 0;
    }
    let fixtures = expected(&d);
    for (path, want) in &fixtures {
        let got = open_json(path, &[]);
        let model = &got["state"]["processes"][0]["view"]["devices"];
        for (dev, w) in want.as_object().expect("devices") {
            let dev: u64 = dev.parse().expect("a device index");
            let file = got["devices"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["device"] == dev))
                .unwrap_or_else(|| panic!("{}: no device {dev}", path.display()));
            let m = model
                .as_array()
                .and_then(|a| a.iter().find(|x| x["figures"]["device"] == dev))
                .map(|x| &x["figures"])
                .unwrap_or_else(|| panic!("{}: the model has no device {dev}", path.display()));
            for k in ["segments", "reserved", "allocated", "blocks"] {
                // With expandable segments torch 2.11's `segment.all.current`
                // stays 0; the snapshot lists each mapped range.
                let w = match (k, w.get("snapshot_segments")) {
                    ("segments", Some(n)) => n,
                    _ => &w[k],
                };
                assert_eq!(&file[k], w, "{}: device {dev} {k} (file)", path.display());
                if k == "blocks" {
                    // The model merges nothing PyTorch keeps apart, but its
                    // count is of its own tiling: at most the file's.
                    assert!(m[k].as_u64() <= w.as_u64(), "{}: blocks", path.display());
                } else {
                    assert_eq!(&m[k], w, "{}: device {dev} {k} (model)", path.display());
                }
            }
        }
    }
    fixtures.len()
}

#[test]
fn every_release_2_1_to_2_15_reads_to_the_figures_torch_reports() {
    let n = check_dir("releases");
    assert_eq!(n, 15 * 8, "15 releases × 8 scenarios");
}

#[test]
fn real_torch_2_11_files_read_to_the_figures_torch_reported() {
    check_dir("torch-2.11");
}

/// The model rebuilds the state at the end of the trace from the state
/// before it (the trace undone) and the trace, to the file's own figures.
#[test]
fn the_state_rebuilt_through_the_whole_trace_is_the_files() {
    for (path, _) in expected(&dir("releases")) {
        let file = snapfile::read(&path).expect("reads");
        let n: usize = file.traces.iter().map(Vec::len).sum();
        let hub = Hub::default();
        let mut last = 0;
        for (t, input) in inputs::inputs(&file, "t", inputs::Plan { upto: Some(n) }) {
            last = t;
            hub.apply(input);
        }
        let snap = hub.snapshot_at(last, &ViewOptions::default());
        let p = &snap.processes[0].view;
        for t in file.totals() {
            let d = p
                .devices
                .iter()
                .find(|d| d.figures.device == t.device)
                .unwrap_or_else(|| panic!("{}: device {}", path.display(), t.device));
            assert_eq!(
                d.figures.reserved,
                t.reserved,
                "{}: reserved",
                path.display()
            );
            assert_eq!(
                d.figures.allocated,
                t.allocated,
                "{}: allocated",
                path.display()
            );
            assert_eq!(
                d.figures.segments,
                t.segments,
                "{}: segments",
                path.display()
            );
        }
        assert_eq!(p.figures.inconsistencies, 0, "{}", path.display());
    }
}

#[test]
fn at_n_is_the_state_after_n_events() {
    let path = dir("releases").join("torch-2.11-python.pickle");
    // The first event maps a 20 MiB segment, the second allocates in it.
    let at = |n: &str| open_json(&path, &["--at", n]);
    let fig = |v: &Value| v["state"]["processes"][0]["view"]["figures"].clone();
    let zero = fig(&at("0"));
    assert_eq!(zero["reserved"], 0);
    let one = fig(&at("1"));
    assert_eq!(one["reserved"], 20 << 20);
    assert_eq!(one["allocated"], 0);
    let two = fig(&at("2"));
    assert_eq!(two["allocated"], 4 << 20);
}

#[test]
fn frames_are_interned_and_shown_for_a_block() {
    let path = dir("releases").join("torch-2.11-all.pickle");
    let file = snapfile::read(&path).expect("reads");
    // Four Python frames and two C++ ones, shared by every event.
    assert_eq!(file.frames.len(), 6, "{:?}", file.frames);
    assert_eq!(file.stacks.len(), 3);
    let v = open_json(&path, &["--trace"]);
    assert_eq!(v["frames"].as_array().map(Vec::len), Some(6));
    let events = v["events"].as_array().expect("events");
    assert_eq!(events.len(), file.traces[0].len());
    assert!(events.iter().any(|e| e["stack"].is_u64()));
    let addr = file.segments[0].address;
    let out = common::succeeded(
        common::vramscope()
            .arg("open")
            .arg(&path)
            .arg("--frames")
            .arg(format!("0x{addr:x}"))
            .output()
            .expect("runs"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("train.py:88 train_step"), "{text}");
    assert!(text.contains("event 0: segment_alloc"), "{text}");
    // Issue 46, item 18: an address with no block and no event is not
    // found: one line, exit 1.
    let out = common::vramscope()
        .arg("open")
        .arg(&path)
        .args(["--frames", "0x1234"])
        .output()
        .expect("runs");
    assert!(out.stdout.is_empty());
    let err = common::exited_with(1, out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--frames 0x1234: no block and no trace event at that address"),
        "{err}"
    );
}

#[test]
fn an_oom_at_the_end_of_the_trace_is_reported() {
    let v = open_json(&dir("releases").join("torch-2.11-oom.pickle"), &[]);
    assert_eq!(v["trace"]["ends_in_oom"], true);
    let oom = &v["trace"]["ooms"][0];
    assert_eq!(oom["requested"], 200 << 20);
    assert_eq!(v["state"]["processes"][0]["view"]["ooms_total"], 1);
}

// ---- fields of newer releases (tests/fixtures/snapshots/newer) ----

#[test]
fn newer_releases_fields_read_to_the_figures_torch_reports() {
    assert_eq!(check_dir("newer"), 3, "metadata, host, fast");
}

/// `user_metadata`, `compile_context`, `internal_metadata`, `pool_id`, an
/// `annotate` entry and `external_annotations`: each in `open --json`,
/// none refused, none counted as unknown.
#[test]
fn trace_metadata_pools_and_annotations_are_in_open_json() {
    let v = open_json(&dir("newer").join("metadata.pickle"), &["--trace"]);
    assert_eq!(v["trace"]["unknown_actions"], 0);
    assert_eq!(v["trace"]["annotations"], 2);
    let a = &v["annotations"];
    assert_eq!(a[0]["name"], "forward");
    assert_eq!(a[0]["stage"], "START");
    assert_eq!(a[1]["stage"], "END");
    assert_eq!(a[1]["device"], 0);
    assert!(a[1]["time_us"].is_i64());
    let e = v["events"].as_array().expect("events");
    assert_eq!(e.len(), 8);
    assert_eq!(e[1]["user_metadata"], "comm-buffers");
    assert_eq!(e[1]["pool_id"], serde_json::json!([1, 0]));
    assert_eq!(e[2]["action"], "annotate");
    assert_eq!(e[2]["user_metadata"], "all-reduced first");
    assert_eq!(e[4]["compile_context"], "Torch-Compiled Region: 0/0");
    assert_eq!(e[5]["internal_metadata"], "mallocWithAddress");
    // What torch writes when nothing was set ("", "N/A", the default pool)
    // is left out.
    for k in ["user_metadata", "compile_context", "pool_id"] {
        assert!(e[6].get(k).is_none(), "{k}: {}", e[6]);
    }
    // A frame of FX-generated code keeps its node.
    let fx = v["frames"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "forward"))
        .expect("the fx frame");
    assert_eq!(fx["extra"]["fx_node_op"], "call_function");
    assert_eq!(fx["extra"]["fx_node_name"], "linear");
    let trace = fx["extra"]["fx_original_trace"].as_str();
    assert!(trace.is_some_and(|t| t.contains("self.proj(x)")), "{fx}");
    // The private pool's segment, in the model's state.
    let segs = &v["state"]["processes"][0]["view"]["devices"][0]["segments"];
    assert_eq!(segs[0]["pool"], serde_json::json!([1, 0]));
    assert_eq!(segs[1]["pool"], serde_json::json!([0, 0]));
}

/// Where stacks are shown (`--frames`, the dashboard's stack overlay), a
/// block's and an event's metadata, annotations and private pool are too.
#[test]
fn frames_and_the_stack_overlay_show_metadata_and_annotations() {
    let path = dir("newer").join("metadata.pickle");
    let out = common::succeeded(
        common::vramscope()
            .arg("open")
            .arg(&path)
            .args(["--frames", "0x7f0000000000"])
            .output()
            .expect("runs"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(private pool (1, 0))"), "{text}");
    assert!(text.contains("event 2: annotate"), "{text}");
    assert!(text.contains("user metadata: all-reduced first"), "{text}");
    let file = snapfile::read(&path).expect("reads");
    let mut stepper = vramscope_collect::trace::Stepper::new(file, "metadata.pickle");
    let status = stepper.seek(&Hub::default(), 3, 10_000_000_000);
    assert_eq!(
        status.event,
        "annotate 0x7f0000000000 on device 0: all-reduced first"
    );
    let block = &status.stacks[1];
    for want in [
        "private pool (1, 0)",
        "user metadata: comm-buffers",
        "annotated: all-reduced first",
        "train.py:57 training_step",
    ] {
        assert!(block.1.iter().any(|l| l == want), "{want}: {block:?}");
    }
    let status = stepper.seek(&Hub::default(), 5, 10_000_000_000);
    let event = &status.stacks[0].1;
    assert_eq!(event[0], "compile context: Torch-Compiled Region: 0/0");
    assert_eq!(
        event[1],
        "/tmp/torchinductor/fx_graph.py:12 forward (fx call_function linear)"
    );
}

/// Pinned host memory (`host_segments`, `host_traces`) is read and
/// counted apart: no device gains it.
#[test]
fn pinned_host_memory_is_counted_apart_from_the_devices() {
    let v = open_json(&dir("newer").join("host.pickle"), &[]);
    assert_eq!(v["format"], "torch ≥ 2.14 (host_segments)");
    assert_eq!(v["devices"], serde_json::json!([]));
    assert_eq!(v["host"]["segments"], 1);
    assert_eq!(v["host"]["reserved"], 8 << 20);
    assert_eq!(v["host"]["allocated"], 8 << 20);
    assert_eq!(v["host"]["trace_entries"], 2);
}

/// A "fast" snapshot (`include_traces=False`): the state, no trace.
#[test]
fn a_fast_snapshot_opens_at_its_state() {
    let v = open_json(&dir("newer").join("fast.pickle"), &[]);
    assert_eq!(v["trace"]["entries"], serde_json::json!([0]));
    assert_eq!(
        v["state"]["processes"][0]["view"]["figures"]["reserved"],
        22 << 20
    );
}

// ---- refusals: one line naming the file, the offset and what is wrong ----

fn refusal(name: &str, bytes: &[u8]) -> String {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join(name);
    std::fs::write(&path, bytes).expect("write");
    let out = common::vramscope()
        .arg("open")
        .arg(&path)
        .arg("--json")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{name} must be refused");
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).expect("UTF-8");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&path.display().to_string()),
        "names the file: {err}"
    );
    err
}

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(dir("releases").join("torch-2.11-python.pickle")).expect("fixture")
}

#[test]
fn a_truncated_file_is_refused() {
    let b = fixture_bytes();
    let err = refusal("cut.pickle", &b[..b.len() / 2]);
    assert!(err.contains("at offset "), "{err}");
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_corrupt_file_is_refused() {
    let mut b = fixture_bytes();
    let i = b.len() / 3;
    b[i] = 0xfe; // no opcode
    b[i + 1] = 0xfe;
    let err = refusal("corrupt.pickle", &b);
    assert!(err.contains("at offset "), "{err}");
}

#[test]
fn a_file_asking_to_run_code_is_refused() {
    // pickle.dumps(os.system) with a call: the classic exploit.
    let err = refusal(
        "evil.pickle",
        b"\x80\x04cposix\nsystem\n\x8c\x05touch\x85R.",
    );
    assert!(err.contains("at offset 2"), "{err}");
    assert!(err.contains("GLOBAL posix.system"), "{err}");
    let err = refusal(
        "evil4.pickle",
        b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.",
    );
    assert!(err.contains("STACK_GLOBAL posix.system"), "{err}");
    let err = refusal("reduce.pickle", b"\x80\x04)\x8c\x01x\x94R.");
    assert!(err.contains("REDUCE"), "{err}");
}

#[test]
fn a_file_of_another_format_is_refused() {
    let err = refusal("a.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    assert!(err.contains("at offset"), "{err}");
    // A pickle of something else: a list of ints, a dict of other keys.
    let err = refusal("list.pickle", b"\x80\x04]\x94(K\x01K\x02e.");
    assert!(err.contains("a int where a dict was expected"), "{err}");
    // The first int: after PROTO, EMPTY_LIST, MEMOIZE, MARK.
    assert!(err.contains("at offset 5 (segments[0])"), "{err}");
    let err = refusal("dict.pickle", b"\x80\x04}\x94\x8c\x05model\x94K\x01s.");
    assert!(err.contains("not a PyTorch memory snapshot"), "{err}");
    assert!(err.contains("model"), "{err}");
    let err = refusal("empty.pickle", b"");
    assert!(err.contains("empty"), "{err}");
}

/// `{'segments': [S] * n}` with S one segment dict shared through the memo:
/// a few bytes that would expand into n segments.
fn fan_out(n: usize) -> Vec<u8> {
    let mut b = b"\x80\x04}\x94\x8c\x08segments\x94]\x94(".to_vec();
    b.extend(b"}\x94(\x8c\x07address\x94K\x00\x8c\ntotal_size\x94K\x01u");
    for _ in 1..n {
        b.extend(b"h\x03");
    }
    b.extend(b"es.");
    b
}

#[test]
fn bombs_are_refused() {
    // Memo fan-out past the bound on segments.
    let err = refusal("fan.pickle", &fan_out(snapfile::MAX_SEGMENTS + 1));
    assert!(err.contains("65537 segments, more than 65536"), "{err}");
    assert!(err.contains("at offset 15 (segments)"), "{err}");
    // A string claiming more bytes than the file has.
    let err = refusal(
        "long.pickle",
        b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40abc.",
    );
    assert!(err.contains("at offset 2"), "{err}");
    assert!(err.contains("bytes are left"), "{err}");
    // Nesting without end.
    let err = refusal("deep.pickle", &vec![b'('; 5000]);
    assert!(err.contains("deeper than"), "{err}");
    // Values far larger than the file.
    let mut b = b"\x80\x04".to_vec();
    for _ in 0..10_000_000 {
        b.extend(b"]0");
    }
    let err = refusal("many.pickle", &b);
    assert!(err.contains("a bomb"), "{err}");
}

#[test]
fn a_fan_out_under_the_bound_reads() {
    let file = snapfile::read_slice(&fan_out(1000)).expect("reads");
    assert_eq!(file.segments.len(), 1000);
}

/// Every fixture reads taking entries while parsing (the usual way) to
/// exactly what the plain reading (every value kept, then walked) reads;
/// and what the fuzzer found, where it reads that way, to the same too
/// (stacks and frames numbered alike).
#[test]
fn reading_while_parsing_reads_what_the_plain_reading_reads() {
    let mut n = 0;
    for name in ["releases", "torch-2.11", "newer"] {
        let Ok(entries) = std::fs::read_dir(dir(name)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "pickle") {
                continue;
            }
            let bytes = std::fs::read(&path).expect("read");
            let plain = snapfile::read_slice_plain(&bytes).expect("reads");
            let taking = snapfile::read_slice_taking(&bytes)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(taking, plain, "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 123, "{n} fixtures");
    for entry in std::fs::read_dir(dir("fuzz")).expect("fuzz dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read");
        let plain = snapfile::read_slice_plain(&bytes);
        if let Ok(taking) = snapfile::read_slice_taking(&bytes) {
            assert_eq!(Ok(taking), plain, "{}", path.display());
        }
        // unread-key-stacks.pickle: trace entries under a key the reader
        // does not know, taken while parsing, left stacks nothing named;
        // stack-order.pickle: a damaged segment read after the next one
        // interned their stacks in another order; settings-taken.pickle:
        // a dict in the allocator settings was taken as a segment;
        // frames-still-filling.pickle: an entry's frames named the trace
        // list itself, empty when the entry was taken.
        assert_eq!(snapfile::read_slice(&bytes), plain, "{}", path.display());
    }
}

/// Inputs the fuzzer found (tests/fixtures/snapshots/fuzz): each reads or
/// is refused, and what reads is shown without a panic.
#[test]
fn fuzz_found_inputs_are_handled() {
    for entry in std::fs::read_dir(dir("fuzz")).expect("fuzz dir") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("read");
        if let Ok(file) = snapfile::read_slice(&bytes) {
            let hub = Hub::default();
            for (_, input) in inputs::inputs(&file, "f", inputs::Plan::default()) {
                hub.apply(input);
            }
        }
    }
}
