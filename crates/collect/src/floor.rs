//! The live path's floor (issue 28), for measuring only: compiled with the
//! `live-floor` feature, never into the binary users install. With
//! `VRAMSCOPE_LIVE_FLOOR` set, a watcher drains, decodes and merges every
//! record as always but hands none to the model:
//!
//! - `none`: each record is only read (its time summed): what the path
//!   costs around the model;
//! - `map`: one table of live blocks per process, an address inserted at
//!   each allocation and removed at each free, the allocated bytes summed:
//!   the least an exact figure needs.
//!
//! `benches/LIVE_RESULTS.md` ("Eighth round") says how it was used.

use std::collections::HashMap;
use std::sync::OnceLock;

use vramscope_core::model::ProcessKey;
use vramscope_wire::event::{Event, EventKind, RingPos};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Floor {
    None,
    Map,
}

fn floor() -> Option<Floor> {
    static FLOOR: OnceLock<Option<Floor>> = OnceLock::new();
    *FLOOR.get_or_init(|| match std::env::var("VRAMSCOPE_LIVE_FLOOR").as_deref() {
        Ok("none") => Some(Floor::None),
        Ok("map") => Some(Floor::Map),
        _ => None,
    })
}

/// Per process: its live blocks and their allocated bytes (`map`).
#[derive(Default)]
pub(crate) struct Blocks(HashMap<ProcessKey, (HashMap<u64, u64>, u64)>);

impl Blocks {
    /// Takes the records instead of the model when a floor is asked for;
    /// false when none is (the model takes them).
    pub(crate) fn apply<'a>(
        &mut self,
        key: ProcessKey,
        records: impl Iterator<Item = (&'a Event, RingPos)>,
    ) -> bool {
        match floor() {
            None => false,
            Some(Floor::None) => {
                let t = records.fold(0u64, |t, (e, _)| t.wrapping_add(e.time_ns));
                std::hint::black_box(t);
                true
            }
            Some(Floor::Map) => {
                let (live, bytes) = self.0.entry(key).or_default();
                for (e, _) in records {
                    match e.kind {
                        EventKind::Alloc { addr, size, .. } => {
                            let old = live.insert(addr, size).unwrap_or(0);
                            *bytes = bytes.wrapping_add(size).wrapping_sub(old);
                        }
                        EventKind::FreeRequested { addr, .. } => {
                            *bytes = bytes.wrapping_sub(live.remove(&addr).unwrap_or(0));
                        }
                        _ => {}
                    }
                }
                std::hint::black_box(*bytes);
                true
            }
        }
    }
}
