//! The simulator pinned to real PyTorch: allocation traces recorded on a GPU
//! (`tests/gpu/record_sim_fixtures.py`, committed under
//! `tests/fixtures/sim/`) are replayed, and after every request the
//! simulator must show the same allocated and reserved bytes, segment count,
//! segment sizes, retries and OOMs as PyTorch did.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use vramscope::event::EventKind;
use vramscope::sim::{AllocConf, SimAllocator, SimConfig};

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
    let cfg = SimConfig {
        capacity: header["capacity"].as_u64().unwrap(),
        alloc: AllocConf::parse(header["conf"].as_str().unwrap()).unwrap(),
        memory_fraction: header["fraction"].as_f64(),
        ..SimConfig::default()
    };
    let mut a = SimAllocator::new(cfg);
    let mut sink = Vec::new();
    let mut addrs: HashMap<u64, u64> = HashMap::new();
    let mut n = 0;
    for (i, line) in lines.enumerate() {
        let r: Value = serde_json::from_str(line).unwrap();
        let mut oom = false;
        match r["op"].as_str().unwrap() {
            "alloc" => match a.malloc(
                r["size"].as_u64().unwrap(),
                r["stream"].as_u64().unwrap(),
                &mut sink,
            ) {
                Ok(addr) => {
                    addrs.insert(r["id"].as_u64().unwrap(), addr);
                }
                Err(_) => oom = true,
            },
            "free" => {
                if let Some(addr) = addrs.remove(&r["id"].as_u64().unwrap()) {
                    a.free(addr, &mut sink).unwrap();
                }
            }
            "empty_cache" => a.empty_cache(&mut sink),
            other => panic!("unknown op {other}"),
        }
        sink.clear();
        let e = &r["expect"];
        let s = a.stats();
        let got = (
            s.allocated,
            s.reserved,
            s.segments,
            s.alloc_retries,
            s.ooms,
            oom,
        );
        let want = (
            e["allocated"].as_u64().unwrap(),
            e["reserved"].as_u64().unwrap(),
            e["segments"].as_u64().unwrap(),
            e["alloc_retries"].as_u64().unwrap(),
            e["ooms"].as_u64().unwrap(),
            e["oom"].as_bool().unwrap(),
        );
        assert_eq!(
            got,
            want,
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
