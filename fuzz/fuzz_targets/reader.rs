//! The whole reader on an arbitrary segment file: `cargo fuzz run reader`.
//! The input is the file; a valid header is spliced in half of the time so the
//! fuzzer reaches the rings and the control block.
#![no_main]
use std::os::unix::fs::PermissionsExt;

use libfuzzer_sys::fuzz_target;
use vramscope_wire::ring::discover::{current_uid, segment_name};
use vramscope_wire::ring::{Command, Producer, SegmentConfig, SegmentReader, SegmentWriter};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = data.to_vec();
    if data.first().is_some_and(|b| b & 1 == 1) {
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 16);
        cfg.tag = Some("tmpl".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        let mut good = std::fs::read(seg.path()).unwrap();
        let n = bytes.len().min(good.len());
        // Keep the first 64 bytes valid, take the rest from the input.
        if n > 64 {
            good[64..n].copy_from_slice(&bytes[64..n]);
        }
        bytes = good;
    }
    let path = dir
        .path()
        .join(segment_name(current_uid(), 1, Some("fuzz")).unwrap());
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Ok(mut r) = SegmentReader::open(&path) {
        r.drain(10_000, |_, _| {});
        let _ = r.command(Command::Ping { value: 1 }, std::time::Duration::ZERO);
    }
});
