//! The simulator pinned to real PyTorch: allocation traces recorded on a GPU
//! (`tests/gpu/record_sim_fixtures.py`, committed under
//! `tests/fixtures/sim/`) are replayed, and after every request the
//! simulator must show the same allocated and reserved bytes, segment count,
//! segment sizes, retries and OOMs as PyTorch did.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use vramscope_core::sim::{AllocConf, NullSink, SimAllocator, SimConfig};
use vramscope_wire::event::EventKind;

fn segment_sizes(a: &mut SimAllocator) -> Vec<u64> {
    let mut ev = Vec::new();
    a.snapshot(&mut ev);
    let mut sizes: Vec<u64> = ev
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::SnapshotSegment { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

/// The simulated device and allocator a recording's header describes.
fn config(header: &Value) -> SimConfig {
    SimConfig {
        capacity: header["capacity"].as_u64().unwrap(),
        alloc: AllocConf::parse(header["conf"].as_str().unwrap()).unwrap(),
        memory_fraction: header["fraction"].as_f64(),
        ..SimConfig::default()
    }
}

/// Applies one recorded request; `addrs` maps live ids to addresses.
/// Returns whether it ran out of memory.
fn apply(a: &mut SimAllocator, addrs: &mut HashMap<u64, u64>, r: &Value) -> bool {
    let id = || r["id"].as_u64().unwrap();
    match r["op"].as_str().unwrap() {
        "alloc" => match a.malloc(
            r["size"].as_u64().unwrap(),
            r["stream"].as_u64().unwrap(),
            &mut NullSink,
        ) {
            Ok(addr) => {
                addrs.insert(id(), addr);
            }
            Err(_) => return true,
        },
        "free" => {
            if let Some(addr) = addrs.remove(&id()) {
                a.free(addr, &mut NullSink).unwrap();
            }
        }
        "empty_cache" => a.empty_cache(&mut NullSink),
        other => panic!("unknown op {other}"),
    }
    false
}

/// (allocated, reserved, segments, retries, ooms, oom) as the simulator has
/// them and as a request's `expect` object recorded them.
type Figures = (u64, u64, u64, u64, u64, bool);

fn figures(a: &SimAllocator, oom: bool) -> Figures {
    let s = a.stats();
    (
        s.allocated,
        s.reserved,
        s.segments,
        s.alloc_retries,
        s.ooms,
        oom,
    )
}

fn recorded(e: &Value) -> Figures {
    let n = |k: &str| e[k].as_u64().unwrap();
    (
        n("allocated"),
        n("reserved"),
        n("segments"),
        n("alloc_retries"),
        n("ooms"),
        e["oom"].as_bool().unwrap(),
    )
}

fn check(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(
        header["baseline_reserved"],
        0,
        "{}: the recording started dirty",
        path.display()
    );
    let mut a = SimAllocator::new(config(&header));
    let mut addrs: HashMap<u64, u64> = HashMap::new();
    let mut n = 0;
    for (i, line) in lines.enumerate() {
        let r: Value = serde_json::from_str(line).unwrap();
        let oom = apply(&mut a, &mut addrs, &r);
        let e = &r["expect"];
        assert_eq!(
            figures(&a, oom),
            recorded(e),
            "{} request {} ({line}): (allocated, reserved, segments, retries, ooms, oom)",
            path.display(),
            i + 1
        );
        let want_sizes: Vec<u64> = e["segment_sizes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(
            segment_sizes(&mut a),
            want_sizes,
            "{} request {}: segment sizes",
            path.display(),
            i + 1
        );
        n += 1;
    }
    n
}

#[test]
fn simulator_reproduces_recorded_pytorch_traces() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sim");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        println!("SKIPPED: no recorded traces in {} (record them with tests/gpu/record_sim_fixtures.py on a GPU)", dir.display());
        return;
    }
    for f in &files {
        let n = check(f);
        println!("{}: {n} requests match PyTorch", f.display());
    }
}
