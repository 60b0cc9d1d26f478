//! The header parser on arbitrary bytes: `cargo fuzz run header`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope_wire::ring::layout::{parse_header, Parsed};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let size = u64::from_le_bytes(data[..8].try_into().unwrap()) % (1 << 32);
    let bytes = &data[8..];
    for file_size in [bytes.len() as u64, size] {
        if let Ok(Parsed::Ready(h)) = parse_header(bytes, file_size) {
            for r in &h.rings {
                assert!(r.offset + r.bytes() <= h.segment_size);
            }
        }
    }
});
