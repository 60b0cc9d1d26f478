//! `vramscope open`'s reader on pickles whose memo entries are shared many
//! times: `scripts/fuzz.sh snapshot_shared 600`. The dictionary
//! (`fuzz/snapshot_shared.dict`) holds the opcodes of memo sharing
//! (MEMOIZE, BINPUT, BINGET and their long forms, MARK, APPENDS,
//! SETITEMS, POP_MARK …) and a snapshot's keys; the seeds
//! (`fuzz/seeds/snapshot_shared`, written by `scripts/fuzz_seeds_shared.py`)
//! are small snapshots whose segments, blocks, frames, filenames, stacks,
//! settings and trace entries are memo references shared many times, with
//! nested marks and expandable segments mapped and unmapped.
//!
//! Each input is read as `open` reads it (taking values while parsing,
//! then plainly, which must agree), then shown as `open` shows it: the
//! timeline, the state before the trace, the inputs fed a chunk at a time,
//! every stack's lines (as `--frames` and the OOMs print them). The peak
//! memory of all
//! that (VmHWM, reset before each input) must stay within the bound, 4 ×
//! the input + 64 MiB; libFuzzer's `-timeout` catches a reading that is
//! not about linear in the input. The model the inputs are then applied to
//! has bounds of its own: only `-rss_limit_mb` watches it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use vramscope_collect::Hub;
use vramscope_core::pickle;
use vramscope_core::snapfile::{inputs, lines};

mod both_ways;
#[path = "../../tests/common/proc_status.rs"]
mod proc_status;

/// A field of `/proc/self/status`, bytes.
fn status(field: &str) -> Option<u64> {
    proc_status::status_bytes("self", field)
}

fuzz_target!(|data: &[u8]| {
    // The peak from here on (Linux: "5" resets VmHWM to VmRSS).
    let watched = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = status("VmRSS:").unwrap_or(0);

    let Some(file) = both_ways::read(data) else {
        return;
    };
    // What `open` builds to show it, the model apart.
    let timeline = inputs::timeline(&file);
    let start = inputs::starting_state(&file);
    let mut fed = 0usize;
    inputs::feed(&file, "fuzz", inputs::Plan::default(), &start, &mut |_, _| {
        fed += 1
    });
    let half = inputs::Plan {
        upto: Some(timeline.len() / 2),
    };
    inputs::feed(&file, "fuzz", half, &start, &mut |_, _| fed += 1);
    assert!(fed > 0);
    let mut lines = 0usize;
    for id in 0..file.stacks.len() as u32 {
        for line in lines::stack_line_iter(&file, Some(id)) {
            assert!(line.len() <= lines::MAX_LINE + '…'.len_utf8());
            lines += 1;
        }
    }
    assert!(lines <= file.stacks.len() * (lines::MAX_STACK_LINES + 1));
    drop((timeline, start));

    if watched {
        let peak = status("VmHWM:").unwrap_or(0);
        let grew = peak.saturating_sub(before);
        let bound = pickle::bound(data.len() as u64) as u64;
        assert!(
            grew <= bound,
            "reading and showing {} bytes took {grew} bytes, over the bound of {bound}",
            data.len()
        );
    }

    // The model, under its own bounds.
    let hub = Hub::default();
    let start = inputs::starting_state(&file);
    inputs::feed(&file, "fuzz", inputs::Plan::default(), &start, &mut |_, input| {
        hub.apply(input)
    });
});
