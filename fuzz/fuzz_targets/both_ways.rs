//! What the snapshot-file targets (`snapshot`, `snapshot_shared`) share:
//! each input read both ways `open` reads it. Included by each target as a
//! module of its own (`mod both_ways;`); not a target.

use vramscope_core::snapfile::{self, SnapshotFile};

/// Reads `data` taking values while parsing (the arena cut back under
/// them) and plainly (every value kept): what the first reads, the second
/// must read the same, or meet its bound on memory and say so. The file,
/// when either reads it.
pub fn read(data: &[u8]) -> Option<SnapshotFile> {
    let taking = snapfile::read_slice_taking(data);
    let plain = snapfile::read_slice_plain(data);
    if let Ok(t) = &taking {
        match &plain {
            Ok(p) => assert_eq!(t, p, "taking and plain readings differ"),
            // The plain reading holds the whole pickle: it meets the bound
            // on memory sooner, and then says so.
            Err(e) => assert!(
                e.contains("4 × its size + 64 MiB"),
                "what reads taking values reads plainly, or meets the bound: {e}"
            ),
        }
    }
    taking.or(plain).ok()
}
