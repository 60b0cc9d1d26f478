//! The block map of one device: blocks by address.
//!
//! Applying an allocator event touches one block and its neighbours: an
//! allocation finds the free block at its address and splits it, a free
//! finds its block and merges it with free neighbours. So blocks live in a
//! slab, linked in address order (`prev`, `next`), with a hash index from
//! address to slot: the block at an address and its neighbours are found
//! in constant time, and a split or a merge changes a few links. (A sorted
//! structure costs a descent per lookup, and applying one event took two
//! or three: that was a third of the live path's time per event.)
//!
//! Questions by order (the block at or below an address that starts no
//! block, the blocks in a range) start from an ordered set of addresses
//! that is brought up to date lazily: blocks added since are found by
//! walking the links from the nearest address the set has, and the set
//! takes the additions and removals that still matter only after
//! [`SYNC_AFTER`] of them (a split made and merged again in between, a
//! temporary tensor's, never touches it). So an ordered question costs at
//! most a descent of the set plus [`SYNC_AFTER`] steps.
//!
//! Memory, per block: a slab entry ([`BlockMap::NODE_BYTES`]), an entry of
//! the hash index (12 bytes in a table at most 7/8 full, plus a control
//! byte) and of the ordered set (8 bytes in B-tree nodes at least half
//! full); slots left by removed blocks are reused, and the slab is rebuilt
//! smaller when under a quarter of it is in use ([`BlockMap::tidy`]).

use std::collections::{BTreeSet, HashMap};
use std::ops::{Bound, RangeBounds};

use super::parts::Block;

/// Additions and removals the ordered set may lag behind by.
const SYNC_AFTER: usize = 1024;

/// No slot.
const NIL: u32 = u32::MAX;

/// The index's hasher: fast on addresses, seeded per process (an address
/// pattern cannot be chosen to collide).
type Hasher = foldhash::fast::RandomState;

#[derive(Debug, Clone, Copy)]
struct Node {
    addr: u64,
    prev: u32,
    next: u32,
    /// Whether `addr` is in the ordered set for this block.
    indexed: bool,
    block: Block,
}

/// Blocks by address (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct BlockMap {
    /// The slab: live blocks and vacant slots.
    nodes: Vec<Node>,
    /// Slots of `nodes` not in use.
    vacant: Vec<u32>,
    /// The slot of each live block, by address.
    slot_of: HashMap<u64, u32, Hasher>,
    /// The lowest and highest block.
    head: u32,
    tail: u32,
    /// The addresses of the blocks as of the last [`Self::sync`], less
    /// none of those removed since (`removed`), without those added since
    /// (`added`).
    ordered: BTreeSet<u64>,
    added: Vec<u64>,
    removed: Vec<u64>,
}

impl Default for BlockMap {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            vacant: Vec::new(),
            slot_of: HashMap::default(),
            head: NIL,
            tail: NIL,
            ordered: BTreeSet::new(),
            added: Vec::new(),
            removed: Vec::new(),
        }
    }
}

/// Where an entry is. Valid until that entry is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos(u32);

impl BlockMap {
    /// Bytes of one slab entry.
    pub(crate) const NODE_BYTES: usize = std::mem::size_of::<Node>();

    /// A map of entries already sorted by address, without duplicates.
    pub(crate) fn from_sorted(entries: impl IntoIterator<Item = (u64, Block)>) -> Self {
        let mut map = Self::default();
        for (addr, block) in entries {
            debug_assert!(map.tail == NIL || map.nodes[map.tail as usize].addr < addr);
            let s = map.nodes.len() as u32;
            map.nodes.push(Node {
                addr,
                prev: map.tail,
                next: NIL,
                indexed: true,
                block,
            });
            match map.tail {
                NIL => map.head = s,
                t => map.nodes[t as usize].next = s,
            }
            map.tail = s;
            map.slot_of.insert(addr, s);
        }
        map.ordered = map.nodes.iter().map(|n| n.addr).collect();
        map
    }

    pub(crate) fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.nodes.capacity() * Self::NODE_BYTES
            + self.vacant.capacity() * size_of::<u32>()
            + self.slot_of.capacity() * (size_of::<(u64, u32)>() + 1)
            // B-tree nodes hold up to 11 keys (and 12 edges when inner).
            + self.ordered.len().div_ceil(5) * (11 * size_of::<u64>() + 12 * size_of::<usize>())
            + (self.added.capacity() + self.removed.capacity()) * size_of::<u64>()
    }

    #[inline]
    fn node(&self, s: u32) -> &Node {
        &self.nodes[s as usize]
    }

    /// The entry at address `k`.
    #[inline]
    pub(crate) fn find(&self, k: u64) -> Option<Pos> {
        self.slot_of.get(&k).map(|&s| Pos(s))
    }

    /// The entry with the greatest address at or below `k`.
    #[inline]
    pub(crate) fn find_le(&self, k: u64) -> Option<Pos> {
        match self.find(k) {
            Some(p) => Some(p),
            None => self.find_le_ordered(k),
        }
    }

    /// `find_le` by the ordered set: its greatest address at or below `k`
    /// that is still a block's (at most `removed.len()` are not), then
    /// forward along the links past blocks added since (at most
    /// `added.len()`).
    fn find_le_ordered(&self, k: u64) -> Option<Pos> {
        let anchor = (self.ordered.range(..=k).rev()).find_map(|a| self.slot_of.get(a).copied());
        let mut cur = match anchor {
            Some(s) => s,
            None if self.head != NIL && self.node(self.head).addr <= k => self.head,
            None => return None,
        };
        loop {
            let next = self.node(cur).next;
            if next == NIL || self.node(next).addr > k {
                return Some(Pos(cur));
            }
            cur = next;
        }
    }

    #[inline]
    pub(crate) fn at(&self, p: Pos) -> (u64, &Block) {
        let n = self.node(p.0);
        (n.addr, &n.block)
    }

    #[inline]
    pub(crate) fn at_mut(&mut self, p: Pos) -> &mut Block {
        &mut self.nodes[p.0 as usize].block
    }

    /// The entry after `p`.
    #[inline]
    pub(crate) fn next(&self, p: Pos) -> Option<Pos> {
        let n = self.node(p.0).next;
        (n != NIL).then_some(Pos(n))
    }

    /// The entry before `p`.
    #[inline]
    pub(crate) fn prev(&self, p: Pos) -> Option<Pos> {
        let n = self.node(p.0).prev;
        (n != NIL).then_some(Pos(n))
    }

    /// A new node for `(k, b)` between slots `prev` and `next` (either
    /// may be NIL); returns its slot.
    fn link(&mut self, prev: u32, next: u32, k: u64, b: Block) -> u32 {
        let node = Node {
            addr: k,
            prev,
            next,
            indexed: false,
            block: b,
        };
        let s = match self.vacant.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        match prev {
            NIL => self.head = s,
            p => self.nodes[p as usize].next = s,
        }
        match next {
            NIL => self.tail = s,
            n => self.nodes[n as usize].prev = s,
        }
        self.slot_of.insert(k, s);
        self.added.push(k);
        s
    }

    /// Insert `(k, b)` right after `p`; the caller guarantees that `k`
    /// lies between `p`'s address and the next one. Returns the new
    /// entry's position (`p` stays valid).
    pub(crate) fn insert_after(&mut self, p: Pos, k: u64, b: Block) -> Pos {
        debug_assert!(self.at(p).0 < k);
        debug_assert!(self.next(p).is_none_or(|n| k < self.at(n).0));
        let next = self.node(p.0).next;
        Pos(self.link(p.0, next, k, b))
    }

    /// Remove the entry at `p`. Other positions stay valid.
    pub(crate) fn remove_at(&mut self, p: Pos) -> (u64, Block) {
        let block = self.node(p.0).block;
        (self.unlink(p), block)
    }

    /// Remove the entry at `p`, returning its address (the block is not
    /// copied out). Other positions stay valid.
    #[inline]
    pub(crate) fn unlink(&mut self, p: Pos) -> u64 {
        let &Node {
            addr,
            prev,
            next,
            indexed,
            ..
        } = self.node(p.0);
        match prev {
            NIL => self.head = next,
            q => self.nodes[q as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            q => self.nodes[q as usize].prev = prev,
        }
        self.slot_of.remove(&addr);
        if indexed {
            self.removed.push(addr);
        }
        self.vacant.push(p.0);
        addr
    }

    pub(crate) fn get(&self, k: &u64) -> Option<&Block> {
        self.find(*k).map(|p| self.at(p).1)
    }

    pub(crate) fn get_mut(&mut self, k: &u64) -> Option<&mut Block> {
        let p = self.find(*k)?;
        Some(self.at_mut(p))
    }

    /// Insert or replace the block at `k`; returns the one replaced.
    pub(crate) fn insert(&mut self, k: u64, b: Block) -> Option<Block> {
        if let Some(p) = self.find(k) {
            return Some(std::mem::replace(self.at_mut(p), b));
        }
        match self.find_le_ordered(k) {
            Some(p) => {
                self.insert_after(p, k, b);
            }
            None => {
                // Below every address.
                self.link(NIL, self.head, k, b);
            }
        }
        None
    }

    /// Remove the block at `k`.
    pub(crate) fn remove(&mut self, k: &u64) -> Option<Block> {
        let p = self.find(*k)?;
        Some(self.remove_at(p).1)
    }

    /// Between events (no position is held): brings the ordered set up to
    /// date once it lags by [`SYNC_AFTER`] changes, and rebuilds the slab
    /// when under a quarter of it is in use. Both cost O(blocks) at most
    /// once per that many changes.
    #[inline]
    pub(crate) fn tidy(&mut self) {
        if self.added.len() + self.removed.len() > SYNC_AFTER {
            self.sync();
        }
        if self.nodes.len() > 4 * SYNC_AFTER && self.len() * 4 < self.nodes.len() {
            self.rebuild();
        }
    }

    /// The slab rebuilt with only the live blocks, in address order.
    #[cold]
    fn rebuild(&mut self) {
        let live: Vec<(u64, Block)> = self.iter().map(|(a, b)| (*a, *b)).collect();
        *self = Self::from_sorted(live);
    }

    /// Applies the changes since the last sync to the ordered set: the
    /// removed addresses leave it, then the added ones still in the map
    /// join it.
    #[cold]
    fn sync(&mut self) {
        for a in self.removed.drain(..) {
            self.ordered.remove(&a);
        }
        for a in self.added.drain(..) {
            if let Some(&s) = self.slot_of.get(&a) {
                let n = &mut self.nodes[s as usize];
                if !n.indexed {
                    n.indexed = true;
                    self.ordered.insert(a);
                }
            }
        }
        if self.added.capacity() > 2 * SYNC_AFTER {
            self.added.shrink_to(SYNC_AFTER);
        }
        if self.removed.capacity() > 2 * SYNC_AFTER {
            self.removed.shrink_to(SYNC_AFTER);
        }
    }

    /// The first and last slots with addresses in `(lo, hi)`, if any.
    fn span(&self, lo: Bound<u64>, hi: Bound<u64>) -> Option<(u32, u32)> {
        let first = match lo {
            Bound::Unbounded => self.head,
            Bound::Included(s) => match self.find_le(s) {
                Some(p) if self.at(p).0 == s => p.0,
                Some(p) => self.node(p.0).next,
                None => self.head,
            },
            Bound::Excluded(s) => match self.find_le(s) {
                Some(p) => self.node(p.0).next,
                None => self.head,
            },
        };
        let last = match hi {
            Bound::Unbounded => self.tail,
            Bound::Included(e) => self.find_le(e).map_or(NIL, |p| p.0),
            Bound::Excluded(0) => NIL,
            Bound::Excluded(e) => self.find_le(e - 1).map_or(NIL, |p| p.0),
        };
        (first != NIL && last != NIL && self.node(first).addr <= self.node(last).addr)
            .then_some((first, last))
    }

    /// Blocks with addresses in `r`, in address order.
    pub(crate) fn range<R: RangeBounds<u64>>(&self, r: R) -> Iter<'_> {
        let (front, back) = self
            .span(r.start_bound().cloned(), r.end_bound().cloned())
            .unwrap_or((NIL, NIL));
        Iter {
            map: self,
            front,
            back,
        }
    }

    /// Calls `f` on each block with an address in `r`, in address order.
    pub(crate) fn update_range<R: RangeBounds<u64>>(
        &mut self,
        r: R,
        mut f: impl FnMut(&mut Block),
    ) {
        let Some((first, last)) = self.span(r.start_bound().cloned(), r.end_bound().cloned())
        else {
            return;
        };
        let mut s = first;
        loop {
            let n = &mut self.nodes[s as usize];
            f(&mut n.block);
            if s == last {
                return;
            }
            s = n.next;
        }
    }

    /// All blocks in address order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        Iter {
            map: self,
            front: self.head,
            back: self.tail,
        }
    }

    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &Block> + '_ {
        self.iter().map(|(_, b)| b)
    }
}

/// Blocks from `front` to `back` (inclusive, along the links), or none
/// when both are NIL.
pub(crate) struct Iter<'a> {
    map: &'a BlockMap,
    front: u32,
    back: u32,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a u64, &'a Block);

    fn next(&mut self) -> Option<Self::Item> {
        if self.front == NIL {
            return None;
        }
        let n = &self.map.nodes[self.front as usize];
        if self.front == self.back {
            (self.front, self.back) = (NIL, NIL);
        } else {
            self.front = n.next;
        }
        Some((&n.addr, &n.block))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.back == NIL {
            return None;
        }
        let n = &self.map.nodes[self.back as usize];
        if self.front == self.back {
            (self.front, self.back) = (NIL, NIL);
        } else {
            self.back = n.prev;
        }
        Some((&n.addr, &n.block))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::model::attrib::Origin;
    use vramscope_wire::event::{BlockState, PoolId};

    fn block(size: u64) -> Block {
        Block {
            size,
            requested: 0,
            stream: 0,
            pool: PoolId(0, 0),
            segment: 0,
            since_ns: 0,
            state: BlockState::Inactive,
            expandable: false,
            origin: Origin::default(),
        }
    }

    fn check(m: &BlockMap, r: &BTreeMap<u64, Block>) {
        assert_eq!(m.len(), r.len());
        let a: Vec<_> = m.iter().map(|(k, b)| (*k, *b)).collect();
        let b: Vec<_> = r.iter().map(|(k, b)| (*k, *b)).collect();
        assert_eq!(a, b);
        let back: Vec<_> = m.iter().rev().map(|(k, _)| *k).collect();
        assert!(back.iter().rev().eq(r.keys()));
        // The links, the index and the ordered set agree.
        let mut prev = NIL;
        let mut s = m.head;
        while s != NIL {
            let n = m.node(s);
            assert_eq!(n.prev, prev);
            assert_eq!(m.slot_of.get(&n.addr), Some(&s));
            assert_eq!(
                n.indexed,
                m.ordered.contains(&n.addr) && !m.removed.contains(&n.addr)
            );
            prev = s;
            s = n.next;
        }
        assert_eq!(m.tail, prev);
    }

    /// At the block bound (`Bounds::blocks`, 262,144 a device) the map
    /// holds at most the 44 MiB the model's documentation says (`Bounds`),
    /// and it gives the memory back once the blocks are gone.
    #[test]
    fn memory_at_the_block_bound_is_as_documented() {
        const MIB: usize = 1 << 20;
        let n = crate::model::config::Bounds::default().blocks as u64;
        assert_eq!(n, 1 << 18);
        let mut m = BlockMap::default();
        // Inserted out of order, then split further by position, as the
        // device does: the slab, the index and the ordered set all grow.
        for i in 0..n / 2 {
            let a = (i * 0x9E37_79B9) % (n / 2);
            m.insert(a * 1024, block(512));
            m.tidy();
        }
        for i in 0..n / 2 {
            let p = m.find(i * 1024).unwrap();
            m.insert_after(p, i * 1024 + 512, block(512));
            m.tidy();
        }
        assert_eq!(m.len() as u64, n);
        m.sync();
        let full = m.memory_bytes();
        assert!(full <= 44 * MIB, "{} MiB", full / MIB);
        assert!(full >= n as usize * BlockMap::NODE_BYTES);
        for i in 0..n - 100 {
            m.remove(&(i * 512));
            m.tidy();
        }
        assert_eq!(m.len(), 100);
        // The slab is rebuilt down to what is in use once it holds over
        // 4 × SYNC_AFTER slots (384 KiB of them).
        assert!(m.memory_bytes() <= MIB, "{} KiB", m.memory_bytes() / 1024);
    }

    proptest! {
        /// The map behaves as a `BTreeMap` under inserts, removals, ranges
        /// and neighbour walks.
        #[test]
        fn same_as_btreemap(ops in proptest::collection::vec((0u8..8, 0u64..400, 0u64..400), 0..600)) {
            let mut m = BlockMap::default();
            let mut r = BTreeMap::new();
            for (op, k, k2) in ops {
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(k, block(k2)), r.insert(k, block(k2))),
                    2 => prop_assert_eq!(m.remove(&k), r.remove(&k)),
                    3 => {
                        let (lo, hi) = (k.min(k2), k.max(k2));
                        let a: Vec<_> = m.range(lo..hi).map(|(k, _)| *k).collect();
                        let b: Vec<_> = r.range(lo..hi).map(|(k, _)| *k).collect();
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = m.range(..=hi).rev().map(|(k, _)| *k).collect();
                        let b: Vec<_> = r.range(..=hi).rev().map(|(k, _)| *k).collect();
                        prop_assert_eq!(a, b);
                    }
                    4 => {
                        let a = m.find_le(k).map(|p| m.at(p).0);
                        let b = r.range(..=k).next_back().map(|(k, _)| *k);
                        prop_assert_eq!(a, b);
                        if let Some(p) = m.find_le(k) {
                            let n = m.next(p).map(|n| m.at(n).0);
                            prop_assert_eq!(n, r.range(m.at(p).0 + 1..).next().map(|(k, _)| *k));
                            let q = m.prev(p).map(|q| m.at(q).0);
                            prop_assert_eq!(q, r.range(..m.at(p).0).next_back().map(|(k, _)| *k));
                        }
                    }
                    5 => {
                        m.update_range(k.min(k2)..=k.max(k2), |b| b.size += 1);
                        for (_, b) in r.range_mut(k.min(k2)..=k.max(k2)) {
                            b.size += 1;
                        }
                    }
                    6 => {
                        // Splits and merges by position, as the device applies them.
                        if let Some(p) = m.find_le(k) {
                            let at = m.at(p).0;
                            let next = m.next(p).map_or(u64::MAX, |n| m.at(n).0);
                            if k2 % 2 == 0 && at + 1 < next {
                                let key = at + 1 + k2 % (next - at - 1).min(7);
                                m.insert_after(p, key, block(k2));
                                r.insert(key, block(k2));
                            } else if let Some(n) = m.next(p) {
                                let (key, _) = m.remove_at(n);
                                r.remove(&key);
                            }
                        }
                    }
                    _ => {
                        if k2 % 4 == 0 {
                            m.sync();
                        }
                        m.tidy();
                    }
                }
                check(&m, &r);
            }
            let rebuilt = BlockMap::from_sorted(r.iter().map(|(k, b)| (*k, *b)));
            check(&rebuilt, &r);
        }
    }
}
