//! The recording reader (`Replayer`) on an arbitrary file:
//! `scripts/fuzz.sh recording 600`. Half of the inputs get a valid 16-byte
//! file header spliced in front, so the fuzzer spends its time in the frames.
#![no_main]
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vramscope_core::recording::{Replayer, MAGIC, MAJOR};

/// One file per fuzzing process, rewritten for every input.
fn scratch() -> &'static PathBuf {
    static P: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &P.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.vsrec");
        (dir, p)
    })
    .1
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    let mut f = std::fs::File::create(path).unwrap();
    if data.first().is_some_and(|b| b & 1 == 1) && !data.starts_with(MAGIC) {
        let minor = data.get(1).copied().unwrap_or(0) as u16 % 3;
        f.write_all(MAGIC).unwrap();
        f.write_all(&MAJOR.to_le_bytes()).unwrap();
        f.write_all(&minor.to_le_bytes()).unwrap();
        f.write_all(&[0; 4]).unwrap();
        f.write_all(&data[1..]).unwrap();
    } else {
        f.write_all(data).unwrap();
    }
    drop(f);
    let Ok(mut r) = Replayer::open(path).map(Replayer::quiet) else {
        return;
    };
    let _ = r.minor();
    // Every frame is at least 13 bytes, so this bounds the loop; an error
    // ends the file (a reader reports it and stops).
    for _ in 0..=data.len() / 13 + 1 {
        match r.next_input() {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    let _ = r.skipped_inputs();
});
