//! The snapshot-file reader (restricted pickle reader, then the snapshot's
//! shape) on arbitrary bytes: `scripts/fuzz.sh snapshot 600`. Seeded with
//! the snapshot fixtures of every release. A file that reads is also turned
//! into the model's inputs and applied, and written back and read again:
//! what the writer writes must read back to the same snapshot. Each input
//! is read both ways (taking values while parsing, and plainly), which must
//! agree.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope_collect::Hub;
use vramscope_core::snapfile::{self, inputs, write};

mod both_ways;

fuzz_target!(|data: &[u8]| {
    // Values taken while parsing (the arena cut back under them) must read
    // to what the plain reading, every value kept, reads.
    let Some(file) = both_ways::read(data) else {
        return;
    };
    let hub = Hub::default();
    for (_, input) in inputs::inputs(&file, "fuzz", inputs::Plan::default()) {
        hub.apply(input);
    }
    let mut out = Vec::new();
    write::write(&file, &mut out).expect("writing to memory");
    let again = snapfile::read_slice(&out).expect("what the writer writes reads back");
    assert_eq!(again.segments, file.segments);
    assert_eq!(again.traces, file.traces);
    assert_eq!(again.stacks.len(), file.stacks.len());
});
