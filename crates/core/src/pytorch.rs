//! The size rules of PyTorch's CUDA caching allocator, as pure functions.
//!
//! Everything here mirrors `c10/cuda/CUDACachingAllocator.cpp`
//! (`DeviceCachingAllocator`) and `c10/core/AllocatorConfig.cpp`
//! (`AllocatorConfig::roundup_power2_divisions`) of PyTorch 2.x; the
//! function names below are the C++ names. The module has no state and no
//! dependency on the rest of the simulator, so the model can use it to infer
//! block and segment boundaries from events.
//!
//! Vocabulary: a *request* is what the caller asked for (`orig_size`), the
//! *rounded size* is `round_size(request)` (the block the caller gets), the
//! *allocation size* is what `cudaMalloc` is asked for when no cached block
//! fits (`get_allocation_size(rounded)`).

use vramscope_wire::event::SegmentPool;

/// All sizes are rounded to at least 512 bytes (`kMinBlockSize`).
pub(crate) const K_MIN_BLOCK_SIZE: u64 = 512;
/// The largest "small" request: 1 MiB (`kSmallSize`). Rounded sizes `<=` this
/// go to the small pool.
pub(crate) const K_SMALL_SIZE: u64 = 1 << 20;
/// Small requests are packed into 2 MiB segments (`kSmallBuffer`); also the
/// page size of small-pool expandable segments.
pub(crate) const K_SMALL_BUFFER: u64 = 2 << 20;
/// Large requests below `kMinLargeAlloc` get a 20 MiB segment (`kLargeBuffer`);
/// also the page size of large-pool expandable segments and the default
/// `max_non_split_rounding_size`.
pub(crate) const K_LARGE_BUFFER: u64 = 20 << 20;
/// Requests between 1 and 10 MiB may use a `kLargeBuffer` segment (`kMinLargeAlloc`).
pub(crate) const K_MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Larger requests are rounded up to 2 MiB for `cudaMalloc` (`kRoundLarge`).
pub(crate) const K_ROUND_LARGE: u64 = 2 << 20;

/// Number of `roundup_power2_divisions` intervals: one per power of two from
/// 1 MiB up to 64 GiB (`kRoundUpPowerOfTwoIntervals`).
pub(crate) const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Per-interval division counts; index `i` covers sizes in
/// `[2^i MiB, 2^(i+1) MiB)`, sizes below 1 MiB use index 0 and sizes from
/// 32 GiB up use index 15. A value `0` or `1` disables power-of-two rounding.
pub(crate) type RoundupDivisions = [u64; ROUNDUP_POWER2_INTERVALS];

/// The default: no power-of-two rounding anywhere.
pub(crate) const NO_ROUNDUP_DIVISIONS: RoundupDivisions = [0; ROUNDUP_POWER2_INTERVALS];

/// The default `max_split_size` ("unlimited", `std::numeric_limits<size_t>::max()`).
pub(crate) const UNLIMITED_SPLIT_SIZE: u64 = u64::MAX;

fn floor_log2(x: u64) -> u32 {
    debug_assert!(x > 0);
    63 - x.leading_zeros()
}

/// The index into [`RoundupDivisions`] for a size
/// (`AllocatorConfig::roundup_power2_divisions(size)`).
pub(crate) fn roundup_power2_index(size: u64) -> usize {
    let log_size = floor_log2(size.max(1)) as i64;
    let start = floor_log2(1 << 20) as i64; // 1 MiB
    (log_size - start).clamp(0, ROUNDUP_POWER2_INTERVALS as i64 - 1) as usize
}

/// Rounds `size` up to the next of `divisions` equal steps between the
/// surrounding powers of two (`roundup_power2_next_division`). For example
/// 1200 with 4 divisions lies in [1024, 2048), whose steps are 1024, 1280,
/// 1536, 1792: the result is 1280. Powers of two are returned unchanged.
///
/// `divisions` must be a power of two `>= 2` (the config parser guarantees it).
pub(crate) fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    assert!(divisions >= 2, "Only 2 or more divisions are supported");
    let power2_floor = 1u64 << floor_log2(size);
    let power2_division = power2_floor >> floor_log2(divisions);
    if power2_division == 0 {
        return power2_floor.saturating_mul(2);
    }
    let round_size_floor = size & !(power2_division - 1);
    if round_size_floor == size {
        size
    } else {
        round_size_floor.saturating_add(power2_division)
    }
}

/// The block size a request of `size` bytes gets (`round_size`): at least
/// 512 bytes, a multiple of 512, or the next power-of-two division when
/// `roundup_power2_divisions` asks for it for this size's interval (and the
/// size exceeds `512 * divisions`).
pub(crate) fn round_size(size: u64, divisions: &RoundupDivisions) -> u64 {
    if size < K_MIN_BLOCK_SIZE {
        return K_MIN_BLOCK_SIZE;
    }
    let div = divisions[roundup_power2_index(size)];
    if div > 1 && size > K_MIN_BLOCK_SIZE.saturating_mul(div) {
        roundup_power2_next_division(size, div)
    } else {
        // Saturating: sizes can come from untrusted events (the model).
        size.div_ceil(K_MIN_BLOCK_SIZE)
            .saturating_mul(K_MIN_BLOCK_SIZE)
    }
}

/// [`round_size`] with the default configuration (no power-of-two rounding).
pub(crate) fn round_size_default(size: u64) -> u64 {
    round_size(size, &NO_ROUNDUP_DIVISIONS)
}

/// The pool a rounded size is served from (`get_pool`): small for `<= 1 MiB`.
pub(crate) fn pool_for_size(rounded_size: u64) -> SegmentPool {
    if rounded_size <= K_SMALL_SIZE {
        SegmentPool::Small
    } else {
        SegmentPool::Large
    }
}

/// The size of the segment `cudaMalloc`ed for a rounded size when no cached
/// block fits (`get_allocation_size`): 2 MiB for small, 20 MiB for requests
/// below 10 MiB, else the size rounded up to 2 MiB.
pub(crate) fn get_allocation_size(rounded_size: u64) -> u64 {
    if rounded_size <= K_SMALL_SIZE {
        K_SMALL_BUFFER
    } else if rounded_size < K_MIN_LARGE_ALLOC {
        K_LARGE_BUFFER
    } else {
        rounded_size
            .div_ceil(K_ROUND_LARGE)
            .saturating_mul(K_ROUND_LARGE)
    }
}

/// Whether a free block of `block_size` bytes handed out for a rounded
/// request of `size` bytes is split, leaving the remainder cached
/// (`should_split`). Small-pool blocks, and every block while
/// `expandable_segments` is on, split when at least 512 bytes remain; other
/// large blocks split only when the request is below `max_split_size` and
/// more than 1 MiB remains.
pub(crate) fn should_split(
    block_size: u64,
    size: u64,
    pool: SegmentPool,
    expandable_segments: bool,
    max_split_size: u64,
) -> bool {
    let remaining = block_size - size;
    if pool == SegmentPool::Small || expandable_segments {
        remaining >= K_MIN_BLOCK_SIZE
    } else {
        size < max_split_size && remaining > K_SMALL_SIZE
    }
}

/// The oversize rules of `get_free_block`, applied to the best-fit candidate:
/// a request below `max_split_size` never takes an oversize block (one
/// `>= max_split_size`), and an oversize request only takes a block less than
/// `max_non_split_rounding_size` (default `kLargeBuffer`, 20 MiB) larger than
/// itself. Without `max_split_size` every candidate is acceptable.
pub(crate) fn oversize_block_acceptable(
    size: u64,
    block_size: u64,
    max_split_size: u64,
    max_non_split_rounding_size: u64,
) -> bool {
    if size < max_split_size && block_size >= max_split_size {
        return false;
    }
    if size >= max_split_size && block_size >= size.saturating_add(max_non_split_rounding_size) {
        return false;
    }
    true
}

/// Page size of an expandable segment (`ExpandableSegment::segment_size_`,
/// chosen in `find_expandable_block`): 2 MiB for the small pool, 20 MiB for
/// the large pool.
pub(crate) fn expandable_page_size(pool: SegmentPool) -> u64 {
    match pool {
        SegmentPool::Small => K_SMALL_BUFFER,
        SegmentPool::Large => K_LARGE_BUFFER,
    }
}

/// Virtual address space reserved for one expandable segment of a device with
/// `total_memory` bytes: 1 1/8 of the device memory in whole pages (the
/// `ExpandableSegment` constructor).
pub(crate) fn expandable_address_space(total_memory: u64, pool: SegmentPool) -> u64 {
    let page = expandable_page_size(pool);
    let want = total_memory.saturating_add(total_memory / 8);
    want.div_ceil(page).saturating_mul(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn round_size_minimum_and_512_multiples() {
        for (size, want) in [
            (0, 512),
            (1, 512),
            (511, 512),
            (512, 512),
            (513, 1024),
            (4000, 4096),
            (MIB + 1, MIB + 512),
        ] {
            assert_eq!(round_size_default(size), want, "round_size({size})");
        }
    }

    #[test]
    fn roundup_power2_example_from_source() {
        // The worked example in the C++ comment: 1200 with 4 divisions -> 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
        assert_eq!(roundup_power2_next_division(1024, 4), 1024);
        assert_eq!(roundup_power2_next_division(1280, 4), 1280);
        assert_eq!(roundup_power2_next_division(1281, 4), 1536);
        // 1 division step of the interval below 2 is "next power of two".
        assert_eq!(roundup_power2_next_division(3 * MIB, 2), 3 * MIB);
        assert_eq!(roundup_power2_next_division(3 * MIB + 1, 2), 4 * MIB);
    }

    #[test]
    fn round_size_with_divisions() {
        let mut div = NO_ROUNDUP_DIVISIONS;
        div.fill(4);
        // 1200 is not above 512 * 4 = 2048, so plain 512 rounding applies.
        assert_eq!(round_size(1200, &div), 1536);
        // 5 MiB + 1 lies in [4, 8) MiB, steps of 1 MiB -> 6 MiB.
        assert_eq!(round_size(5 * MIB + 1, &div), 6 * MIB);
        // divisions of 1 disable the power-of-two rounding.
        div.fill(1);
        assert_eq!(round_size(5 * MIB + 1, &div), 5 * MIB + 512);
    }

    #[test]
    fn roundup_index_intervals() {
        for (size, want) in [
            (1, 0),
            (MIB - 1, 0),
            (MIB, 0),
            (2 * MIB, 1),
            (256 * MIB, 8),
            (511 * MIB, 8),
            (512 * MIB, 9),
            (1 << 40, 15),
        ] {
            assert_eq!(roundup_power2_index(size), want, "index of {size}");
        }
    }

    #[test]
    fn pool_choice() {
        assert_eq!(pool_for_size(round_size_default(MIB)), SegmentPool::Small);
        assert_eq!(
            pool_for_size(round_size_default(MIB + 1)),
            SegmentPool::Large
        );
        assert_eq!(pool_for_size(512), SegmentPool::Small);
    }

    #[test]
    fn allocation_sizes() {
        for (rounded, want) in [
            (512, 2 * MIB),
            (MIB, 2 * MIB),
            (MIB + 512, 20 * MIB),
            (5 * MIB, 20 * MIB),
            (10 * MIB - 512, 20 * MIB),
            (10 * MIB, 10 * MIB),
            (15 * MIB, 16 * MIB),
            (100 * MIB + 1, 102 * MIB),
        ] {
            assert_eq!(get_allocation_size(rounded), want, "for {rounded}");
        }
    }

    #[test]
    fn split_thresholds() {
        use SegmentPool::{Large, Small};
        let unlimited = UNLIMITED_SPLIT_SIZE;
        // (block size, request, pool, expandable, max_split_size, splits)
        let cases = [
            // Small pool: split when >= 512 bytes remain.
            (2 * MIB, 2 * MIB - 512, Small, false, unlimited, true),
            (2 * MIB, 2 * MIB, Small, false, unlimited, false),
            // Large pool: only when more than 1 MiB remains.
            (20 * MIB, 5 * MIB, Large, false, unlimited, true),
            (20 * MIB, 19 * MIB, Large, false, unlimited, false),
            (20 * MIB, 19 * MIB - 512, Large, false, unlimited, true),
            // ...and never for requests at or above max_split_size.
            (100 * MIB, 40 * MIB, Large, false, 40 * MIB, false),
            (100 * MIB, 39 * MIB, Large, false, 40 * MIB, true),
            // Expandable segments split large blocks at 512-byte granularity.
            (20 * MIB, 19 * MIB, Large, true, unlimited, true),
            (100 * MIB, 40 * MIB, Large, true, 40 * MIB, true),
        ];
        for (block, size, pool, expandable, max_split, want) in cases {
            assert_eq!(
                should_split(block, size, pool, expandable, max_split),
                want,
                "should_split({block}, {size}, {pool:?}, {expandable}, {max_split})"
            );
        }
    }

    #[test]
    fn oversize_rules() {
        // (request, block size, max_split_size, acceptable); the
        // max_non_split_rounding_size is the default 20 MiB throughout.
        let cases = [
            (2 * MIB, 1 << 40, UNLIMITED_SPLIT_SIZE, true),
            // A small-ish request may not take an oversize block.
            (30 * MIB, 64 * MIB, 64 * MIB, false),
            // An oversize request may take an oversize block less than 20 MiB larger.
            (64 * MIB, 83 * MIB, 64 * MIB, true),
            (64 * MIB, 84 * MIB, 64 * MIB, false),
        ];
        for (size, block, max_split, want) in cases {
            assert_eq!(
                oversize_block_acceptable(size, block, max_split, K_LARGE_BUFFER),
                want,
                "oversize_block_acceptable({size}, {block}, {max_split})"
            );
        }
    }

    #[test]
    fn expandable_pages() {
        assert_eq!(expandable_page_size(SegmentPool::Small), 2 * MIB);
        assert_eq!(expandable_page_size(SegmentPool::Large), 20 * MIB);
        // 8 GiB device -> 9 GiB of address space, in 20 MiB pages (461 pages).
        assert_eq!(
            expandable_address_space(8 << 30, SegmentPool::Large),
            461 * 20 * MIB
        );
        assert_eq!(
            expandable_address_space(8 << 30, SegmentPool::Small),
            9 << 30
        );
    }
}
