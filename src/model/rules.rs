//! PyTorch's block rules, as far as the model needs them to infer block
//! boundaries from events that only carry the caller's request.
//!
//! This is the one place where the model guesses. The simulator
//! (`sim::rules`) owns the full rule set; when both exist, this file should
//! become a thin call into it.

use serde::{Deserialize, Serialize};

use crate::event::SegmentPool;

/// Every block is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// Largest "small" request (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Size of a small-pool segment (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Size of a large-pool segment for requests below 10 MiB (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 << 20;

/// The allocator settings the inference depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRules {
    /// `max_split_size_mb` from `PYTORCH_CUDA_ALLOC_CONF`, in bytes
    /// (`u64::MAX` when unset, as PyTorch's default).
    pub max_split_size: u64,
}

impl Default for BlockRules {
    fn default() -> Self {
        Self {
            max_split_size: u64::MAX,
        }
    }
}

/// `round_size`: a request rounded up to a multiple of 512 B (at least 512).
/// (Ignores `roundup_power2_divisions`, which is off by default.)
pub fn round_size(request: u64) -> u64 {
    if request <= MIN_BLOCK {
        MIN_BLOCK
    } else {
        request.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
    }
}

/// The pool a rounded request is served from.
pub fn pool_for(rounded: u64) -> SegmentPool {
    if rounded <= SMALL_SIZE {
        SegmentPool::Small
    } else {
        SegmentPool::Large
    }
}

/// Best guess of the pool of a freshly `cudaMalloc`ed segment from its size
/// alone (small-pool segments are exactly 2 MiB; large ones never are). The
/// first allocation that lands in it confirms or corrects the guess.
pub fn segment_pool_guess(segment_size: u64) -> SegmentPool {
    if segment_size == SMALL_BUFFER {
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
    pub fn carve(&self, request: u64, free: u64, expandable: bool) -> u64 {
        let rounded = round_size(request);
        if rounded >= free {
            return free;
        }
        let remaining = free - rounded;
        let split = match pool_for(rounded) {
            SegmentPool::Small => remaining >= MIN_BLOCK,
            // Expandable segments split like the small pool.
            SegmentPool::Large if expandable => remaining >= MIN_BLOCK,
            SegmentPool::Large => rounded < self.max_split_size && remaining > SMALL_SIZE,
        };
        if split {
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
