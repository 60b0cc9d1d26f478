//! PyTorch's block rules, as far as the model needs them to infer block
//! boundaries from events that only carry the caller's request. The rules
//! themselves live in `crate::pytorch` (one implementation, pinned by the
//! simulator's tests); this is the one place where the model guesses.

use serde::{Deserialize, Serialize};

use crate::pytorch::{self as pt, K_SMALL_BUFFER};
use vramscope_wire::event::SegmentPool;

/// The allocator settings the inference depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRules {
    /// `max_split_size_mb` from `PYTORCH_CUDA_ALLOC_CONF`, in bytes
    /// (`u64::MAX` when unset, as PyTorch's default).
    pub(crate) max_split_size: u64,
}

impl Default for BlockRules {
    fn default() -> Self {
        Self {
            max_split_size: pt::UNLIMITED_SPLIT_SIZE,
        }
    }
}

/// `round_size` with the default configuration (no power-of-two rounding,
/// which the model cannot see from events).
pub(crate) fn round_size(request: u64) -> u64 {
    pt::round_size_default(request)
}

/// The pool a rounded request is served from.
pub(crate) fn pool_for(rounded: u64) -> SegmentPool {
    pt::pool_for_size(rounded)
}

/// Best guess of the pool of a freshly `cudaMalloc`ed segment from its size
/// alone (small-pool segments are exactly 2 MiB; large ones never are). The
/// first allocation that lands in it confirms or corrects the guess.
pub(crate) fn segment_pool_guess(segment_size: u64) -> SegmentPool {
    if segment_size == K_SMALL_BUFFER {
        SegmentPool::Small
    } else {
        SegmentPool::Large
    }
}

impl BlockRules {
    /// The size of the block handed out when a request of `request` bytes is
    /// served from the start of a free block of `free` bytes
    /// (`should_split`): the rounded size when the remainder is split off,
    /// else the whole free block. Never more than `free`.
    pub(crate) fn carve(&self, request: u64, free: u64, expandable: bool) -> u64 {
        let rounded = round_size(request);
        if rounded >= free {
            return free;
        }
        if pt::should_split(
            free,
            rounded,
            pool_for(rounded),
            expandable,
            self.max_split_size,
        ) {
            rounded
        } else {
            free
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(u64::MAX - 3), u64::MAX);
    }

    #[test]
    fn carve_small_and_large() {
        let r = BlockRules::default();
        // Small pool: remainder of 512 B is split off, of 0 not.
        assert_eq!(r.carve(100, 1024, false), 512);
        assert_eq!(r.carve(600, 1024, false), 1024);
        // Large pool: remainder must exceed 1 MiB.
        let mib = 1 << 20;
        assert_eq!(r.carve(2 * mib, 3 * mib, false), 3 * mib);
        assert_eq!(r.carve(2 * mib, 3 * mib + 512, false), 2 * mib);
        // ... unless the segment is expandable.
        assert_eq!(r.carve(2 * mib, 3 * mib, true), 2 * mib);
        // max_split_size: oversize requests take the whole block.
        let r = BlockRules {
            max_split_size: 4 * mib,
        };
        assert_eq!(r.carve(5 * mib, 20 * mib, false), 20 * mib);
        assert_eq!(r.carve(3 * mib, 20 * mib, false), 3 * mib);
        // A block too small is handed out whole (the caller flags it).
        assert_eq!(r.carve(4096, 512, false), 512);
    }
}
