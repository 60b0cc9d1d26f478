//! The simulator's trace reader (`parse_trace`) on arbitrary text:
//! `scripts/fuzz.sh trace 600`. Seeds: `tests/fixtures/sim/*.jsonl`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope_core::sim::trace::parse_trace;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(reqs) = parse_trace(&text) {
        // Each request comes from one non-empty line.
        assert!(reqs.len() <= text.lines().count());
    }
});
