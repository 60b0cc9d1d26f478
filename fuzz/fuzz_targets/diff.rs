//! `vramscope diff` over pairs of inputs: `scripts/fuzz.sh diff 600`.
//! Each input is cut in two files, A and B (a recording, a PyTorch
//! snapshot pickle, or neither), read as `diff` reads a file given to it
//! (`vramscope_collect::given`, from memory as a pipe's bytes are), profiled and
//! compared. Byte 0 says which files get a valid recording header spliced
//! in front (bit 0: A, bit 1: B), so that the fuzzer spends time in the
//! frames; bytes 1–4 (little-endian) where the rest is cut. Seeded with
//! pairs of the snapshot and recording fixtures (`fuzz/seeds/diff`).
//!
//! Beyond no panic, hang or runaway memory: a run compared with itself
//! never parts and changes nothing, and the comparison serializes.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vramscope_collect::given::Given;
use vramscope_core::model::rundiff::compare;
use vramscope_core::recording::{MAGIC, MAJOR};

/// `body`, with a valid recording header in front when `header` (and it
/// has none).
fn file(body: &[u8], header: bool) -> Vec<u8> {
    if !header || body.starts_with(MAGIC) {
        return body.to_vec();
    }
    let minor = body.first().copied().unwrap_or(0) as u16 % 3;
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&MAJOR.to_le_bytes());
    out.extend_from_slice(&minor.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(body);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<5>() else {
        return;
    };
    let cut = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize % (rest.len() + 1);
    let (a, b) = rest.split_at(cut);
    let a = Given::from_bytes(Path::new("a"), file(a, head[0] & 1 != 0)).quiet();
    let b = Given::from_bytes(Path::new("b"), file(b, head[0] & 2 != 0)).quiet();
    let (Ok(pa), pb) = (a.profile(None), b.profile(None)) else {
        return;
    };
    let same = compare(&pa, &pa);
    assert_eq!(same.parted_at, None, "a run parts from itself");
    assert!(
        same.figures.iter().all(|r| r.change() == 0),
        "a run differs from itself: {:?}",
        same.figures
    );
    assert!(
        same.by_phase
            .iter()
            .chain(&same.by_module)
            .all(|r| r.change() == 0),
        "a run's breakdown differs from itself"
    );
    if let Ok(pb) = pb {
        let d = compare(&pa, &pb);
        serde_json::to_string(&d).expect("the comparison serializes");
    }
});
